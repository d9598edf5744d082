"""The "fastest autograd" pattern: a scalar graph of n ops cycling softplus, multiply, a 4-input
sum and a 4-way softmax, value and gradient w.r.t. 16 inputs.

Every cycle reads the previous softmax (values in (0, 1)) and one value drawn from anywhere
earlier, so the graph is a long chain with long-range edges, and every value stays bounded
(softmax inputs below 5): the plain exp-normalise softmax is exact in float32 and float64.
The program is drawn once from a seeded generator; each framework interprets the same one.
"""

import numpy as np

from . import Grad

N_IN = 16


def program(n, seed=0):
    """n // 4 cycles of (softplus operand, multiply operand, sum operand, far operand, softmax operand)."""
    rng = np.random.default_rng(seed)
    return [tuple(int(v) for v in rng.integers(0, 4, 4)) + (int(rng.integers(0, N_IN + 4 * i)),)
            for i in range(n // 4)]


def interpreter(prog):
    def f(xp, x):
        xs = xp.unstack(x)
        earlier, p = list(xs), xs[:4]
        for i0, i1, i2, i3, far in prog:
            a = xp.softplus(p[i0])
            b = a * p[i1]
            c = a + b + p[i2] + earlier[far]
            e = [xp.exp(v) for v in (c, a, b, p[i3])]
            total = e[0] + e[1] + e[2] + e[3]
            p = [v / total for v in e]
            earlier.extend(p)
        return c
    return f


def cases(quick):
    return [{"n": n} for n in ((1000,) if quick else (1000, 10000, 100000))]


def make(case, dtype):
    x0 = np.random.default_rng(1).uniform(0.05, 0.95, N_IN).astype(dtype)
    return Grad(interpreter(program(case["n"])), x0)
