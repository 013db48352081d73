#!/usr/bin/env python3
"""bench/hpc_order.py: hpc's batch order in Python (standard library only).

A port of the shuffle of runtime/data/loader.c, so a PyTorch loop can visit
the rows hpc's trainer visits, step for step, for the same --seed: the
rows of epoch e are a Fisher-Yates permutation of 0..n-1 (file order)
whose swap j for position i = n-1 .. 1 is a Philox-4x32-10 draw
(runtime/cpu/philox.c) with counter (i lo, i hi, e, "SHUF") and key
(seed lo, seed hi), taken modulo i + 1; batches are consecutive slices of
that order, the last one short.  The epoch counter starts at 0 and the
order depends only on (seed, e).

What it covers is the trainer's train loop (runtime/train/trainer.c,
train_loop) with shuffle on and bucketing off (no --bucket), one batch per
step (grad_accum 1), on one process, over every row of train.tsv in file
order (a GLUE task stops at a bad row unless --skip-bad-rows, so none is
dropped; truncating a row to seq_len changes no position).  --pack changes
a batch's layout, not its rows.

Self-check: python3 bench/hpc_order.py (Philox's known answers, and a
small plan that must cover every row once per epoch).  The C side holds
the same small plan: tests/test_loader.c, shuffle_matches_the_python_port.
"""
import sys

M32 = 0xFFFFFFFF
SALT_SHUFFLE = 0x53485546  # "SHUF", loader.c's salt of the row shuffle


def philox(counter, key):
    """Philox-4x32-10 as runtime/cpu/philox.c computes it."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0 = (k0 + 0x9E3779B9) & M32
            k1 = (k1 + 0xBB67AE85) & M32
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
    return c0, c1, c2, c3


def loader_draw(seed, epoch, salt, i, bound):
    """loader.c's loader_draw: a uniform integer in [0, bound)."""
    r = philox((i & M32, (i >> 32) & M32, epoch & M32, salt), (seed & M32, (seed >> 32) & M32))
    return ((r[1] << 32) | r[0]) % bound


def epoch_order(n, seed, epoch):
    """The rows of epoch `epoch` in hpc's visiting order (shuffle on, no bucketing)."""
    a = list(range(n))
    for i in range(n - 1, 0, -1):
        j = loader_draw(seed, epoch, SALT_SHUFFLE, i, i + 1)
        a[i], a[j] = a[j], a[i]
    return a


def batch_plan(n, batch, epochs, seed):
    """Row indices of every step's batch, epoch after epoch, as hpc's trainer takes them."""
    plan = []
    for e in range(epochs):
        order = epoch_order(n, seed, e)
        plan += [order[b:b + batch] for b in range(0, n, batch)]
    return plan


def self_check():
    # tests/test_philox.c's known answers (Random123's)
    assert philox((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert philox((M32,) * 4, (M32, M32)) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    plan = batch_plan(10, 4, 2, 3)
    assert [len(b) for b in plan] == [4, 4, 2, 4, 4, 2], plan
    for e in range(2):
        assert sorted(r for b in plan[3 * e:3 * e + 3] for r in b) == list(range(10)), plan
    assert plan[:3] != plan[3:], "epochs 0 and 1 drew the same order"
    assert batch_plan(10, 4, 2, 3) == plan and batch_plan(10, 4, 2, 4) != plan
    print("hpc_order: self-check passed; batch_plan(10, 4, 2, seed 3) = %s" % plan)


if __name__ == "__main__":
    sys.exit(self_check())
