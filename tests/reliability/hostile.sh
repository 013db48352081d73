# Hostile input: weights with NaN or inf, huge weights that overflow, text with
# NUL bytes, files with CR-only line ends, bad rows.  Each case wants its exit
# code and message, and every input file left as it was.
. "$HPC_ROOT/tests/reliability/lib.sh"
MODEL=$HPC_ROOT/models/bert_tiny.model
VOCAB=$HPC_ROOT/data/vocab/bert-base-uncased-vocab.txt
Q=bert.encoder.layer.0.attention.self.query.weight

# poke FILE TENSOR FIRST COUNT OCTAL : overwrite COUNT f32 elements of TENSOR,
# from element FIRST, in the safetensors FILE with the 4 bytes `printf OCTAL`
# gives (hpc aligns every tensor to its element size).
poke() {
    n=$(od -An -t u8 -N8 "$1" | tr -d ' ')
    begin=$(dd if="$1" bs=1 skip=8 count="$n" 2>/dev/null | grep -o "\"$2\":{[^}]*}" |
            sed -n 's/.*"data_offsets":\[\([0-9]*\),.*/\1/p')
    [ -n "$begin" ] || { echo "poke: no tensor $2 in $1" >&2; return 1; }
    i=0
    while [ "$i" -lt "$4" ]; do printf "$5"; i=$((i + 1)); done |
        dd of="$1" bs=4 seek=$(((8 + n + begin) / 4 + $3)) conv=notrunc 2>/dev/null
}

# A small CoLA folder (40 train, 20 dev, 9 test rows) and a one-step
# checkpoint of bert_tiny trained on it: the clean inputs the cases corrupt.
mkdir -p "$WORK/cola"
head -40 "$HPC_ROOT/data/cola/train.tsv" >"$WORK/cola/train.tsv"
head -20 "$HPC_ROOT/data/cola/dev.tsv" >"$WORK/cola/dev.tsv"
head -10 "$HPC_ROOT/data/cola/test.tsv" >"$WORK/cola/test.tsv"
RUN="run $MODEL --device cpu --task cola --vocab $VOCAB --steps 1"
expect "a clean one-step run with a checkpoint" 0 "" $RUN --data "$WORK/cola" --checkpoint-dir "$WORK/ck"
STEP=$WORK/ck/step-00000001

# --init from weights with one NaN in a query weight: refused before training,
# naming the file, the tensor and the element; the folder is not touched.
mkdir -p "$WORK/nan_init"
cp "$STEP/model.safetensors" "$WORK/nan_init/"
poke "$WORK/nan_init/model.safetensors" $Q 37 1 '\000\000\300\177'
snapshot "$WORK/nan_init/model.safetensors"
expect "--init with a NaN weight is refused naming the tensor" 1 \
    "tensor '$Q' holds NaN at element 37 (of 16384)" $RUN --data "$WORK/cola" --init "$WORK/nan_init"
grep -qF "holds NaN or inf in 1 tensor the model uses" "$WORK/.err" &&
    ok "--init with a NaN weight: the one-line summary counts it" ||
    notok "--init with a NaN weight: the one-line summary counts it" "$(tail -1 "$WORK/.err")"
unchanged "--init with a NaN weight leaves the folder intact"

# -inf in a LayerNorm weight: the same.
mkdir -p "$WORK/inf_init"
cp "$STEP/model.safetensors" "$WORK/inf_init/"
poke "$WORK/inf_init/model.safetensors" bert.embeddings.LayerNorm.weight 3 1 '\000\000\200\377'
expect "--init with -inf in a LayerNorm weight is refused" 1 \
    "tensor 'bert.embeddings.LayerNorm.weight' holds -inf at element 3" $RUN --data "$WORK/cola" --init "$WORK/inf_init"

# --resume from a checkpoint whose weights hold a NaN: refused, and the
# checkpoint is not touched.  (A checksum, when the checkpoint has one, may
# catch the changed bytes first; either way the message names the file.)
cp -r "$WORK/ck" "$WORK/ck_nan"
poke "$WORK/ck_nan/step-00000001/model.safetensors" $Q 5 1 '\000\000\300\177'
snapshot "$WORK/ck_nan/step-00000001/model.safetensors" "$WORK/ck_nan/step-00000001/optimizer.safetensors" \
    "$WORK/ck_nan/step-00000001/state.json"
expect "--resume with a NaN weight is refused naming the file" 1 "model.safetensors" \
    run $MODEL --device cpu --task cola --vocab $VOCAB --steps 2 --data "$WORK/cola" --resume "$WORK/ck_nan"
unchanged "--resume with a NaN weight leaves the checkpoint intact"

# Finite but huge classifier weights: the logits overflow, so eval scores NaN
# (never a finite metric from argmax of NaN) and --predict writes nothing.
mkdir -p "$WORK/huge"
cp "$STEP/model.safetensors" "$WORK/huge/"
poke "$WORK/huge/model.safetensors" classifier.weight 0 256 '\377\377\177\177'
expect "--predict from overflowing logits is refused" 7 "test.tsv is NaN or inf, so it has no class; nothing written" \
    $RUN --data "$WORK/cola" --init "$WORK/huge" --predict "$WORK/pred.tsv"
grep -q "eval at step 1 (epoch 0): mcc nan" "$WORK/.err" &&
    ok "overflowing logits: dev mcc is nan, not a number made from class 0" ||
    notok "overflowing logits: dev mcc is nan" "$(grep eval "$WORK/.err")"
[ ! -e "$WORK/pred.tsv" ] && ok "overflowing logits: no predictions file" ||
    notok "overflowing logits: no predictions file" "$WORK/pred.tsv exists"

# A NUL byte in text: removed, the rest kept (hpc tokenize, stdin).
printf 'hello\000 world\n' | "$HPC" tokenize --vocab "$VOCAB" - >"$WORK/.out" 2>"$WORK/.err"
rc=$?
if [ $rc -eq 0 ] && grep -qx "tokens: \[CLS\] hello world \[SEP\]" "$WORK/.out"; then
    ok "tokenize keeps the text after a NUL byte"
else
    notok "tokenize keeps the text after a NUL byte" "exit $rc: $(head -c 300 "$WORK/.out" "$WORK/.err")"
fi

# A NUL byte inside a CoLA row: the row is read (40 rows), not cut or refused.
mkdir -p "$WORK/cola_nul"
cp "$WORK/cola/dev.tsv" "$WORK/cola/test.tsv" "$WORK/cola_nul/"
{ printf 'gj04\t1\t\tOur frie\000nds will buy it .\n'; tail -n +2 "$WORK/cola/train.tsv"; } \
    >"$WORK/cola_nul/train.tsv"
snapshot "$WORK/cola_nul/train.tsv"
expect "a NUL byte inside a GLUE row: the row is read" 0 "" $RUN --data "$WORK/cola_nul"
grep -q "cola train: 40 rows" "$WORK/.err" && ok "a NUL byte inside a GLUE row: all 40 rows" ||
    notok "a NUL byte inside a GLUE row: all 40 rows" "$(grep "cola train" "$WORK/.err")"
unchanged "a NUL byte inside a GLUE row: the file is intact"

# CR-only line ends (old Mac files): split as Python's universal newlines do.
mkdir -p "$WORK/cola_cr"
for f in train dev test; do tr '\n' '\r' <"$WORK/cola/$f.tsv" >"$WORK/cola_cr/$f.tsv"; done
expect "CR-only line ends are line ends" 0 "" $RUN --data "$WORK/cola_cr"
grep -q "cola train: 40 rows" "$WORK/.err" && grep -q "cola dev: 20 rows" "$WORK/.err" &&
    ok "CR-only line ends: 40 train and 20 dev rows" ||
    notok "CR-only line ends: 40 train and 20 dev rows" "$(grep "cola " "$WORK/.err")"

# A bad row names the file and line, and the option that skips it.
mkdir -p "$WORK/cola_bad"
cp "$WORK/cola/dev.tsv" "$WORK/cola/test.tsv" "$WORK/cola_bad/"
{ head -3 "$WORK/cola/train.tsv"; printf 'src\tx\t\tbad label row\n'; tail -n +4 "$WORK/cola/train.tsv"; } \
    >"$WORK/cola_bad/train.tsv"
expect "a bad row names file:line and --skip-bad-rows" 1 "train.tsv:4:" $RUN --data "$WORK/cola_bad"
grep -qF "(run with --skip-bad-rows to skip such rows)" "$WORK/.err" &&
    ok "a bad row: the message names the option in the user's words" ||
    notok "a bad row: the message names the option" "$(tail -1 "$WORK/.err")"
expect "--skip-bad-rows skips it" 0 "" $RUN --data "$WORK/cola_bad" --skip-bad-rows
grep -q "cola train: 40 rows from .*, 1 skipped" "$WORK/.err" && ok "--skip-bad-rows: 40 rows, 1 skipped" ||
    notok "--skip-bad-rows: 40 rows, 1 skipped" "$(grep "cola train" "$WORK/.err")"

# A vocab with CR-only line ends loads as the same vocabulary.
tr '\n' '\r' <"$VOCAB" >"$WORK/vocab_cr.txt"
"$HPC" tokenize --vocab "$WORK/vocab_cr.txt" "the cat sat" >"$WORK/.out" 2>"$WORK/.err"
if grep -qx "ids:    101 1996 4937 2938 102" "$WORK/.out"; then
    ok "a CR-only vocab gives the same ids"
else
    notok "a CR-only vocab gives the same ids" "$(cat "$WORK/.out" "$WORK/.err" | head -c 300)"
fi
finish
