"""A small CNN trained on 8x8 digits drawn procedurally (no download), in one compiled step.

    python examples/cnn_digits.py [--steps 300] [--batch 64] [--seed 0]

Each image is one of ten 3x5 digit glyphs, scaled to 6x6 or 5x5 (nearest neighbour), placed at
a random offset in an 8x8 frame, with a random stroke intensity and Gaussian noise. The model is
conv2d(1->8, 3x3, pad 1) -> relu -> max_pool2d(2) -> conv2d(8->16, 3x3, pad 1) -> relu ->
max_pool2d(2) -> dropout(0.1) -> Linear(64->10), trained with AdamW under a warmup-cosine
learning rate (the dropout key is step state: split anew inside each step);
weight decay applies to the conv kernels and the Linear weight only (optim's default mask: no
biases). It prints the held-out accuracy (argmax of the logits).
"""

import argparse

import numpy as np

import burjit
from burjit import nn, optim, random
from burjit import ops as F

GLYPHS = ["111101101101111", "010110010010111", "111001111100111", "111001111001111", "101101111001001",
          "111100111001111", "111100111101111", "111001010010010", "111101111101111", "111101111001111"]


def make_digits(n, rng):
    """n images (n, 1, 8, 8) float32 in [0, 1]-ish and their labels (n,)."""
    labels = rng.integers(0, 10, n)
    images = np.zeros((n, 1, 8, 8), np.float32)
    for i, d in enumerate(labels):
        glyph = np.array([int(c) for c in GLYPHS[d]], np.float32).reshape(5, 3)
        size = rng.choice([5, 6])
        rows, cols = np.arange(size) * 5 // size, np.arange(size) * 3 // size
        big = glyph[rows][:, cols]
        r, c = rng.integers(0, 8 - size + 1, 2)
        images[i, 0, r:r + size, c:c + size] = big * rng.uniform(0.6, 1.0)
    images += rng.normal(0, 0.15, images.shape).astype(np.float32)
    return images, labels


def init(seed):
    rng = np.random.default_rng(seed)

    def conv(o, c):
        return {"w": (rng.standard_normal((o, c, 3, 3)) * (c * 9) ** -0.5).astype(np.float32),
                "b": np.zeros(o, np.float32)}
    return {"conv1": conv(8, 1), "conv2": conv(16, 8), "head": HEAD.init(rng)}


HEAD = nn.Linear(64, 10)


def logits(p, x, key=None):
    """key: a dropout key while training; None for evaluation (no dropout)."""
    h = F.max_pool2d(F.relu(F.conv2d(x, p["conv1"]["w"], p["conv1"]["b"], padding=1)), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, p["conv2"]["w"], p["conv2"]["b"], padding=1)), 2)
    h = F.reshape(h, (x.shape[0], -1))
    return HEAD(p["head"], h if key is None else nn.dropout(key, h, 0.1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    params = init(args.seed)
    opt = optim.adamw(optim.warmup_cosine(3e-2, args.steps // 10, args.steps), weight_decay=1e-3)
    state = opt.init(params)

    @burjit.compile(donate_argnums=(0, 1, 2))
    def step(params, state, key, x, y):
        key, sub = random.split(key)
        loss, grads = burjit.value_and_grad(lambda p: F.cross_entropy(logits(p, x, sub), y))(params)
        params, state = opt.update(params, grads, state)
        return params, state, key, loss

    accuracy = burjit.compile(lambda p, x, y: F.mean(F.argmax(logits(p, x), -1) == y))
    key = random.key(args.seed)
    for i in range(args.steps):
        params, state, key, loss = step(params, state, key, *make_digits(args.batch, rng))
        if i % 50 == 0 or i == args.steps - 1:
            print(f"step {i:4d}  loss {float(loss):.4f}")
    acc = float(accuracy(params, *make_digits(1000, np.random.default_rng(args.seed + 1))))
    print(f"held-out accuracy {acc:.3f}")
    return acc


if __name__ == "__main__":
    main()
