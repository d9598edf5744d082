"""The expression from micrograd's README: a 20-op scalar graph, value and gradient w.r.t. a and b.

micrograd's README prints g = 24.7041, dg/da = 138.8338, dg/db = 645.5773; every framework
must reproduce those before it is timed. burjit's reference backend runs here too (issue #3).
"""

import numpy as np

from . import Grad

EXTRA = ("burjit-ref",)
EXPECTED = {"value": [24.7041], "grad": [138.8338, 645.5773]}


def expression(xp, x):
    a, b = xp.unstack(x)
    c = a + b
    d = a * b + b ** 3
    c = c + c + 1
    c = c + 1 + c + (-a)
    d = d + d * 2 + xp.relu(b + a)
    d = d + 3 * d + xp.relu(b - a)
    e = c - d
    f = e ** 2
    g = f / 2.0
    g = g + 10.0 / f
    return g


def cases(quick):
    return [{}]


def make(case, dtype):
    return Grad(expression, np.array([-4.0, 2.0], dtype))
