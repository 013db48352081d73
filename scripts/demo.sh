#!/bin/sh
# The main job: fine-tune on GLUE CoLA (bundled in data/cola) and report the
# dev Matthews correlation.  Where a GPU is usable: BERT-base in fp16 on the
# cuda backend.  Otherwise: bert_tiny on the cpu backend (a few minutes).
# The run's JSONL log and its plot land in runs/.
set -e
cd "$(dirname "$0")/.."
mkdir -p runs
if bin/hpc devices >/dev/null 2>&1; then
    echo "demo: GPU found: BERT-base on CoLA, fp16"
    bin/hpc run models/bert_base.model --task cola --fp16 --device cuda --log runs/cola.jsonl
else
    echo "demo: no usable GPU (see \`bin/hpc devices\`): bert_tiny on CoLA on the cpu backend"
    bin/hpc run models/bert_tiny.model --task cola --device cpu --log runs/cola.jsonl
fi
bin/hpc plot runs/cola.jsonl -o runs/cola.svg
echo "demo: log runs/cola.jsonl, plot runs/cola.svg"
