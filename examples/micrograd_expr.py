"""The expression from micrograd's README, traced, differentiated and compiled by burjit.

Prints g and its gradients; micrograd gives g=24.7041, dg/da=138.8338, dg/db=645.5773.
"""

import numpy as np

import burjit
from burjit import ops as F


def expression(a, b):
    c = a + b
    d = a * b + b ** 3
    c = c + c + 1
    c = c + 1 + c + (-a)
    d = d + d * 2 + F.relu(b + a)
    d = d + 3 * d + F.relu(b - a)
    e = c - d
    f = e ** 2
    g = f / 2.0
    g = g + 10.0 / f
    return g


step = burjit.compile(burjit.value_and_grad(expression, argnums=(0, 1)))

if __name__ == "__main__":
    g, (da, db) = step(np.float64(-4.0), np.float64(2.0))
    print(f"g     = {float(g):.4f}")
    print(f"dg/da = {float(da):.4f}")
    print(f"dg/db = {float(db):.4f}")
