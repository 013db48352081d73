#!/usr/bin/env python3
"""scripts/ncu_stalls.py — where a kernel's warps wait, from Nsight Compute's
source page.

    ncu --kernel-name regex:NAME --launch-count 1 --set full --import-source yes -o rep PROGRAM ...
    ncu --import rep.ncu-rep --page source --csv --print-source sass | python3 scripts/ncu_stalls.py [TOP]

Prints the stall samples in all, the share of each stall reason, the
opcodes that execute the most warp instructions (the thirty-third session
found each wgmma of a GEMM loop costing 18 others this way), the share of
each region of the SASS (split after every BAR, WARPSYNC and EXIT
instruction: a loop's barriers mark its phases) in samples and in executed
instructions, with its two largest reasons, and the TOP (default 25)
instructions with the most samples, each with its address, its two
largest reasons and its text.  The column names
differ between Nsight Compute versions: the script takes the stall columns
as those whose header starts with "stall_" (each reason's all-samples
column; the "(Not Issued)" ones are left out), or else those that contain
"Stall" and "Samples", and prints the header when it finds none.
"""
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 25
    lines = [l for l in sys.stdin if l.strip()]
    # the table's header names the address and source columns (ncu may print
    # the kernel's name on lines before it)
    start = next((i for i, l in enumerate(lines) if '"Address"' in l or '"Source"' in l), None)
    if start is None:
        sys.exit("ncu_stalls: no CSV table on stdin")
    rows = list(csv.reader(lines[start:]))
    head, body = rows[0], rows[1:]
    # each reason has an "all samples" column and a "(Not Issued)" one: the first
    stall = [i for i, h in enumerate(head) if h.startswith("stall_") and "Not Issued" not in h]
    if not stall:
        stall = [i for i, h in enumerate(head) if "Stall" in h and "Samples" in h and "Not Issued" not in h]
    text = next((i for i, h in enumerate(head) if h.strip() in ("Source", "SASS")), None)
    addr = next((i for i, h in enumerate(head) if h.strip() == "Address"), None)
    if not stall or text is None:
        sys.exit("ncu_stalls: columns not found; the header is: " + " | ".join(head))
    names = [head[i].replace("stall_", "") for i in stall]
    per_row = [[number(r[i]) if i < len(r) else 0.0 for i in stall] for r in body]
    ex = next((i for i, h in enumerate(head) if h.strip() == "Instructions Executed"), None)
    executed = [number(r[ex]) if ex is not None and ex < len(r) else 0.0 for r in body]
    all_executed = sum(executed)
    total = sum(sum(v) for v in per_row)
    if total <= 0:
        sys.exit("ncu_stalls: no samples (was the report taken with --set full?)")
    print(f"stall samples: {total:.0f}")
    sums = [sum(v[k] for v in per_row) for k in range(len(stall))]
    order = sorted(range(len(stall)), key=lambda k: -sums[k])
    print("by reason: " + ", ".join(f"{names[k]} {100 * sums[k] / total:.1f} %" for k in order[:10]))

    def two(v):
        ks = sorted(range(len(v)), key=lambda k: -v[k])[:2]
        return ", ".join(f"{names[k]} {v[k]:.0f}" for k in ks if v[k] > 0)

    if all_executed > 0:
        by_op = {}
        for r, e in zip(body, executed):
            words = r[text].split()
            op = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "")
            op = op.split(".")[0]
            by_op[op] = by_op.get(op, 0.0) + e
        ops = sorted(by_op, key=lambda o: -by_op[o])[:12]
        print(f"warp instructions executed: {all_executed:.0f}; by opcode: " +
              ", ".join(f"{o} {100 * by_op[o] / all_executed:.1f} %" for o in ops))

    def share(e):
        return f" {100 * e / all_executed:5.1f} % of the instructions" if all_executed > 0 else ""

    print("by region (split after BAR / WARPSYNC / EXIT): samples, instructions executed, reasons")
    region, acc, first, ex_acc = 0, [0.0] * len(stall), None, 0.0
    for r, v, e in zip(body, per_row, executed):
        src = r[text].strip()
        if first is None:
            first = r[addr] if addr is not None else ""
        acc = [a + b for a, b in zip(acc, v)]
        ex_acc += e
        if any(src.startswith(op) or f" {op}" in src for op in ("BAR", "WARPSYNC", "EXIT")):
            s = sum(acc)
            if s > 0:
                print(f"  region {region:2d} from {first} to {r[addr] if addr is not None else ''} ({src[:40]}): "
                      f"{100 * s / total:5.1f} %{share(ex_acc)}  {two(acc)}")
            region, acc, first, ex_acc = region + 1, [0.0] * len(stall), None, 0.0
    if sum(acc) > 0:
        print(f"  region {region:2d} (to the end): {100 * sum(acc) / total:5.1f} %{share(ex_acc)}  {two(acc)}")
    print(f"the {top} instructions with the most samples:")
    ranked = sorted(range(len(body)), key=lambda i: -sum(per_row[i]))[:top]
    for i in sorted(ranked):
        s = sum(per_row[i])
        where = body[i][addr] if addr is not None else str(i)
        print(f"  {where:>8} {100 * s / total:5.1f} %  {two(per_row[i]):34s} {body[i][text].strip()[:70]}")


if __name__ == "__main__":
    main()
