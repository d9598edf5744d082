"""An MNIST-sized MLP, 784-128-10 with ReLU, batch 32, cross-entropy, SGD: a small dense step."""

import numpy as np

from . import Train

SKIP = {"micrograd": "a scalar engine: 100k weights as Values is not this workload"}
LR = 0.05


def mlp_loss(xp, p, batch):
    x, y = batch
    return xp.cross_entropy(xp.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"], y)


def cases(quick):
    return [{"batch": 32}]


def make(case, dtype):
    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(0, 784 ** -0.5, (784, 128)).astype(dtype), "b1": np.zeros(128, dtype),
              "w2": rng.normal(0, 128 ** -0.5, (128, 10)).astype(dtype), "b2": np.zeros(10, dtype)}
    batch = (rng.random((case["batch"], 784)).astype(dtype), rng.integers(0, 10, case["batch"]))
    return Train(mlp_loss, params, batch, LR)
