#!/bin/sh
# tests/gpu/dp_check.sh — data parallel on the GPU, from the repository root
# with bin/hpc built (docs/distributed.md).
#   sh tests/gpu/dp_check.sh        one GPU: --gpus 1 must be today's single-GPU
#                                   path (the same step records as a plain run)
#   GPUS=2 sh tests/gpu/dp_check.sh also --gpus 2 against one GPU with the same
#                                   global batch, and an injected inf at step 7
# DEV=cpu STEPS=3 runs the first part without a GPU (a smoke test of the script).
set -u
DEV=${DEV:-cuda}; STEPS=${STEPS:-50}; GPUS=${GPUS:-1}
M=models/bert_tiny.model
run() {   # tag, extra options...
  tag=$1; shift
  bin/hpc run $M --device $DEV --fp32 --steps $STEPS --log /tmp/dp_$tag.jsonl "$@" > /tmp/dp_$tag.out 2>&1 ||
    { echo "$tag failed:"; tail -5 /tmp/dp_$tag.out; exit 1; }
}
run plain
run plain2
run one --gpus 1
if [ "$GPUS" -ge 2 ]; then
  run two --gpus 2
  HPC_INJECT_INF_STEP=7 run inf2 --gpus 2
fi
GPUS=$GPUS python3 - <<'PY'
import json, os
def steps(tag):
    return [(d['step'], d['loss'], d['loss_scale'], d['lr'], d['skipped_total'])
            for d in map(json.loads, open('/tmp/dp_%s.jsonl' % tag)) if d.get('event') == 'step']
def loss_diff(a, b): return max(abs(x[1] - y[1]) / max(abs(y[1]), 1e-30) for x, y in zip(a, b))
a, a2, one = steps('plain'), steps('plain2'), steps('one')
print('%d steps; plain vs plain again: %s; plain vs --gpus 1: %s (max rel loss diff %.3g)' %
      (len(a), 'identical' if a == a2 else 'DIFFER', 'identical' if a == one else 'DIFFER', loss_diff(one, a)))
if int(os.environ['GPUS']) >= 2:
    two, inf = steps('two'), steps('inf2')
    print('--gpus 2 vs 1 GPU, same global batch: %d steps, max rel loss diff %.3g, skipped %d' %
          (len(two), loss_diff(two, a), two[-1][4]))
    first = [s[0] for s in inf if s[4] > 0]
    print('--gpus 2 with an inf at step 7: first skip at step %s, %d skipped in all' %
          (first[0] if first else None, inf[-1][4]))
PY
