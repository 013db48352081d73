#!/usr/bin/env python3
"""Writes the expected WordPiece ids that tests/test_tokenizer.c checks hpc against.

The reference is Hugging Face's BertTokenizer (transformers >= 5, backed by the
Rust `tokenizers` library; the same pipeline as BertTokenizerFast before) built
from the vocab files shipped in data/vocab.  Run it once, from the repository
root, in a throw-away virtual environment:

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install tokenizers transformers
    /tmp/hfvenv/bin/python scripts/gen_tokenizer_expected.py \\
        --sst2-dev /work/shared/data/sst2/dev.tsv --rte-dev /work/shared/data/rte/dev.tsv

Output: tests/data/tokenizer/{uncased,cased}.jsonl.  The first line is a
header object (the command, library versions, sources); every other line is
    {"src": "...", "a": TEXT, "b": TEXT_OR_NULL, "max_len": N,
     "ids": [...], "type_ids": [...]}
written with ensure_ascii, so the files are plain ASCII and texts holding
control characters survive.  The test compares ids and type_ids exactly.

Inputs: every CoLA dev sentence (data/cola/dev.tsv), every SST-2 dev sentence,
RTE dev sentence pairs (truncated at 128 tokens, so real longest-first
truncation is exercised), CoLA dev neighbours as pairs at max_len 24, and the
hand-written tricky strings below, plus every code point of
runtime/data/tokenizer_unicode.inc.  All of it is run for both vocabularies.
"""
import argparse
import json
import sys

import tokenizers
import transformers
from transformers import BertTokenizer

LONG_WORD_100 = "a" * 100
LONG_WORD_101 = "a" * 101

# (label, text_a, text_b, max_len): each probes one rule of BertNormalizer,
# BertPreTokenizer, WordPiece or the truncation.
TRICKY = [
    ("empty", "", None, 16),
    ("spaces only", "   \t\n  ", None, 16),
    ("controls only", "\x00\x01\x07\x1b\x7f", None, 16),
    ("plain", "Hello, world!", None, 16),
    ("mixed case", "ThE QuIcK BrOwN FoX", None, 32),
    ("accents", "Café naïve résumé Ångström façade jalapeño", None, 64),
    ("combining marks", "e\u0301 a\u0300 n\u0303 o\u0308 cafe\u0301", None, 32),
    ("german", "Straße STRASSE Grüße \u1e9e", None, 32),
    ("turkish", "İstanbul ıi IJ", None, 32),
    ("greek sigma", "ΟΔΟΣ Σίσυφος ὀδυσσεύς", None, 64),
    ("cyrillic", "Привет, мир! Ёлка", None, 32),
    ("cjk", "我爱北京天安门 中文字符", None, 32),
    ("cjk mixed", "abc漢字def 日本語のテキスト", None, 32),
    ("cjk compat", "\uf900\ufa0e \U0002f800", None, 16),
    ("cjk ext", "\U00020000\U0002a700\U0002b740\U0002b820\U0002ceaf", None, 16),
    ("cjk ext gap", "a\U0002b820b a\U0002b91fb a\U0002b920b a\U0002b81fb", None, 32),
    ("newer unicode", "x\u061dy x\u166dy x\u1734y x\u0890y x\u2e55y x\U00011b00y", None, 64),
    ("hangul", "안녕하세요 세계", None, 32),
    ("thai", "สวัสดีครับ", None, 32),
    ("devanagari", "नमस्ते दुनिया", None, 32),
    ("arabic", "مرحبا بالعالم", None, 32),
    ("hebrew", "שָׁלוֹם", None, 32),
    ("emoji", "I love 🍕 and 🐍! 👍🏽 👨‍👩‍👧", None, 32),
    ("symbols", "$100 + 5% = <x> ^ ` | ~ © ® ™ € £ ¥ ° ± × ÷", None, 64),
    ("unicode punct", "«quoted» „low“ ‘single’ — – … · ¿qué? ¡sí! 、。「」", None, 64),
    ("fullwidth", "ＡＢＣ１２３！？", None, 32),
    ("ligatures", "ﬁnance ﬂow ǅ", None, 32),
    ("letterlike", "Å Ω K ℃ Ⅻ ⅻ Ⓐ ⓐ", None, 32),
    ("math letters", "𝐀𝐁𝐂 𝕏", None, 32),
    ("nul and fffd", "a\x00b c\ufffdd", None, 16),
    ("c0 controls", "a\x01b\x02c\x1bd\x7fe", None, 16),
    ("c1 and nel", "a\x85b\x9fc", None, 16),
    ("tabs and newlines", "a\tb\nc\rd\r\ne", None, 16),
    ("vertical tab form feed", "a\x0bb\x0cc", None, 16),
    ("unicode spaces", "a\u00a0b\u2003c\u3000d\u2028e\u2029f\u202fg\u1680h", None, 32),
    ("format chars", "a\u200bb\u200dc\ufeffd\u00ade\u2060f", None, 16),
    ("private use", "a\ue000b\U000f0000c", None, 16),
    ("unassigned", "a\u0378b", None, 16),
    ("numbers", "3.14159 1,000,000 2nd 42nd 1e-5", None, 32),
    ("url and email", "https://example.com/a?b=c&d=e user@example.org", None, 64),
    ("contractions", "don't won't it's I'm y'all", None, 32),
    ("repeated punct", "!!! ??? ... --- *** ###", None, 32),
    ("brackets", "(a) [b] {c} <d>", None, 32),
    ("special tokens", "hello [SEP] world [CLS][MASK] [PAD] [UNK]", None, 32),
    ("special glued", "abc[SEP]def x[MASK]y", None, 32),
    ("special lower", "[sep] [cls] [Mask]", None, 32),
    ("special partial", "[SE [SEPX ]SEP[", None, 32),
    ("word of 100", LONG_WORD_100, None, 16),
    ("word of 101", LONG_WORD_101, None, 16),
    ("word of 101 accented", "é" * 101, None, 16),
    ("long word then punct", LONG_WORD_101 + "!" + "b", None, 16),
    ("unknown word", "xqzxqzxqz zzzzzzzzzzzzz", None, 32),
    ("wordpiece split", "unaffable tokenization hyperparameters", None, 32),
    ("many words", " ".join(["word"] * 200), None, 64),
    ("truncate single", "one two three four five six seven eight nine ten", None, 6),
    ("truncate single exact", "one two three", None, 5),
    ("min length single", "one two", None, 2),
    ("pair short", "How are you?", "I am fine.", 32),
    ("pair empty a", "", "only b", 16),
    ("pair empty b", "only a", "", 16),
    ("pair both empty", "", "", 16),
    ("pair trunc a longer", "a b c d e f g h i j k l", "x y", 10),
    ("pair trunc b longer", "x y", "a b c d e f g h i j k l", 10),
    ("pair trunc equal", "a b c d e f", "u v w x y z", 9),
    ("pair trunc equal even", "a b c d e f", "u v w x y z", 10),
    ("pair trunc a longer by one", "a b c d e", "w x y z", 10),
    ("pair trunc b longer by one", "a b c d", "v w x y z", 10),
    ("pair trunc both long", " ".join(["alpha"] * 50), " ".join(["beta"] * 60), 20),
    ("pair min length", "a b", "c d", 3),
    ("pair cjk", "我爱你", "你爱我吗", 8),
]


def override_cases():
    """Every code point of runtime/data/tokenizer_unicode.inc (where HF's Unicode
    data differs from utf8proc), each as x<c>y, 40 to a case."""
    import re
    cps = []
    with open("runtime/data/tokenizer_unicode.inc", encoding="utf-8") as f:
        for lo, hi in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+),", f.read()):
            cps.extend(range(int(lo, 16), int(hi, 16) + 1))
    for i in range(0, len(cps), 40):
        text = " ".join("x" + chr(c) + "y" for c in cps[i:i + 40])
        yield (f"unicode overrides {i}-{min(i + 40, len(cps)) - 1}", text, None, 512)


def load_tsv_column(path, column, header):
    """Texts of one column of a TAB file (no CSV quoting: GLUE files are raw)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if header:
        lines = lines[1:]
    return [ln.split("\t")[column] for ln in lines if ln]


def load_rte_pairs(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")[1:]
    return [(ln.split("\t")[1], ln.split("\t")[2]) for ln in lines if ln]


def cases(args):
    cola = load_tsv_column("data/cola/dev.tsv", 3, header=False)
    for i, s in enumerate(cola):
        yield (f"cola/dev.tsv:{i + 1}", s, None, 128)
    for i in range(0, len(cola) - 1, 2):
        yield (f"cola/dev.tsv:{i + 1}+{i + 2}", cola[i], cola[i + 1], 24)
    for i, s in enumerate(load_tsv_column(args.sst2_dev, 0, header=True)):
        yield (f"sst2/dev.tsv:{i + 2}", s, None, 128)
    for i, (a, b) in enumerate(load_rte_pairs(args.rte_dev)):
        yield (f"rte/dev.tsv:{i + 2}", a, b, 128)
    for label, a, b, n in TRICKY:
        yield (f"tricky: {label}", a, b, n)
    for label, a, b, n in override_cases():
        yield (f"tricky: {label}", a, b, n)


def write(path, tok, header, args):
    n = 0
    with open(path, "w", encoding="ascii") as out:
        out.write(json.dumps(header, ensure_ascii=True) + "\n")
        for src, a, b, max_len in cases(args):
            enc = tok(a, b, truncation=True, max_length=max_len)
            row = {"src": src, "a": a, "b": b, "max_len": max_len,
                   "ids": enc["input_ids"], "type_ids": enc["token_type_ids"]}
            out.write(json.dumps(row, ensure_ascii=True) + "\n")
            n += 1
    print(f"{path}: {n} cases", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sst2-dev", required=True, help="GLUE SST-2 dev.tsv")
    ap.add_argument("--rte-dev", required=True, help="GLUE RTE dev.tsv")
    ap.add_argument("--out", default="tests/data/tokenizer")
    args = ap.parse_args()
    for name, vocab, lower in [("uncased", "data/vocab/bert-base-uncased-vocab.txt", True),
                               ("cased", "data/vocab/bert-base-cased-vocab.txt", False)]:
        tok = BertTokenizer(vocab, do_lower_case=lower)
        header = {"generated_by": "scripts/gen_tokenizer_expected.py --sst2-dev " + args.sst2_dev +
                  " --rte-dev " + args.rte_dev,
                  "reference": "transformers.BertTokenizer(vocab, do_lower_case=%s)" % lower,
                  "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                  "vocab": vocab,
                  "sources": "CoLA dev (data/cola), GLUE SST-2 dev and RTE dev (see tests/data/tokenizer/README.md)"}
        write(f"{args.out}/{name}.jsonl", tok, header, args)


if __name__ == "__main__":
    main()
