#!/usr/bin/env python3
"""How far Winograd's F(m x m, 3x3) moves a bf16 convolution's error, as a model (numpy, no kdflow):
which tile sizes a bf16 plan could offer within the bound of
`TeacherOps.WinogradInBf16StaysNearTheDirectBf16` (3x the direct bf16 convolution's error plus 2e-3).

One layer of C input channels: bf16 inputs and a kernel of N(0, 1/(9C)) weights; the reference is
the exact correlation of the bf16 input with the bf16-rounded kernel (what a direct bf16
convolution computes before its output's rounding). Direct: that reference rounded to bf16.
Winograd as kdflow's bf16 plans run F(2x2): the transformed tile B^T d B and the transformed kernel
G g G^T each rounded to bf16, their products summed exactly, the output transform, and the output
rounded to bf16. The transforms are Toom-Cook's over the given interpolation points and infinity
(derived here with sympy, and checked exact in rationals). The error is the normalized one the test
uses, ||y - ref|| / ||ref||, over all outputs.

Run with the kdflow venv's python (numpy, sympy: torch's dependency).

usage: winograd_bf16_error.py OUT_JSON [--channels 64] [--tiles 400] [--seed 0]
"""
import argparse
import json
import random
import subprocess
import os

import numpy as np
import sympy as sp

# (label, m, finite interpolation points): Lavin and Gray's F(2x2) and F(4x4) as kdflow builds
# them, and F(3x3) over the point sets of the smallest coefficients.
CASES = [("F(2x2) points 0 1 -1", 2, [0, 1, -1]),
         ("F(3x3) points 0 1 -1 2", 3, [0, 1, -1, 2]),
         ("F(3x3) points 0 1 -1 1/2", 3, [0, 1, -1, sp.Rational(1, 2)]),
         ("F(3x3) points 0 1 -1 -1/2", 3, [0, 1, -1, sp.Rational(-1, 2)]),
         ("F(4x4) points 0 1 -1 2 -2", 4, [0, 1, -1, 2, -2])]


def transforms(points, m, r=3):
    """A^T (m x a), G (a x r), B^T (a x a) of F(m, r) over `points` and infinity, a = m + r - 1."""
    a = m + r - 1
    at, g = sp.zeros(m, a), sp.zeros(a, r)
    for j, p in enumerate(points):
        p = sp.nsimplify(p)
        f = sp.prod([p - sp.nsimplify(q) for q in points if sp.nsimplify(q) != p])
        for i in range(m):
            at[i, j] = p ** i
        for k in range(r):
            g[j, k] = p ** k / f
    at[m - 1, a - 1] = 1
    g[a - 1, r - 1] = 1
    b = sp.Matrix(a, a, lambda i, j: sp.Symbol(f"b{i}_{j}"))
    eqs = [sum(at[i, j] * g[j, k] * b[j, l] for j in range(a)) - (1 if l == i + k else 0)
           for i in range(m) for k in range(r) for l in range(a)]
    bt = b.subs(sp.solve(eqs, list(b)))
    # exact on random integers, in rationals
    rnd = random.Random(1)
    d = sp.Matrix([rnd.randint(-9, 9) for _ in range(a)])
    w = sp.Matrix([rnd.randint(-9, 9) for _ in range(r)])
    y = at * (g * w).multiply_elementwise(bt * d)
    assert list(y) == [sum(w[k] * d[i + k] for k in range(r)) for i in range(m)], "not exact"
    f64 = lambda mat: np.array(mat.tolist(), dtype=np.float64)  # noqa: E731
    return f64(at), f64(g), f64(bt)


def bf16(x):
    """f32 -> bf16 -> f32, rounded to nearest even."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def errors(at, g_t, bt, m, channels, tiles, rng, outputs=8):
    a = m + 2
    d = bf16(rng.standard_normal((tiles, channels, a, a)).astype(np.float32)).astype(np.float64)
    g = (rng.standard_normal((outputs, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32)
    gb = bf16(g).astype(np.float64)
    ref = np.zeros((tiles, outputs, m, m))
    for i in range(m):
        for j in range(m):
            ref[:, :, i, j] = np.einsum("tcuv,kcuv->tk", d[:, :, i:i + 3, j:j + 3], gb)
    v = bf16(np.einsum("ij,tcjk,lk->tcil", bt, d, bt).astype(np.float32)).astype(np.float64)
    u = bf16(np.einsum("ij,kcjl,ml->kcim", g_t, g.astype(np.float64), g_t).astype(np.float32))
    prod = np.einsum("tcij,kcij->tkij", v, u.astype(np.float64))
    y = bf16(np.einsum("ij,tkjl,ml->tkim", at, prod, at).astype(np.float32)).astype(np.float64)
    direct = bf16(ref.astype(np.float32)).astype(np.float64)
    norm = np.linalg.norm(ref)
    return float(np.linalg.norm(y - ref) / norm), float(np.linalg.norm(direct - ref) / norm)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--tiles", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    rows = []
    for label, m, points in CASES:
        at, g, bt = transforms(points, m)
        w, d = errors(at, g, bt, m, a.channels, a.tiles, rng)
        rows.append({"case": label, "m": m, "multiplies_saved": 9 * m * m / (m + 2) ** 2,
                     "winograd_error": w, "direct_error": d, "over_direct": w / d,
                     "within_test_bound": w <= 3 * d + 2e-3})
        print(json.dumps(rows[-1]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    with open(a.out, "w") as f:
        json.dump({"model": "numpy error model of one bf16 layer (no kdflow, no CPU dependence)",
                   "commit": commit, "channels": a.channels, "tiles": a.tiles, "seed": a.seed,
                   "test_bound": "winograd_error <= 3 * direct_error + 2e-3", "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()
