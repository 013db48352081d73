# Outputs: hpc refuses a path that is also one of its inputs, finds unwritable
# places before it trains, replaces files atomically (a full disk keeps the old
# file), appends the run log on a resume and ends non-zero when the log's disk
# is full, with the log ending in a complete line.
. "$HPC_ROOT/tests/reliability/lib.sh"
cd "$WORK" || exit 1
cp "$HPC_ROOT/models/bert_tiny.model" "$WORK/m.model"
snapshot "$WORK/m.model"
expect "check of a missing model names the file" 3 "/nonexistent/x.model" check /nonexistent/x.model
unchanged "model intact after a failed check"

cat > t.model <<'MODEL'
model micro {
  encoder { vocab = 64  max_positions = 32  hidden = 16  layers = 1  heads = 2  ffn = 32 }
  head classifier { labels = 2 }
  train {
    optimizer = adamw { lr = 1e-3 }
    batch = 8   seq_len = 16   steps = 12
  }
}
MODEL
run="run t.model --device cpu --train-rows 100"
"$HPC" $run --log run.jsonl --checkpoint-dir ck >/dev/null 2>&1 || notok "setup" "the first run failed"
ln -s t.model link.model
snapshot t.model run.jsonl

# output onto input (the same file by any name)
expect "compile -o onto its model is refused" 2 "-o t.model: that is the model file" compile t.model -o t.model
expect "compile -o onto a link to its model is refused" 2 "that is the model file" compile t.model -o link.model
expect "compile --dot onto its model is refused" 2 "--dot t.model: that is the model file" compile t.model --dot t.model
expect "plot -o onto its log is refused" 2 "-o run.jsonl: that is the run log being drawn" plot run.jsonl -o run.jsonl
expect "run --log onto the model is refused" 2 "--log t.model: that is the model file" $run --log t.model
unchanged "the model and the log are intact"
"$HPC" export ck --hf hf >/dev/null 2>&1 || notok "export for import" "hpc export failed"
snapshot hf/config.json hf/model.safetensors
expect "import -o onto its config.json is refused" 2 "that is the config.json being imported" import hf -o hf/config.json
expect "import -o onto its weights is refused" 2 "that is the weights being imported" import hf -o hf/model.safetensors
unchanged "the imported folder is intact"
snapshot ck/latest ck/step-00000012/model.safetensors
expect "export --hf into the checkpoint's step folder is refused" 2 "--hf ck/step-00000012: that is the checkpoint's step folder" \
    export ck --hf ck/step-00000012
expect "export --hf into the checkpoint folder is refused" 2 "--hf ck: that is the checkpoint folder" export ck --hf ck
expect "--log onto the state of the checkpoint being resumed is refused" 2 "that is a file of the checkpoint being resumed" \
    run --resume ck --device cpu --train-rows 100 --log ck/step-00000012/state.json
expect "--log onto the weights of an --init checkpoint is refused" 2 "that is a file of the --init checkpoint" \
    $run --init ck --log ck/step-00000012/model.safetensors
unchanged "the checkpoint is intact"
mkdir -p cola && cp "$HPC_ROOT/data/cola/"*.tsv cola/
glue="run m.model --device cpu --task cola --data cola --vocab $HPC_ROOT/data/vocab/bert-base-uncased-vocab.txt --steps 1 --seq-len 8"
snapshot cola/train.tsv cola/test.tsv
expect "--predict onto the training file is refused" 2 "--predict cola/train.tsv: that is a data file of the task" $glue --predict cola/train.tsv
expect "--predict onto the test file is refused" 2 "that is a data file of the task" $glue --predict cola/test.tsv
expect "--predict onto the --log file is refused" 2 "that is the --log file" $glue --predict p.jsonl --log p.jsonl
expect "--checkpoint-dir into the task's data folder is refused" 2 "--checkpoint-dir cola/: that is the task's data folder" \
    $glue --checkpoint-dir cola/
if [ -e cola/latest ] || [ -e cola/.lock ]; then
    notok "nothing written into the data folder" "$(ls -A cola)"
else
    ok "nothing written into the data folder"
fi
unchanged "the task's files are intact"

# places that cannot be written, found before training (a run that trained
# and then failed prints "stopped after N steps")
echo x > afile
expect "compile -o onto a folder says so" 3 "-o $WORK: that is a folder; give a file name" compile t.model -o "$WORK"
expect "--predict under a file is refused before training" 3 "afile is a file, not a folder" $glue --predict afile/p.tsv
expect "--predict into a missing folder is refused before training" 3 "the folder nowhere does not exist" $glue --predict nowhere/p.tsv
expect "--log under a file is refused" 3 "--log afile/run.jsonl: cannot open the run log" $run --log afile/run.jsonl
if grep -q "^done:\|^stopped after" "$WORK/.err"; then notok "refused before training" "it trained first"; else ok "refused before training"; fi

# the run log on a resume: appended, never truncated
"$HPC" $run --steps 12 --checkpoint-dir ck2 --log resumed.jsonl --checkpoint-every 4 >/dev/null 2>&1
cp resumed.jsonl resumed_before.jsonl
printf '{"event":"step","st' >> resumed.jsonl      # a run killed mid-line
expect "a resume with the same --log works" 0 "" $run --steps 12 --resume ck2/step-00000008 --log resumed.jsonl
n=$(wc -c < resumed_before.jsonl)
if [ "$(head -c "$n" resumed.jsonl | sha256sum)" = "$(sha256sum < resumed_before.jsonl)" ] && grep -q '"appended":true' resumed.jsonl; then
    ok "the resumed run appended to the log"
else
    notok "the resumed run appended to the log" "the earlier lines changed"
fi
expect "the appended log plots (the half line was cut off)" 0 "wrote" plot resumed.jsonl -o resumed.svg

# a full disk
expect "--log onto /dev/full fails at once" 3 "--log /dev/full: writing the run log failed: No space left on device" $run --log /dev/full
if unshare -rm true 2>/dev/null; then
    mkdir -p full
    cat > ns.sh <<NS
#!/bin/sh
# hpc with a 64 KiB tmpfs on $WORK/full, nearly filled: FILL KiB taken first
exec unshare -rm sh -c 'mount -t tmpfs -o size=64k none "\$0" && { [ -z "\$FILL" ] || dd if=/dev/zero of="\$0/fill" bs=1k count="\$FILL" 2>/dev/null; } && { [ -z "\$OLD" ] || cp "\$OLD" "\$0/"; } && "\$@"; rc=\$?; cp "\$0"/*.jsonl "\$0"/*.svg "$WORK/" 2>/dev/null; exit \$rc' "$WORK/full" "$HPC" "\$@"
NS
    chmod +x ns.sh
    real=$HPC; HPC="$WORK/ns.sh"
    FILL=60 expect "--log on a disk that fills up ends with exit 3" 3 "--log full/log.jsonl: writing the run log failed: No space left on device" \
        $run --steps 60 --log full/log.jsonl
    if [ -f log.jsonl ] && [ "$(tail -c 1 log.jsonl | od -An -c | tr -d ' ')" = '\n' ]; then
        ok "the full-disk log ends in a complete line"
    else
        notok "the full-disk log ends in a complete line" "$(tail -c 100 log.jsonl 2>/dev/null)"
    fi
    HPC=$real
    expect "the full-disk log still plots" 0 "wrote" plot log.jsonl -o full_log.svg
    "$HPC" plot run.jsonl -o old.svg >/dev/null 2>&1
    snapshot old.svg
    HPC="$WORK/ns.sh"
    OLD=$WORK/old.svg FILL=50 expect "plot onto a full disk fails" 3 "the previous full/old.svg is unchanged" plot run.jsonl -o full/old.svg
    HPC=$real
    unchanged "the old picture survives a full disk"
else
    echo "skip    full tmpfs: this machine allows no user namespace (unshare -rm); /dev/full above stands in"
fi
finish
