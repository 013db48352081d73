# Numbers: every number hpc reads as text is parsed strictly (util/num_parse.h).
# Out of range is an error naming the option or the file and the allowed range,
# never saturated, wrapped or rounded to 0 — on the command line (exit 2), in
# model files, artifacts and checkpoint state (exit 1).
. "$HPC_ROOT/tests/reliability/lib.sh"
M="$HPC_ROOT/models/bert_tiny.model"
cp "$M" "$WORK/m.model"
snapshot "$WORK/m.model"

# -- the command line: usage errors, exit 2, naming the option and its range
expect "--steps too large for 64 bits" 2 "run: --steps 99999999999999999999: expected an integer in [1, 1000000000000]" \
    run "$WORK/m.model" --steps 99999999999999999999
expect "--steps negative" 2 "run: --steps -1: expected an integer in [1, 1000000000000]" run "$WORK/m.model" --steps -1
expect "--steps=junk" 2 "run: --steps 12x: expected an integer in [1, 1000000000000]" run "$WORK/m.model" --steps=12x
expect "--train-rows has an upper bound" 2 "run: --train-rows 99999999999: expected an integer in [1, 1000000]" \
    run "$WORK/m.model" --train-rows 99999999999
expect "--lr underflow like 1e-320" 2 "run: --lr 1e-400: too close to zero for a double (the smallest is 2.2e-308); expected a number in (0, 10]" \
    run "$WORK/m.model" --lr=1e-400
expect "--lr overflow" 2 "run: --lr 1e999: expected a number in (0, 10]" run "$WORK/m.model" --lr 1e999
expect "--lr nan" 2 "run: --lr nan: expected a number in (0, 10]" run "$WORK/m.model" --lr nan
expect "--scale-backoff range" 2 "run: --scale-backoff 1: expected a number in (0, 1)" run "$WORK/m.model" --scale-backoff 1
expect "--seed above 2^63-1" 2 "run: --seed 9223372036854775808: expected an integer in [0, 9223372036854775807]" \
    run "$WORK/m.model" --seed 9223372036854775808
# both spellings parse: the run then stops at the missing model file (exit 3), after the options
expect "--lr=3e-5 parses" 3 "/nonexistent.model" run /nonexistent.model --lr=3e-5 --steps=2
expect "--lr 3e-5 parses" 3 "/nonexistent.model" run /nonexistent.model --lr 3e-5 --steps 2
expect "two precisions" 2 "run: --fp16 and --bf16 contradict each other; give one of them" run "$WORK/m.model" --fp16 --bf16
expect "--resume with --init" 2 "run: --resume and --init contradict each other; give one of them" \
    run "$WORK/m.model" --resume "$WORK/a" --init "$WORK/b"
expect "--steps with --epochs" 2 "run: --steps and --epochs contradict each other; give one of them" \
    run "$WORK/m.model" --steps 3 --epochs 2
expect "--keep without --checkpoint-dir" 2 "run: --keep needs --checkpoint-dir" run "$WORK/m.model" --keep 3
expect "--loss-scale none with --scale-init" 2 "run: --loss-scale none and --scale-init contradict each other" \
    run "$WORK/m.model" --loss-scale none --scale-init 1024
expect "--train-rows with a GLUE task" 2 "run: --train-rows sets the size of a synthetic task; task cola reads its rows from its files" \
    run "$WORK/m.model" --task cola --train-rows 100
expect "unknown option: did you mean" 2 "run: unknown option --stpes; did you mean --steps?" run "$WORK/m.model" --stpes 3
expect "one-dash long option" 2 "run: unknown option -s (in -steps); did you mean --steps?" run "$WORK/m.model" -steps 3
expect "flag given a value" 2 "run: --fp16 takes no value" run "$WORK/m.model" --fp16=yes
expect "value forgotten before an option" 2 "run: --log needs a value before --fp16" run "$WORK/m.model" --log --fp16
expect "--device choices" 2 "run: --device gpus: expected auto, cpu or cuda" run "$WORK/m.model" --device gpus
export HPC_INJECT_INF_STEP=3x
expect "test hook strictly parsed" 2 "run: HPC_INJECT_INF_STEP=3x: expected an integer in [1, 9223372036854775807]" \
    run "$WORK/m.model" --device cpu --steps 1 --seq-len 8 --train-rows 16
unset HPC_INJECT_INF_STEP
expect "compile: two precisions" 2 "compile: --fp32 and --fp16 contradict each other" compile "$WORK/m.model" --fp32 --fp16
expect "compile: -o with --no-artifact" 2 "compile: -o/--output and --no-artifact contradict each other" \
    compile "$WORK/m.model" -o "$WORK/x.hpc" --no-artifact
expect "tokenize: --max-len range" 2 "tokenize: --max-len 1: expected an integer in [2, 1048576]" \
    tokenize --vocab "$HPC_ROOT/data/vocab/bert-base-uncased-vocab.txt" --max-len 1 hi
expect "import: --labels too large" 2 "import: --labels 99999999999999999999: expected an integer in [1, 1048576]" \
    import "$WORK" --labels 99999999999999999999
expect "check: unknown option" 2 "check: unknown option --quite; did you mean --quiet?" check --quite "$WORK/m.model"
expect "plot: -o required" 2 "plot: -o/--output FILE.svg is required" plot "$WORK/log.jsonl"
unchanged "model intact after the usage errors"

# -- model files: located errors, exit 1; 1e-400 is refused like 1e-320, never read as 0
sed 's/batch = 32/batch = 32 clip_grad_norm = 1e-400/' "$M" > "$WORK/tiny_eps.model"
line=$(grep -n 'clip_grad_norm' "$WORK/tiny_eps.model" | cut -d: -f1)
expect "model: 1e-400 underflows" 1 "tiny_eps.model:$line:" check "$WORK/tiny_eps.model"
expect "model: 1e-400 message" 1 "error: number 1e-400 is out of range (nonzero magnitudes go from 2.2e-308 to 1.8e308)" \
    check "$WORK/tiny_eps.model"
sed 's/batch = 32/batch = 32 clip_grad_norm = 1e-320/' "$M" > "$WORK/tiny_sub.model"
expect "model: 1e-320 (subnormal) refused alike" 1 "error: number 1e-320 is out of range" check "$WORK/tiny_sub.model"
sed 's/batch = 32/batch = 99999999999999999999/' "$M" > "$WORK/tiny_batch.model"
expect "model: integer too large" 1 "error: integer 99999999999999999999 is too large (the largest is 9223372036854775807)" \
    check "$WORK/tiny_batch.model"

# -- artifacts: a bad number or policy in the header is a bad file, exit 1
if "$HPC" compile "$WORK/m.model" -o "$WORK/m.hpc" >/dev/null 2>&1; then
    sed 's/^policy fp32$/policy fp99/' "$WORK/m.hpc" > "$WORK/policy.hpc"
    expect "artifact: unknown policy" 1 "unknown precision policy 'fp99' (expected default, fp32, fp16 or bf16)" \
        run "$WORK/policy.hpc" --device cpu --steps 1
    sed '1s/.*/HPCART 99999999999999999999/' "$WORK/m.hpc" > "$WORK/version.hpc"
    expect "artifact: version too large for 64 bits" 1 "not an hpc artifact (no HPCART header with a format version" \
        run "$WORK/version.hpc" --device cpu --steps 1
    sed 's/^@@ model [0-9]*$/@@ model -5/' "$WORK/m.hpc" > "$WORK/bytes.hpc"
    expect "artifact: negative section size" 1 "expected a section line '@@ KIND BYTES'" run "$WORK/bytes.hpc" --device cpu --steps 1
    sed 's/^@@ model \([0-9]*\)$/@@ model \1 /' "$WORK/m.hpc" > "$WORK/space.hpc"
    expect "artifact: junk after a section size" 1 "expected a section line '@@ KIND BYTES'" run "$WORK/space.hpc" --device cpu --steps 1
else
    notok "artifact cases" "hpc compile failed"
fi

# -- checkpoint state: a seed that is not a 64-bit integer is refused, not read as 2^64-1 or 42
ck="$WORK/ck"
if "$HPC" run "$WORK/m.model" --device cpu --steps 2 --seq-len 8 --train-rows 16 --checkpoint-dir "$ck" >/dev/null 2>&1; then
    step=$(cat "$ck/latest")
    sed '0,/"seed": "42"/s//"seed": "-1"/' "$ck/$step/state.json" > "$WORK/state.json" && cp "$WORK/state.json" "$ck/$step/state.json"
    # the edit must reach the number parser, not stop at the checksum: record the new sum
    (cd "$ck/$step" && sha256sum $(awk '{print $2}' SHA256SUMS | tr -d '*') > SHA256SUMS.new && mv SHA256SUMS.new SHA256SUMS)
    expect "checkpoint: negative seed" 1 "state.json: seed \"-1\" is not an integer in [0, 18446744073709551615]" \
        run "$WORK/m.model" --device cpu --steps 2 --seq-len 8 --train-rows 16 --resume "$ck/$step"
else
    notok "checkpoint case" "the training run that makes the checkpoint failed"
fi
unchanged "model intact at the end"
finish
