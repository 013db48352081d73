# Checkpoints under damage and misuse: a changed byte in any file, counters
# out of range, other training settings, two runs on one directory, a
# read-only or impossible directory.  Each case: the exit code, the message
# naming the file or setting, and no file that existed before is changed.
. "$HPC_ROOT/tests/reliability/lib.sh"
cd "$WORK" || exit 1
cat > m.model <<'MODEL'
model micro {
  encoder { vocab = 64  max_positions = 32  hidden = 16  layers = 1  heads = 2  ffn = 32 }
  head classifier { labels = 2 }
  train {
    optimizer = adamw { lr = 1e-3 }
    batch = 8   seq_len = 16   steps = 20
  }
}
MODEL
run="run m.model --device cpu --train-rows 100"
"$HPC" $run --steps 20 --checkpoint-dir ck --checkpoint-every 5 --keep 5 >/dev/null 2>&1 || notok "setup" "the first run failed"
step=ck/step-00000010
[ -f "$step/SHA256SUMS" ] && (cd "$step" && sha256sum --quiet -c SHA256SUMS) && ok "SHA256SUMS is what sha256sum -c reads" \
    || notok "SHA256SUMS is what sha256sum -c reads" "missing or wrong"

# flip one bit of the byte at OFFSET (from the end) of FILE
flip() { python3 -c "import sys; p, o = sys.argv[1], int(sys.argv[2]); b = bytearray(open(p, 'rb').read()); b[o] ^= 0x10; open(p, 'wb').write(b)" "$1" "$2"; }
# rewrite the manifest of a step directory after a deliberate change
reseal() { (cd "$1" && sha256sum model.safetensors optimizer.safetensors state.json > SHA256SUMS); }

for file in model.safetensors optimizer.safetensors state.json; do
    cp -r "$step" saved
    flip "$step/$file" -40
    snapshot "$step/$file" ck/latest
    expect "a flipped byte in $file is refused naming it" 1 "$step/$file is damaged" $run --steps 20 --resume "$step"
    unchanged "the damaged $file and latest are left as they were"
    rm -rf "$step" && mv saved "$step"
done
expect "the repaired step directory resumes" 0 "" $run --steps 20 --resume "$step"

cp -r "$step" saved
rm "$step/SHA256SUMS"
expect "a step directory without SHA256SUMS is refused" 1 "SHA256SUMS is missing" $run --steps 20 --resume "$step"
rm -rf "$step" && mv saved "$step"

# counters out of range, with the manifest rewritten so that the range check is what stops them
cp -r "$step" saved
sed -i 's/"step": 10,/"step": 25,/' "$step/state.json" && reseal "$step"
expect "a step beyond the total is refused" 1 "step is 25, outside [0, total_steps = 20]" $run --steps 20 --resume "$step"
rm -rf "$step" && cp -r saved "$step"
sed -i 's/"applied_steps": 10,/"applied_steps": 11,/' "$step/state.json" && reseal "$step"
expect "more applied steps than steps is refused" 1 "applied_steps is 11, outside [0, step = 10]" $run --steps 20 --resume "$step"
rm -rf "$step" && cp -r saved "$step"
sed -i 's/"scale": [0-9.e+]*,/"scale": -1,/' "$step/state.json" && reseal "$step"
expect "a negative loss scale is refused" 1 "loss_scaler.scale is -1" $run --steps 20 --resume "$step"
rm -rf "$step" && mv saved "$step"

# other settings: refused naming each, or accepted and logged
expect "another lr and batch are refused naming both" 1 "lr 0.001 -> 0.002, batch 8 -> 4" \
    $run --steps 20 --resume "$step" --lr 2e-3 --batch 4
expect "another step count is refused" 1 "steps 20 -> 30" $run --steps 30 --resume "$step"
expect "another task is refused" 1 "task synthetic-contains -> synthetic-sorted" $run --steps 20 --resume "$step" --task synthetic-sorted
expect "more training rows are refused" 1 "train_rows 100 -> 200" run m.model --device cpu --train-rows 200 --steps 20 --resume "$step"
expect "fewer steps than the checkpoint's are refused even when allowed" 1 "at step 10, beyond this run's 8 steps" \
    $run --steps 8 --resume "$step" --allow-changed-settings
expect "--allow-changed-settings continues" 0 "" $run --steps 20 --resume "$step" --lr 2e-3 --log changed.jsonl --allow-changed-settings
if grep -q 'resuming with changed settings (--allow-changed-settings): lr 0.001 -> 0.002' changed.jsonl; then
    ok "the run log records the changed settings"
else
    notok "the run log records the changed settings" "$(head -c 300 changed.jsonl)"
fi

# two runs on one directory: the second is refused before it trains; a killed holder frees it
"$HPC" $run --steps 100000 --checkpoint-dir busy >/dev/null 2>&1 &
holder=$!
i=0; while [ $i -lt 100 ] && ! [ -s busy/.lock ]; do sleep 0.1; i=$((i + 1)); done
expect "a second run on a checkpoint directory in use is refused" 2 "is in use by another hpc run (pid $holder" \
    $run --steps 5 --checkpoint-dir busy
kill -9 $holder; wait $holder 2>/dev/null
expect "the lock of a killed run does not stay" 0 "" $run --steps 5 --checkpoint-dir busy --log busy.jsonl

# directories that cannot be written: a path under a file stops root too; a read-only mount
echo x > afile
expect "a checkpoint directory under a file is refused before training" 3 "afile exists and is not a directory" \
    $run --steps 5 --checkpoint-dir afile/ck
if unshare -rm true 2>/dev/null; then
    mkdir -p ro
    cp -r ck ro/ck
    snapshot ro/ck/latest ro/ck/step-00000020/model.safetensors
    # hpc in a user and mount namespace where $WORK/ro is mounted read-only
    cat > ns.sh <<NS
#!/bin/sh
exec unshare -rm sh -c 'mount --bind "\$0" "\$0" && mount -o remount,bind,ro "\$0" && exec "\$@"' "$WORK/ro" "$HPC" "\$@"
NS
    chmod +x ns.sh
    real=$HPC; HPC="$WORK/ns.sh"
    expect "a read-only checkpoint directory is refused before training" 3 "ro/ck is not writable: Read-only file system" \
        $run --steps 20 --checkpoint-dir ro/ck
    expect "a new checkpoint directory on a read-only disk is refused" 3 "Read-only file system" \
        $run --steps 20 --checkpoint-dir ro/new
    HPC=$real
    unchanged "the read-only checkpoint is intact"
else
    echo "skip    read-only mounts: this machine allows no user namespace (unshare -rm); the path-under-a-file case above stands in"
fi
finish
