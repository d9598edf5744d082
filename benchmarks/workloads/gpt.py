"""A miniature char-level GPT (2 layers, d_model 32, 4 heads, block 16, batch 8), one SGD step.

burjit runs burjit.nn.GPT; the peers run `gpt_loss` below, the same architecture written once
for all of them (pre-norm blocks, causal softmax with a -1e9 fill, GELU or ReLU MLP, biases
where the parameters have them). Every framework starts from the parameters `init` draws with
numpy in nn.GPT's layout (weights ~ N(0, 0.02)), so the check compares like with like and no
peer's process imports burjit; burjit's worker checks that layout against nn.GPT.init.
"""

import functools
import json
import math

import numpy as np

from . import Train

SKIP = {"micrograd": "a scalar engine without max or softmax: a GPT as Values is out of reach"}
CONFIG = dict(n_layer=2, n_head=4, d_model=32, block_size=16)  # nn.GPT's defaults for the rest
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


ACTIVATIONS = {"gelu": gelu, "relu": lambda xp, x: xp.relu(x)}


def gpt_loss(xp, p, batch, n_head, activation="gelu"):
    idx, targets = batch
    B, T = idx.shape
    act = ACTIVATIONS[activation]
    x = p["wte"]["w"][idx] + p["wpe"]["w"][:T]
    for bp in p["blocks"]:
        x = x + attention(xp, bp["attn"], layer_norm(xp, bp["ln1"], x), n_head)
        x = x + linear(bp["mlp"]["proj"], act(xp, linear(bp["mlp"]["fc"], layer_norm(xp, bp["ln2"], x))))
    logits = linear(p["head"], layer_norm(xp, p["ln_f"], x))
    vocab = logits.shape[-1]
    return xp.cross_entropy(xp.reshape(logits, (B * T, vocab)), xp.reshape(targets, (B * T,)))


def init(cfg, dtype, rng, std=0.02):
    """nn.GPT's parameter tree for config `cfg`: weights ~ N(0, std), biases 0, norms (1, 0)."""
    C = cfg["d_model"]

    def normal(*shape):
        return (rng.standard_normal(shape) * std).astype(dtype)

    def lin(n_in, n_out, bias=True):
        return {"w": normal(n_in, n_out), "b": np.zeros(n_out, dtype)} if bias else {"w": normal(n_in, n_out)}

    def norm():
        return {"g": np.ones(C, dtype), "b": np.zeros(C, dtype)}

    def block():
        return {"ln1": norm(), "attn": {"qkv": lin(C, 3 * C, cfg.get("qkv_bias", True)), "proj": lin(C, C)},
                "ln2": norm(), "mlp": {"fc": lin(C, 4 * C), "proj": lin(4 * C, C)}}
    return {"wte": {"w": normal(cfg["vocab_size"], C)}, "wpe": {"w": normal(cfg["block_size"], C)},
            "blocks": [block() for _ in range(cfg["n_layer"])], "ln_f": norm(),
            "head": lin(C, cfg["vocab_size"], cfg.get("head_bias", False))}


def train(cfg, dtype, batch, lr, seed=0):
    """One SGD step of the GPT `cfg` (nn.GPT's keyword arguments) on `batch` = (idx, targets)."""
    params = init(cfg, dtype, np.random.default_rng(seed))

    def nn_loss():
        from burjit import nn, pytree
        model = nn.GPT(**cfg, dtype=dtype)
        (want, want_def), (have, have_def) = pytree.flatten(model.init(0)), pytree.flatten(params)
        if want_def != have_def or [a.shape for a in want] != [a.shape for a in have]:
            raise AssertionError("the workload's parameters are not in nn.GPT's layout")
        return lambda xp, p, batch: model.loss(p, *batch)
    twin = functools.partial(gpt_loss, n_head=cfg["n_head"], activation=cfg.get("activation", "gelu"))
    return Train(twin, params, batch, lr, own={"burjit": nn_loss})


def text():
    """A few kB of English that every Python ships (json's module docstring)."""
    return json.__doc__


def cases(quick):
    return [{"batch": BATCH}]


def make(case, dtype):
    chars = sorted(set(text()))
    ids = np.array([chars.index(c) for c in text()])
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(ids) - CONFIG["block_size"] - 1, case["batch"])
    window = np.stack([ids[s:s + CONFIG["block_size"] + 1] for s in starts])
    batch = (window[:, :-1].copy(), window[:, 1:].copy())  # fresh arrays, as a loader's
    return train({**CONFIG, "vocab_size": len(chars)}, dtype, batch, LR)
