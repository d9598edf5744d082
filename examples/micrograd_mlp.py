"""micrograd's moons demo (demo.ipynb) with burjit: a 2-16-16-1 ReLU MLP, SVM hinge loss + L2.

    python examples/micrograd_mlp.py

As in the notebook: 100 noisy two-moons points with labels -1/+1, loss
mean(relu(1 - y * score)) + 1e-4 * sum(p**2), 100 full-batch SGD steps with the learning
rate falling from 1.0 to 0.1. The whole step is one compiled function; the learning rate
is a traced input, so the schedule does not retrace it. `--steps-per-call K` runs K steps in
one call (`burjit.scan` over their learning rates): the same numbers, one Python call per K.

    python examples/micrograd_mlp.py --steps-per-call 10
"""

import argparse

import numpy as np

import burjit
from burjit import nn, optim
from burjit import ops as F


def make_moons(n, noise, rng):
    """Two interleaved half circles (like sklearn's make_moons), labels -1 and +1."""
    n_out = n // 2
    t_out, t_in = np.linspace(0, np.pi, n_out), np.linspace(0, np.pi, n - n_out)
    x = np.concatenate([np.stack([np.cos(t_out), np.sin(t_out)], 1),
                        np.stack([1 - np.cos(t_in), 0.5 - np.sin(t_in)], 1)])
    y = np.concatenate([-np.ones(n_out), np.ones(n - n_out)])
    return x + noise * rng.standard_normal(x.shape), y


SIZES = [2, 16, 16, 1]
# micrograd draws weights from uniform(-1, 1), whose std is 1/sqrt(3): the same scale here.
LAYERS = [nn.Linear(a, b, std=3 ** -0.5, dtype="float64") for a, b in zip(SIZES, SIZES[1:])]


def score(params, x):
    for i, (layer, p) in enumerate(zip(LAYERS, params)):
        x = layer(p, x)
        x = F.relu(x) if i < len(LAYERS) - 1 else x
    return F.reshape(x, x.shape[:-1])


def loss(params, x, y, alpha=1e-4):
    s = score(params, x)
    data_loss = F.mean(F.relu(1.0 - y * s))
    reg_loss = alpha * sum(F.sum(a * a) for a in burjit.pytree.flatten(params)[0])
    accuracy = F.mean(F.astype((y > 0) == (s > 0), "float64"))
    return data_loss + reg_loss, accuracy


def train(params, x, y, lr):
    (l, acc), grads = burjit.value_and_grad(loss, has_aux=True)(params, x, y)
    params, _ = optim.sgd(lr).update(params, grads, {})
    return params, (l, acc)


@burjit.compile(donate_argnums=0)
def steps(params, x, y, lrs):
    """len(lrs) training steps in one call: (params, losses, accuracies)."""
    params, (losses, accuracies) = burjit.scan(lambda p, lr: train(p, x, y, lr), params, lrs)
    return params, losses, accuracies


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--steps-per-call", type=int, default=1, help="training steps run by one compiled call")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.steps_per_call < 1:
        ap.error("--steps and --steps-per-call must be at least 1")
    rng = np.random.default_rng(args.seed)
    x, y = make_moons(100, 0.1, rng)
    params = [layer.init(rng) for layer in LAYERS]
    lrs = 1.0 - 0.9 * np.arange(args.steps) / args.steps
    for start in range(0, args.steps, args.steps_per_call):  # the last call may run fewer steps
        params, losses, accuracies = steps(params, x, y, lrs[start:start + args.steps_per_call])
        for k in range(start, start + len(losses)):
            if k % 10 == 0 or k == args.steps - 1:
                print(f"step {k} loss {float(losses[k - start]):.4f}, accuracy {100 * float(accuracies[k - start]):.0f}%")
    return float(accuracies[-1])


if __name__ == "__main__":
    main()
