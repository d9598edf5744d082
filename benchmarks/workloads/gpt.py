"""A miniature char-level GPT (2 layers, d_model 32, 4 heads, block 16, batch 8), one SGD step.

burjit runs burjit.nn.GPT; the peers run `gpt_loss` below, the same architecture written once
for all of them (pre-norm blocks, tanh-GELU, causal softmax with a -1e9 fill, no head bias),
started from the very parameters burjit.nn.GPT.init draws, so the check compares like with like.
"""

import json
import math

import numpy as np

from . import Train

SKIP = {"micrograd": "a scalar engine: a GPT as Values is out of reach"}
CONFIG = dict(n_layer=2, n_head=4, d_model=32, block_size=16)
BATCH = 8
LR = 0.1


def linear(p, x):
    y = x @ p["w"]
    return y + p["b"] if "b" in p else y


def layer_norm(xp, p, x, eps=1e-5):
    d = x - xp.mean(x, -1, True)
    return d / xp.sqrt(xp.mean(d * d, -1, True) + eps) * p["g"] + p["b"]


def attention(xp, p, x, n_head):
    B, T, C = x.shape
    hd = C // n_head
    qkv = linear(p["qkv"], x)
    q, k, v = (xp.transpose(xp.reshape(qkv[:, :, i * C:(i + 1) * C], (B, T, n_head, hd)), (0, 2, 1, 3))
               for i in range(3))
    att = (q @ xp.transpose(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(hd))
    att = xp.softmax(xp.where(np.tril(np.ones((T, T), bool)), att, -1e9), -1)
    return linear(p["proj"], xp.reshape(xp.transpose(att @ v, (0, 2, 1, 3)), (B, T, C)))


def gelu(xp, x):
    return 0.5 * x * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def gpt_loss(xp, p, batch):
    idx, targets = batch
    B, T = idx.shape
    x = p["wte"]["w"][idx] + p["wpe"]["w"][:T]
    for bp in p["blocks"]:
        x = x + attention(xp, bp["attn"], layer_norm(xp, bp["ln1"], x), CONFIG["n_head"])
        x = x + linear(bp["mlp"]["proj"], gelu(xp, linear(bp["mlp"]["fc"], layer_norm(xp, bp["ln2"], x))))
    logits = linear(p["head"], layer_norm(xp, p["ln_f"], x))
    vocab = logits.shape[-1]
    return xp.cross_entropy(xp.reshape(logits, (B * T, vocab)), xp.reshape(targets, (B * T,)))


def text():
    """A few kB of English that every Python ships (json's module docstring)."""
    return json.__doc__


def cases(quick):
    return [{"batch": BATCH}]


def make(case, dtype):
    from burjit import nn
    chars = sorted(set(text()))
    ids = np.array([chars.index(c) for c in text()])
    model = nn.GPT(len(chars), dtype=dtype, **CONFIG)
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(ids) - CONFIG["block_size"] - 1, case["batch"])
    window = np.stack([ids[s:s + CONFIG["block_size"] + 1] for s in starts])
    return Train(gpt_loss, model.init(0), (window[:, :-1], window[:, 1:]), LR,
                 own={"burjit": lambda xp, p, batch: model.loss(p, *batch)})
