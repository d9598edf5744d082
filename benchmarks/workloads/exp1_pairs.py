"""BurTorch's exp1 (see tiny.py) over 100,000 (a, b) pairs at once: x has shape (2, n), a = x[0],
b = x[1]; the value is the sum over pairs of f / 2, the gradient has x's shape. Elementwise
code at memory speed: what matters is vectorised loops, fused kernels and no copies of the
rows, not per-call overhead. Reported per step; divide by n for the time per pair.
"""

import numpy as np

from . import Grad
from .tiny import tiny

SKIP = {"micrograd": "a scalar engine: 100,000 pairs as Values is not this workload"}
DTYPES = ("float32", "float64")


def exp1_pairs(xp, x):
    return xp.sum(tiny(xp, x))  # tiny's rows are vectors here


def cases(quick):
    return [{"n": 100_000}]


def make(case, dtype):
    rng = np.random.default_rng(0)
    return Grad(exp1_pairs, np.stack([rng.uniform(-50, 50, case["n"]), rng.uniform(-3, 3, case["n"])]).astype(dtype))
