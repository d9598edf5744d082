"""Rogozhnikov's "fastest autograd" graph, as published: from 100 scalars 0, 1, ..., 99, n ops
cycling softplus(nodes[-10]), the sum of nodes[-30:-10:5] (4 inputs), nodes[-20] * nodes[-10] and
a softmax of nodes[-4:] (4 new nodes); the value of nodes[-1] and its gradient w.r.t. the 100.

The softmax subtracts the max of its 4 inputs, as a library softmax does (the products reach
~9,000, so exp alone would overflow); the max is max(a, b) = a + relu(b - a), from ops every
framework has. Softmax ignores a shift, so the max's own gradient is zero up to rounding.
The values settle into a cycle within a few hundred ops (nodes[-1] = 0.1259 for every n here)
and saturated softmaxes stop almost all of the gradient: at n = 1,000 four inputs get one, the
largest ~1e-76; at n = 10,000 it underflows to zero. So the check is mostly the value's; the
graph is about speed, as published.
"""

import numpy as np

from . import Grad

N_IN = 100
LARGE = [{"n": 100_000}, {"n": 1_000_000}]  # --large


def maximum(xp, a, b):
    return a + xp.relu(b - a)


def softmax(xp, vs):
    m = vs[0]
    for v in vs[1:]:
        m = maximum(xp, m, v)
    e = [xp.exp(v - m) for v in vs]
    total = e[0] + e[1] + e[2] + e[3]
    return [v / total for v in e]


def graph(n):
    def f(xp, x):
        nodes = xp.unstack(x)
        for i in range(n):
            if i % 4 == 0:
                nodes.append(xp.softplus(nodes[-10]))
            elif i % 4 == 1:
                a, b, c, d = nodes[-30:-10:5]
                nodes.append(a + b + c + d)
            elif i % 4 == 2:
                nodes.append(nodes[-20] * nodes[-10])
            else:
                nodes.extend(softmax(xp, nodes[-4:]))
        return nodes[-1]
    return f


def cases(quick):
    return [{"n": n} for n in ((100,) if quick else (1000, 10000))]


def make(case, dtype):
    return Grad(graph(case["n"]), np.arange(N_IN, dtype=dtype))
