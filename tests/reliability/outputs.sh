# Output onto input: hpc refuses a path that is also one of its inputs.
. "$HPC_ROOT/tests/reliability/lib.sh"
cp "$HPC_ROOT/models/bert_tiny.model" "$WORK/m.model"
snapshot "$WORK/m.model"
expect "check of a missing model names the file" 3 "/nonexistent/x.model" check /nonexistent/x.model
unchanged "model intact after a failed check"
finish
