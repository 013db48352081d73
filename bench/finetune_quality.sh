#!/bin/sh
# bench/finetune_quality.sh — hpc fp16 against PyTorch AMP on a real
# fine-tune: MiniLM-L6 (pretrained) on GLUE CoLA, from the same starting
# weights, N seeds, and one step's error against fp64.  Needs a GPU,
# python3 with torch and transformers, and what was built on the build
# machine (this machine needs no flex, bison or network):
#   bin/hpc, build/bench/grad_error      (make bin/hpc bench-quality-bins)
#   build/quality/minilm_f16/            (python3 bench/make_f16_weights.py)
#
# What it does:
#   1. N starting points (bench/finetune_quality.py seeds): the fp16 MiniLM
#      weights widened to f32 plus one classifier per seed, as a Hugging
#      Face folder that both sides load;
#   2. per seed, `hpc run --fp16 --init seed-S --seed S` for each precision
#      plan in PLANS (HPC_KEEP_F32: "default" is hpc's fp16 now, "none" the
#      all-16-bit plan before it; "fp32" runs `hpc run --fp32` instead; a
#      plan ending in "+unfused", such as "default+unfused", also sets
#      HPC_ATTENTION=unfused: the attention as the unfused chain, as fp32
#      runs it, to tell the fused kernels' part in a difference; one ending
#      in "+pack", such as "default+pack", trains on packed batches, `hpc
#      run --pack`: docs/packing.md), one run at a time, then PyTorch
#      (torch-finetune) in each variant of TORCH_VARIANTS, JOBS runs at a
#      time on the one GPU (each its own process and seed: the MCCs do not
#      depend on JOBS, only the timing does, so the table shows PyTorch's
#      time only from JOBS=1 runs and marks the others);
#   3. grad_error (hpc on the GPU and its cpu emulation) and torch-grad
#      (AMP and fp32) on the same BATCHES batches of 32 CoLA rows, each
#      against fp64 with dropout off;
#   4. (if build/bench/bench_hpc is there: make build/bench/bench_hpc) the
#      BERT-base fp16 step time of each plan at 32x128 and 256x128;
#   5. the markdown table (finetune_quality.py table) and, where both
#      sides ran here, the runs step by step (finetune_quality.py curves:
#      per epoch train loss, gradient norm, clipped share; dev loss; the
#      lr of every step compared) to stdout and to
#      build/quality/out/finetune_quality.md, the raw JSON lines (and each
#      run's log) in build/quality/out/, which accumulates over calls; both
#      files are also copied to $OUT when it is set (the device machine's
#      folder that comes back).  Results of calls on different machines
#      merge with: cat A.jsonl B.jsonl > all.jsonl;
#      python3 bench/finetune_quality.py table all.jsonl
#
# Settings (environment): SEEDS (8), FIRST_SEED (0: run seeds FIRST_SEED ..
# SEEDS-1 only, e.g. to add seeds to an earlier call's lines), JOBS (1:
# PyTorch runs at once), PLANS
# ("default embeddings,residual,norm none"; add fp32 for hpc's f32 run),
# TORCH_VARIANTS ("amp": PyTorch AMP as the HF Trainer runs it; add the
# controlled variants to tell what hpc's wider spread over seeds comes
# from: amp-hpc-order, AMP on hpc's batch order for the seed; fp32, plain
# f32 without loss scaling; fp32-hpc-order, both; each is a row of the
# table, set against amp, and a PyTorch run per seed),
# PARTS ("hpc torch grad speed": run a subset, e.g. PARTS=torch, to split
# the work over several calls; the JSON lines accumulate in
# build/quality/out: remove it to start over), BATCHES (4),
# LOSS_SCALE (65536, GradScaler's first scale, for the one-step errors),
# PYTHON (python3), OUT (optional: where to copy the results).
# Time on one H200: hpc ~3-5 s per run (plus a one-time NVRTC compile per
# plan), PyTorch ~16-34 s per run alone (JOBS=4 not measured yet: its loop
# is bound by Python and kernel launches, so 4 at once should take well under
# 4 times one), the gradient part ~1-2 min (the fp64 reference runs on
# the host), the step times ~1 min: about 8-10 minutes for the defaults;
# split with PARTS to stay under 10 minutes a call.
set -u
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-8}
FIRST_SEED=${FIRST_SEED:-0}
JOBS=${JOBS:-1}
PLANS=${PLANS:-default embeddings,residual,norm none}
TORCH_VARIANTS=${TORCH_VARIANTS:-amp}
PARTS=${PARTS:-hpc torch grad speed}
BATCHES=${BATCHES:-4}
LOSS_SCALE=${LOSS_SCALE:-65536}
PYTHON=${PYTHON:-python3}
COPY_TO=${OUT:-}
OUT=build/quality/out
F16=build/quality/minilm_f16
WORK=build/quality/work
RAW=$OUT/finetune_quality.jsonl
mkdir -p "$OUT" "$WORK"
case "$SEEDS$JOBS$FIRST_SEED" in *[!0-9]*) echo "finetune_quality: SEEDS, FIRST_SEED and JOBS must be numbers" >&2; exit 2;; esac
[ "$JOBS" -ge 1 ] || { echo "finetune_quality: JOBS must be at least 1" >&2; exit 2; }
# torch-finetune's flags for a TORCH_VARIANTS word
torch_flags() {
    case $1 in
        amp) ;;
        amp-hpc-order) echo "--order hpc";;
        fp32) echo "--precision fp32";;
        fp32-hpc-order) echo "--precision fp32 --order hpc";;
        *) return 1;;
    esac
}
for v in $TORCH_VARIANTS; do
    torch_flags "$v" > /dev/null ||
        { echo "finetune_quality: TORCH_VARIANTS: unknown $v (amp, amp-hpc-order, fp32, fp32-hpc-order)" >&2; exit 2; }
done
has() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }
NEEDS="bin/hpc $F16/model.safetensors data/cola/train.tsv"
has grad && NEEDS="$NEEDS build/bench/grad_error"   # only the gradient part runs it
for f in $NEEDS; do
    [ -e "$f" ] || { echo "finetune_quality: missing $f (build it on the build machine: make bin/hpc bench-quality-bins; python3 bench/make_f16_weights.py)" >&2; exit 1; }
done
# the raw lines so far to $OUT after every run, so a call cut off by its
# time limit still brings back what it finished
save() { if [ -n "$COPY_TO" ] && [ "$COPY_TO" != "$OUT" ] && [ -e "$RAW" ]; then mkdir -p "$COPY_TO" && cp "$RAW" "$COPY_TO/"; fi; }

"$PYTHON" bench/finetune_quality.py seeds "$F16" "$WORK" "$SEEDS" || exit 1
bin/hpc import "$WORK/seed-0" -o "$WORK/minilm.model" >&2 || exit 1
# the recipe of finetune_quality.py; the rest (AdamW betas/eps/decay, linear
# warmup 0.1, clipping 1.0, dynamic loss scale from 65536) is the imported
# model's train block
RECIPE="--task cola --device cuda --lr 5e-5 --epochs 3 --batch 32"

# "eval" events of a run log: the last one's value is the dev MCC after the
# last epoch; the summary has the wall time and the skipped steps.
hpc_result() {   # plan seed log
    "$PYTHON" - "$1" "$2" "$3" <<'EOF'
import json, sys
plan, seed, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
impl = "hpc-fp32" if plan == "fp32" else "hpc-fp16 (%s)" % plan
ev = [json.loads(l) for l in open(path) if l.strip()]
evals = [e for e in ev if e.get("event") == "eval"]
summ = [e for e in ev if e.get("event") == "summary"]
steps = [e for e in ev if e.get("event") == "step"]
if not evals:
    sys.exit("no eval event in " + path)
s = summ[-1] if summ else {}
print(json.dumps({"kind": "finetune", "impl": impl, "seed": seed,
                  "mcc": evals[-1]["value"], "dev_loss": evals[-1].get("loss"), "skipped": s.get("skipped_total", steps[-1].get("skipped_total", 0) if steps else 0),
                  "steps": s.get("steps"), "train_s": s.get("wall_s")}))
EOF
}

# The environment of PLAN's hpc runs: HPC_KEEP_F32 (and HPC_ATTENTION for a
# "+unfused" plan); nothing for fp32.
plan_env() {
    case $1 in
        fp32) ;;
        *+unfused) echo "HPC_KEEP_F32=${1%+unfused} HPC_ATTENTION=unfused";;
        *+pack) echo "HPC_KEEP_F32=${1%+pack}";;
        *) echo "HPC_KEEP_F32=$1";;
    esac
}

# The extra `hpc run` flag of PLAN: --pack for a "+pack" plan.
plan_flags() {
    case $1 in *+pack) echo "--pack";; esac
}

if has hpc; then
    for plan in $PLANS; do
        s=$FIRST_SEED
        while [ "$s" -lt "$SEEDS" ]; do
            log=$OUT/hpc-$plan-seed$s.jsonl
            rm -f "$log"   # a log from an earlier call would be appended to
            if [ "$plan" = fp32 ]; then prec=--fp32; else prec=--fp16; fi
            echo "finetune_quality: hpc $prec (plan $plan) seed $s" >&2
            if env $(plan_env "$plan") bin/hpc run "$WORK/minilm.model" $RECIPE $prec $(plan_flags "$plan") \
                   --init "$WORK/seed-$s" --seed "$s" --log "$log" > "$OUT/hpc-$plan-seed$s.out" 2>&1; then
                hpc_result "$plan" "$s" "$log" | tee -a "$RAW"
                save
            else
                echo "finetune_quality: hpc run failed, see $OUT/hpc-$plan-seed$s.out" >&2
                tail -5 "$OUT/hpc-$plan-seed$s.out" >&2
            fi
            s=$((s + 1))
        done
    done
fi

if has torch; then
    # waves of JOBS processes over (seed, variant), seed by seed; each writes
    # its own line, appended in that order once the wave is done (the same
    # file whatever JOBS is).  amp keeps the file names it always had
    # (torch-seedS.json, torch-steps-seedS.jsonl, which `curves` reads); the
    # other variants' files carry their name: torch-fp32-seedS.json, ...
    tag() { [ "$1" = amp ] || echo "-$1"; }
    collect() {   # the lines of the wave's runs ("seed:variant" words)
        for job in "$@"; do
            k=${job%%:*}
            out=$OUT/torch$(tag "${job#*:}")-seed$k
            if grep -q '^{' "$out.json" 2>/dev/null; then
                grep '^{' "$out.json" | tee -a "$RAW"
            else
                echo "finetune_quality: PyTorch ${job#*:} seed $k failed, see $out.err" >&2
                tail -5 "$out.err" >&2
            fi
        done
        save
    }
    wave= n=0
    s=$FIRST_SEED
    while [ "$s" -lt "$SEEDS" ]; do
        for v in $TORCH_VARIANTS; do
            echo "finetune_quality: PyTorch $v seed $s ($JOBS at a time)" >&2
            "$PYTHON" bench/finetune_quality.py torch-finetune "$WORK/seed-$s" "$s" data/cola "$JOBS" \
                "$OUT/torch-steps$(tag "$v")-seed$s.jsonl" $(torch_flags "$v") \
                > "$OUT/torch$(tag "$v")-seed$s.json" 2> "$OUT/torch$(tag "$v")-seed$s.err" &
            wave="$wave $s:$v" n=$((n + 1))
            if [ "$n" -ge "$JOBS" ]; then
                wait
                collect $wave
                wave= n=0
            fi
        done
        s=$((s + 1))
    done
    if [ "$n" -gt 0 ]; then
        wait
        collect $wave
    fi
fi

if has grad; then
    echo "finetune_quality: one step against fp64 ($BATCHES batches of 32)" >&2
    KEEPS=""
    # The keep lists only; grad_error measures the trainer's graph (the fused
    # attention under fp16) and, in the extra cuda line, the unfused chain.
    for plan in $PLANS; do
        case $plan in fp32|*+unfused|*+pack) ;; *) KEEPS="$KEEPS --keep $plan";; esac
    done
    [ -n "$KEEPS" ] || KEEPS="--keep default"
    build/bench/grad_error --model "$WORK/minilm.model" --init "$WORK/seed-0" --rows 32 --batches "$BATCHES" \
        --loss-scale "$LOSS_SCALE" --device cuda $KEEPS --dump-batch "$WORK/batches.jsonl" --json "$RAW" >&2
    build/bench/grad_error --model "$WORK/minilm.model" --init "$WORK/seed-0" --rows 32 --batches "$BATCHES" \
        --loss-scale "$LOSS_SCALE" --device cuda --keep default --attention unfused --json "$RAW" >&2
    build/bench/grad_error --model "$WORK/minilm.model" --init "$WORK/seed-0" --rows 32 --batches "$BATCHES" \
        --loss-scale "$LOSS_SCALE" --device cpu $KEEPS --json "$RAW" >&2
    build/bench/grad_error --model "$WORK/minilm.model" --init "$WORK/seed-0" --rows 32 --batches "$BATCHES" \
        --policy fp32 --keep none --device cuda --json "$RAW" >&2
    "$PYTHON" bench/finetune_quality.py torch-grad "$WORK/seed-0" "$WORK/batches.jsonl" "$LOSS_SCALE" | tee -a "$RAW"
fi

if has speed && [ -x build/bench/bench_hpc ]; then
    for plan in $PLANS; do
        case $plan in fp32|*+pack) continue;; esac   # bench_hpc times padded steps
        echo "finetune_quality: BERT-base fp16 step time, plan $plan" >&2
        env $(plan_env "$plan") build/bench/bench_hpc --shapes 32x128,256x128 --policies fp16 --warmup 5 --iters 20 |
            sed "s/^{/{\"kind\": \"speed\", \"plan\": \"$plan\", /" | tee -a "$RAW"
    done
fi

"$PYTHON" bench/finetune_quality.py table "$RAW" | tee "$OUT/finetune_quality.md"
# the runs step by step (hpc's --log files beside PyTorch's step logs), when
# both sides have run in build/quality/out; the logs themselves go to $OUT
# as one archive
CURVES=
if ls "$OUT"/torch-steps-seed*.jsonl > /dev/null 2>&1 && ls "$OUT"/hpc-*-seed*.jsonl > /dev/null 2>&1; then
    echo >> "$OUT/finetune_quality.md"
    "$PYTHON" bench/finetune_quality.py curves "$OUT" $PLANS | tee -a "$OUT/finetune_quality.md"
    (cd "$OUT" && tar czf steplogs.tar.gz hpc-*-seed*.jsonl torch-steps*-seed*.jsonl)
    CURVES="$OUT/steplogs.tar.gz"
fi
if [ -n "$COPY_TO" ] && [ "$COPY_TO" != "$OUT" ]; then
    mkdir -p "$COPY_TO" && cp "$RAW" "$OUT/finetune_quality.md" $CURVES "$COPY_TO/"
fi
