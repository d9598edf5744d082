"""micrograd's demo MLP, 2-16-16-1 with ReLU, trained on two moons with its SVM hinge loss + L2.

micrograd runs it as it was written, one Value per scalar (numpy object arrays of Values);
the tensor frameworks run the same arithmetic on 16-wide arrays, as their users would.
"""

import numpy as np

from . import Train

SIZES = (2, 16, 16, 1)
ALPHA = 1e-4
LR = 0.1


def mlp_loss(xp, p, batch):
    x, y = batch
    h = x
    for i in range(len(SIZES) - 1):
        h = h @ p[f"w{i}"] + p[f"b{i}"]
        if i < len(SIZES) - 2:
            h = xp.relu(h)
    margins = xp.relu(1.0 - y * xp.reshape(h, (-1,)))
    reg = sum(xp.sum(p[f"w{i}"] * p[f"w{i}"]) for i in range(len(SIZES) - 1))
    return xp.mean(margins) + ALPHA * reg


def moons(n, rng):
    """Two interleaved half circles with noise, labels -1 / +1 (sklearn's make_moons, re-derived)."""
    t = rng.uniform(0, np.pi, n)
    upper = rng.random(n) < 0.5
    x = np.where(upper[:, None], np.stack([np.cos(t), np.sin(t)], 1),
                 np.stack([1 - np.cos(t), 0.5 - np.sin(t)], 1))
    return x + rng.normal(0, 0.1, x.shape), np.where(upper, 1.0, -1.0)


def cases(quick):
    return [{"batch": 32}]


def make(case, dtype):
    rng = np.random.default_rng(0)
    params = {}
    for i, (n_in, n_out) in enumerate(zip(SIZES, SIZES[1:])):
        params[f"w{i}"] = rng.uniform(-1, 1, (n_in, n_out)).astype(dtype)
        params[f"b{i}"] = np.zeros(n_out, dtype)
    x, y = moons(case["batch"], rng)
    return Train(mlp_loss, params, (x.astype(dtype), y.astype(dtype)), LR)
