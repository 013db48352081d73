#!/usr/bin/env python3
"""scripts/fit_gelu_cdf.py: where the constants of gelu_cdf
(program/activations.h) come from, and how accurate they are.

gelu_cdf evaluates the normal distribution function as
    Phi(-|x|) = erfc(z) / 2 = t Q(t) exp(-z^2),  z = |x| / sqrt 2,  t = 1 / (1 + p z)
with Q a polynomial of degree 5.  This script fits Q by minimax (Lawson's
iteratively reweighted least squares) on the absolute error of erfc over
z in [0, 10], for each p on a grid, keeps the best p, and prints the
constants as gelu_cdf writes them (the 1/2 folded into Q, p / sqrt 2 for
the FFMA on |x|).  Then it evaluates the f32 formula as the kernel does
(float32 numpy, exact rcp and exp2 in place of the .approx instructions)
against the exact GELU over [-12, 12] and random normal inputs, beside
the erff form it replaced.

Needs numpy and scipy (pip install numpy scipy); a developer's tool, not
part of the build or of `make test`.
"""
import numpy as np
from scipy.special import erf, erfcx

DEGREE = 5


def fit(p, n=DEGREE + 1, iters=60):
    z = np.concatenate([np.linspace(0, 6, 20001), np.linspace(6, 10, 2001)])
    t = 1 / (1 + p * z)
    target = erfcx(z)            # erfc(z) exp(z^2)
    weight = np.exp(-z * z)      # the error of erfc is weight * the error of t Q(t)
    basis = np.stack([t ** k for k in range(1, n + 1)], 1)
    lawson = np.ones_like(z)
    for _ in range(iters):
        w = weight * np.sqrt(lawson)
        coef, *_ = np.linalg.lstsq(basis * w[:, None], target * w, rcond=None)
        err = np.abs((basis @ coef - target) * weight)
        lawson = lawson * err
        lawson /= lawson.sum()
    return np.max(np.abs((basis @ coef - target) * weight)), coef


def gelu_cdf_f32(x, p_x, q):
    f32 = np.float32
    t = f32(1) / (f32(1) + p_x * np.abs(x))
    e = np.exp2((x * x) * f32(-0.72134752044448170)).astype(f32)
    acc = q[-1]
    for c in reversed(q[:-1]):
        acc = (c + t * acc).astype(f32)
    tail = (t * acc * e).astype(f32)
    return np.where(x >= 0, f32(1) - tail, tail), (f32(0.39894228040143268) * e).astype(f32)


def main():
    coarse = min((fit(p)[0], p) for p in np.linspace(0.2, 0.7, 51))
    best_err, best_p = min((fit(p)[0], p) for p in np.linspace(coarse[1] - 0.01, coarse[1] + 0.01, 41))
    p = round(best_p, 4)
    err, coef = fit(p)
    p_x = np.float32(p / np.sqrt(2.0))
    q = [np.float32(0.5 * c) for c in coef]
    print("p = %.4f: max |error| of erfc %.3g" % (p, err))
    print("FFMA constant p / sqrt 2 = %.10ef" % p_x)
    print("Q (1/2 folded), t^0 .. t^%d: %s" % (DEGREE, ", ".join("%.9ef" % c for c in q)))

    rng = np.random.default_rng(0)
    grid = np.linspace(-12, 12, 2000001).astype(np.float32)
    normal = rng.standard_normal(1000000).astype(np.float32)
    for name, x in (("[-12, 12]", grid), ("N(0, 1)", normal)):
        cdf, pdf = gelu_cdf_f32(x, p_x, q)
        xd = x.astype(np.float64)
        exact_cdf = 0.5 * (1 + erf(xd / np.sqrt(2)))
        exact = xd * exact_cdf
        exact_grad = exact_cdf + xd * np.exp(-0.5 * xd * xd) / np.sqrt(2 * np.pi)
        gelu = (x * cdf).astype(np.float32)
        grad = (cdf + x * pdf).astype(np.float32)
        e1 = (np.float32(1) + erf((x * np.float32(0.70710678)).astype(np.float64)).astype(np.float32)).astype(np.float32)
        old = (np.float32(0.5) * x * e1).astype(np.float32)
        print("%s: |Phi error| max %.3g; gelu |error| max %.3g (erff form %.3g), rel L2 %.3g (erff form %.3g);"
              " gelu' |error| max %.3g" %
              (name, np.max(np.abs(cdf - exact_cdf)), np.max(np.abs(gelu - exact)), np.max(np.abs(old - exact)),
               np.linalg.norm(gelu - exact) / np.linalg.norm(exact), np.linalg.norm(old - exact) / np.linalg.norm(exact),
               np.max(np.abs(grad - exact_grad))))


if __name__ == "__main__":
    main()
