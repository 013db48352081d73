#!/usr/bin/env python3
"""Writes runtime/data/tokenizer_unicode.inc: the code points where Hugging Face's
BERT tokenizer classifies a character differently from utf8proc.

hpc's tokenizer takes Unicode categories from utf8proc (Unicode 15 in
utf8proc 2.8).  HF's Rust tokenizers take punctuation, control and
non-spacing-mark categories from an older Unicode table, so about a thousand
code points that were assigned or re-categorised since then behave
differently: HF keeps U+061D (Po since Unicode 14) inside a word, strips
U+1734 (Mn before Unicode 14), and so on.  To give HF's ids for every code
point, tokenizer.c consults this table before utf8proc.

Each code point's HF class is measured, not assumed, by tokenizing "x" + c +
"y" with the cased and uncased BertTokenizer and seeing whether c was dropped
(control), turned into a space, split off (punctuation or CJK), stripped by
the uncased normaliser only (non-spacing mark), or kept inside the word.

Run from the repository root, in the same virtual environment as
gen_tokenizer_expected.py (see tests/data/tokenizer/README.md):

    /tmp/hfvenv/bin/python scripts/gen_tokenizer_unicode.py

It loads libutf8proc.so.2 with ctypes, so it must run against the same
utf8proc version that hpc links (the table records the version and
tests/test_tokenizer.c checks it).
"""
import ctypes
import sys

import tokenizers
import transformers
from transformers import BertTokenizer

OTHER, CONTROL, SPACE, SPLIT, MARK = range(5)
NAMES = ["TOKCLASS_OTHER", "TOKCLASS_CONTROL", "TOKCLASS_SPACE", "TOKCLASS_SPLIT", "TOKCLASS_MARK"]

# utf8proc_category_t values (utf8proc.h)
CN, MN, PC, PO, ZS, ZP, CC, CF, CS, CO = 0, 6, 12, 18, 23, 25, 26, 27, 28, 29

LIB = ctypes.CDLL("libutf8proc.so.2")
LIB.utf8proc_category.restype = ctypes.c_int
LIB.utf8proc_category.argtypes = [ctypes.c_int32]
LIB.utf8proc_version.restype = ctypes.c_char_p
LIB.utf8proc_decompose_char.restype = ctypes.c_ssize_t
LIB.utf8proc_decompose_char.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.c_ssize_t,
                                        ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
UTF8PROC_DECOMPOSE = 1 << 4


def is_cjk(c):
    return (0x4E00 <= c <= 0x9FFF or 0x3400 <= c <= 0x4DBF or 0x20000 <= c <= 0x2A6DF or
            0x2A700 <= c <= 0x2B81F or 0x2B920 <= c <= 0x2CEAF or 0xF900 <= c <= 0xFAFF or
            0x2F800 <= c <= 0x2FA1F)


def ours(c):
    """The class tokenizer.c gives c from utf8proc alone (before this table)."""
    k = LIB.utf8proc_category(c)
    if c in (9, 10, 13, 32) or ZS <= k <= ZP:
        return SPACE
    if c == 0 or c == 0xFFFD or k in (CC, CF, CS, CO):
        return CONTROL
    if 33 <= c <= 47 or 58 <= c <= 64 or 91 <= c <= 96 or 123 <= c <= 126 or PC <= k <= PO or is_cjk(c):
        return SPLIT
    if k == MN:
        return MARK
    return OTHER


def decomposes(c):
    buf = (ctypes.c_int32 * 8)()
    last = ctypes.c_int(0)
    n = LIB.utf8proc_decompose_char(c, buf, 8, UTF8PROC_DECOMPOSE, ctypes.byref(last))
    return n != 1 or buf[0] != c


def ids(tok, texts):
    return tok(texts, add_special_tokens=False)["input_ids"]


def measure(cased, uncased, cps):
    """HF's class of each code point, from how "x c y" tokenizes."""
    texts = ["x" + chr(c) + "y" for c in cps]
    got_c, got_u = ids(cased, texts), ids(uncased, texts)
    alone = ids(cased, [chr(c) for c in cps])
    xy_c, xsy_c, x_c, y_c = ids(cased, ["xy", "x y", "x", "y"])
    xy_u = ids(uncased, ["xy"])[0]
    out = []
    for c, gc, gu, a in zip(cps, got_c, got_u, alone):
        if gc == xy_c:
            out.append(CONTROL)
        elif gc == xsy_c:
            out.append(SPACE)
        elif a and gc == x_c + a + y_c:
            out.append(SPLIT)
        elif decomposes(c):
            # NFD changes c before the mark test, so the probe cannot see
            # whether HF calls c itself a mark: keep utf8proc's answer.
            out.append(ours(c) if ours(c) in (OTHER, MARK) else OTHER)
        else:
            out.append(MARK if gu == xy_u else OTHER)
    return out


def ranges(diffs):
    """Runs of consecutive code points with the same HF class."""
    out = []
    for c, k in diffs:
        if out and out[-1][1] == c - 1 and out[-1][2] == k:
            out[-1][1] = c
        else:
            out.append([c, c, k])
    return out


def main():
    cased = BertTokenizer("data/vocab/bert-base-cased-vocab.txt", do_lower_case=False)
    uncased = BertTokenizer("data/vocab/bert-base-uncased-vocab.txt", do_lower_case=True)
    # "[" can start a special-token match and is plain ASCII punctuation anyway.
    cps = [c for c in range(0x110000) if not (0xD800 <= c <= 0xDFFF) and c != ord("[")]
    diffs = []
    for start in range(0, len(cps), 65536):
        chunk = cps[start:start + 65536]
        for c, hf in zip(chunk, measure(cased, uncased, chunk)):
            if hf != ours(c):
                diffs.append((c, hf))
        print(f"U+{chunk[-1]:04X}: {len(diffs)} differences so far", file=sys.stderr)
    version = LIB.utf8proc_version().decode()
    with open("runtime/data/tokenizer_unicode.inc", "w") as f:
        f.write("/* runtime/data/tokenizer_unicode.inc — generated by scripts/gen_tokenizer_unicode.py; do not edit.\n"
                f" * HF tokenizers {tokenizers.__version__} (transformers {transformers.__version__}) against "
                f"utf8proc {version}:\n"
                f" * {len(diffs)} code points where HF's character class differs from utf8proc's. */\n")
        f.write(f'#define TOKENIZER_UNICODE_UTF8PROC "{version}"\n')
        f.write("static const TokClassRange tokenizer_hf_overrides[] = {\n")
        for lo, hi, k in ranges(diffs):
            f.write(f"    {{0x{lo:04X}, 0x{hi:04X}, {NAMES[k]}}},\n")
        f.write("};\n")
    print(f"runtime/data/tokenizer_unicode.inc: {len(diffs)} code points, {len(ranges(diffs))} ranges", file=sys.stderr)


if __name__ == "__main__":
    main()
