#!/usr/bin/env python3
"""scripts/sass_loops.py — static instruction counts of one kernel's SASS.

Reads `cuobjdump -sass -fun NAME` output on stdin and prints the kernel's
instruction count, its largest loop (the backward branch whose target is
furthest back: in hpc's kernels the loop over key or query tiles) and that
loop's opcodes, most frequent first.  Static counts, not executed ones: a
loop's body runs once per trip, code under a rare branch counts like the
rest.  scripts/sass-stats.sh calls it for each kernel it lists.
"""
import collections
import re
import sys

LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
TARGET = re.compile(r"BRA\b.*?0x([0-9a-f]+)")
PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def opcode(text):
    text = PREDICATE.sub("", text)
    return text.split()[0] if text else "?"


def main():
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    code = []   # (address, text)
    for line in sys.stdin:
        m = LINE.match(line)
        if m:
            code.append((int(m.group(1), 16), m.group(2)))
    at = {addr: i for i, (addr, _) in enumerate(code)}
    loops = []
    for i, (addr, text) in enumerate(code):
        m = TARGET.search(text) if "BRA" in text else None
        if m and int(m.group(1), 16) < addr and int(m.group(1), 16) in at:
            loops.append((at[int(m.group(1), 16)], i))
    print(f"  {len(code)} instructions", end="")
    if not loops:
        print(", no loop")
        return
    first, last = max(loops, key=lambda r: r[1] - r[0])
    ops = collections.Counter(opcode(t) for _, t in code[first:last + 1])
    print(f"; largest loop {last - first + 1} (instructions {first}..{last})")
    print("   " + ", ".join(f"{o} {n}" for o, n in ops.most_common(top)))


if __name__ == "__main__":
    main()
