"""BurTorch's smallest example (exp1): 6 scalar ops on a = -41, b = 2, value and gradient.

c = a + b, d = a * b + b ** 3, e = c - d, f = e ** 2, g = f / 2 gives g = 612.5,
dg/da = -35, dg/db = 1050, which every framework must reproduce. At this size a step is
nothing but per-call overhead: the floor under every other workload.
"""

import numpy as np

from . import Grad

EXPECTED = {"value": [612.5], "grad": [-35.0, 1050.0]}
EXTRA = ("burjit.load",)  # the exported step beside the compiled one (benchmarks.exported: from C)
PUBLISHED = "BurTorch (C++, on its authors' machine): 0.07 us per iteration"


def tiny(xp, x):
    a, b = xp.unstack(x)
    c = a + b
    d = a * b + b ** 3
    e = c - d
    f = e ** 2
    return f / 2.0


def cases(quick):
    return [{}]


def make(case, dtype):
    return Grad(tiny, np.array([-41.0, 2.0], dtype))
