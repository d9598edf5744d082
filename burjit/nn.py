"""Functional layers: a layer object holds only its configuration; parameters are plain dicts.

`layer.init(seed)` returns a pytree (nested dicts/lists) of numpy arrays, drawn from
`numpy.random.default_rng(seed)` (or a Generator you pass), so the same seed gives the same
model on every machine. `layer(params, x)` computes the output with burjit.ops, so it works
inside a compiled step (gradients included) and nothing is hidden in the layer object:
what you donate, save and optimise is exactly the dict you hold.
"""

import contextlib
import json
import math
import os
import secrets
import zipfile
import zlib

import numpy as np

from . import ops as F
from . import pytree, random
from .ops import cross_entropy, mse
from .tracer import describe, user_src

__all__ = ["Linear", "Embedding", "LayerNorm", "CausalSelfAttention", "MLP", "Block", "GPT",
           "cross_entropy", "mse", "save", "load", "load_meta", "state_dict", "count_params", "from_torch", "dropout"]


def _rng(seed):
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _under(prefix, path, layer):
    """A sub-layer's torch names (see from_torch), its paths under `path`, its names under `prefix`."""
    return {path + p: (f"{prefix}.{name}", t) for p, (name, t) in layer.torch_names().items()}


def dropout(key, x, rate, train=True):
    """Zero each element with probability `rate` and scale the rest by 1 / (1 - rate), so the
    expectation is x (inverted dropout, as torch); the identity when not training. `key` is a
    burjit.random key (split a fresh one per step); train and rate are static Python values."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"{describe(user_src())}\n  dropout: rate must lie in [0, 1), got {rate!r}")
    if not train or rate == 0.0:
        return x
    x = F.lift(x)
    keep = random.bernoulli(key, 1.0 - rate, x.shape)
    return F.where(keep, x * (1.0 / (1.0 - rate)), 0.0)


class Linear:
    """y = x @ w + b with w of shape (n_in, n_out); weights ~ N(0, std), std = 1/sqrt(n_in) unless given."""

    def __init__(self, n_in, n_out, bias=True, std=None, dtype="float32"):
        self.n_in, self.n_out, self.bias, self.dtype = n_in, n_out, bias, dtype
        self.std = n_in ** -0.5 if std is None else std

    def init(self, seed):
        p = {"w": (_rng(seed).standard_normal((self.n_in, self.n_out)) * self.std).astype(self.dtype)}
        if self.bias:
            p["b"] = np.zeros(self.n_out, self.dtype)
        return p

    def torch_names(self):
        """Each leaf's key path -> (its name in torch.nn.Linear's state_dict, stored transposed?):
        torch keeps weight as (n_out, n_in)."""
        return {("w",): ("weight", True), **({("b",): ("bias", False)} if self.bias else {})}

    def __call__(self, p, x):
        y = x @ p["w"]
        return y + p["b"] if self.bias else y


class Embedding:
    """Row lookup in a (num, dim) table; indices must lie in [0, num) (checked at run time)."""

    def __init__(self, num, dim, std=0.02, dtype="float32"):
        self.num, self.dim, self.std, self.dtype = num, dim, std, dtype

    def init(self, seed):
        return {"w": (_rng(seed).standard_normal((self.num, self.dim)) * self.std).astype(self.dtype)}

    def torch_names(self):
        return {("w",): ("weight", False)}

    def __call__(self, p, idx):
        return F.embedding(p["w"], idx)


class LayerNorm:
    """Normalise the last axis to zero mean and unit variance, then scale and shift."""

    def __init__(self, dim, eps=1e-5, dtype="float32"):
        self.dim, self.eps, self.dtype = dim, eps, dtype

    def init(self, seed=None):
        return {"g": np.ones(self.dim, self.dtype), "b": np.zeros(self.dim, self.dtype)}

    def torch_names(self):
        return {("g",): ("weight", False), ("b",): ("bias", False)}

    def __call__(self, p, x):
        return F.layer_norm(x, p["g"], p["b"], self.eps)


class CausalSelfAttention:
    """Multi-head self-attention over (B, T, C) where position t only sees positions <= t.

    q, k and v come from one Linear(d_model, 3 * d_model): its column blocks are the per-head
    projections, so qkv_bias=False is the same model as bias-free key/query/value layers per head.
    """

    def __init__(self, d_model, n_head, proj_std=None, qkv_bias=True, dtype="float32"):
        if d_model % n_head:
            raise ValueError(f"d_model {d_model} is not divisible by n_head {n_head}")
        self.n_head = n_head
        self.qkv = Linear(d_model, 3 * d_model, bias=qkv_bias, dtype=dtype)
        self.proj = Linear(d_model, d_model, std=proj_std, dtype=dtype)

    def init(self, seed):
        rng = _rng(seed)
        return {"qkv": self.qkv.init(rng), "proj": self.proj.init(rng)}

    def torch_names(self):  # nanoGPT's CausalSelfAttention
        return {**_under("c_attn", ("qkv",), self.qkv), **_under("c_proj", ("proj",), self.proj)}

    def __call__(self, p, x):
        B, T, C = x.shape
        H, hd = self.n_head, C // self.n_head
        qkv = self.qkv(p["qkv"], x)
        q, k, v = (F.transpose(F.reshape(qkv[:, :, i * C:(i + 1) * C], (B, T, H, hd)), (0, 2, 1, 3))
                   for i in range(3))
        att = (q * (1.0 / math.sqrt(hd))) @ F.transpose(k, (0, 1, 3, 2))  # scale the smaller tensor
        row = F.reshape(F.arange(T), (T, 1))
        col = F.reshape(F.arange(T), (1, T))
        att = F.softmax(F.where(col <= row, att, -1e9), -1)  # finite fill: no inf - inf in softmax
        y = F.reshape(F.transpose(att @ v, (0, 2, 1, 3)), (B, T, C))
        return self.proj(p["proj"], y)


ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}  # by name, so a model's config stays JSON


class MLP:
    """Position-wise feed-forward: Linear(d, hidden) -> activation (GELU or ReLU) -> Linear(hidden, d)."""

    def __init__(self, d_model, hidden=None, proj_std=None, activation="gelu", dtype="float32"):
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
        hidden = hidden or 4 * d_model
        self.act = ACTIVATIONS[activation]
        self.fc = Linear(d_model, hidden, dtype=dtype)
        self.proj = Linear(hidden, d_model, std=proj_std, dtype=dtype)

    def init(self, seed):
        rng = _rng(seed)
        return {"fc": self.fc.init(rng), "proj": self.proj.init(rng)}

    def torch_names(self):
        return {**_under("c_fc", ("fc",), self.fc), **_under("c_proj", ("proj",), self.proj)}

    def __call__(self, p, x):
        return self.proj(p["proj"], self.act(self.fc(p["fc"], x)))


class Block:
    """Pre-norm transformer block: x + attn(ln(x)), then + mlp(ln(x))."""

    def __init__(self, d_model, n_head, proj_std=None, qkv_bias=True, activation="gelu", dtype="float32"):
        self.ln1, self.ln2 = LayerNorm(d_model, dtype=dtype), LayerNorm(d_model, dtype=dtype)
        self.attn = CausalSelfAttention(d_model, n_head, proj_std, qkv_bias, dtype)
        self.mlp = MLP(d_model, proj_std=proj_std, activation=activation, dtype=dtype)

    def init(self, seed):
        rng = _rng(seed)
        return {"ln1": self.ln1.init(), "attn": self.attn.init(rng), "ln2": self.ln2.init(),
                "mlp": self.mlp.init(rng)}

    def torch_names(self):
        return {**_under("ln_1", ("ln1",), self.ln1), **_under("attn", ("attn",), self.attn),
                **_under("ln_2", ("ln2",), self.ln2), **_under("mlp", ("mlp",), self.mlp)}

    def __call__(self, p, x):
        x = x + self.attn(p["attn"], self.ln1(p["ln1"], x))
        return x + self.mlp(p["mlp"], self.ln2(p["ln2"], x))


class GPT:
    """A GPT-2-style decoder: token + position embeddings, n_layer blocks, final norm, vocab head.

    Residual output projections start at std 1/sqrt(2 * n_layer * d_model), as in GPT-2, so
    the residual stream's variance does not grow with depth at init. The defaults are GPT-2's
    choices; qkv_bias=False, activation="relu", head_bias=True give the "Let's build GPT" /
    BurTorch variant (bias-free q/k/v, ReLU MLP, a vocab head with bias).
    """

    def __init__(self, vocab_size, block_size, n_layer=2, n_head=4, d_model=64, dtype="float32",
                 qkv_bias=True, activation="gelu", head_bias=False):
        self.config = dict(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                           d_model=d_model, dtype=dtype, qkv_bias=qkv_bias, activation=activation,
                           head_bias=head_bias)
        self.block_size = block_size
        self.wte = Embedding(vocab_size, d_model, dtype=dtype)
        self.wpe = Embedding(block_size, d_model, dtype=dtype)
        proj_std = (2 * n_layer * d_model) ** -0.5
        self.blocks = [Block(d_model, n_head, proj_std, qkv_bias, activation, dtype) for _ in range(n_layer)]
        self.ln_f = LayerNorm(d_model, dtype=dtype)
        self.head = Linear(d_model, vocab_size, bias=head_bias, std=0.02, dtype=dtype)  # near-uniform start

    def init(self, seed):
        rng = _rng(seed)
        return {"wte": self.wte.init(rng), "wpe": self.wpe.init(rng),
                "blocks": [b.init(rng) for b in self.blocks], "ln_f": self.ln_f.init(),
                "head": self.head.init(rng)}

    def torch_names(self):
        """nanoGPT's names (transformer.h.0.attn.c_attn.weight, ..., lm_head.weight)."""
        blocks = {k: v for i, b in enumerate(self.blocks) for k, v in _under(f"transformer.h.{i}", ("blocks", i), b).items()}
        return {**_under("transformer.wte", ("wte",), self.wte), **_under("transformer.wpe", ("wpe",), self.wpe),
                **blocks, **_under("transformer.ln_f", ("ln_f",), self.ln_f), **_under("lm_head", ("head",), self.head)}

    def __call__(self, p, idx):
        """Logits (B, T, vocab_size) for integer tokens idx of shape (B, T), T <= block_size."""
        T = idx.shape[-1]
        if T > self.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.block_size}")
        x = self.wte(p["wte"], idx) + self.wpe(p["wpe"], F.arange(T))
        for block, bp in zip(self.blocks, p["blocks"]):
            x = block(bp, x)
        return self.head(p["head"], self.ln_f(p["ln_f"], x))

    def loss(self, p, idx, targets):
        """Mean next-token cross-entropy."""
        return cross_entropy(self(p, idx), targets)


# -- saving and loading ----------------------------------------------------------------------

_META = "__meta__"  # the entry that holds save's `meta`


def _named_leaves(tree, sep="/"):
    """(name, leaf) pairs in flatten order, a name being the leaf's key path joined by `sep`
    ('blocks/0/attn/qkv/w'). Keys that could make two leaves share a name are refused, so a
    checkpoint never hands one leaf's array to another."""
    leaves, treedef = pytree.flatten(tree)
    owners, named = {}, []
    for path, leaf in zip(pytree.leaf_paths(treedef), leaves):
        for k in path:
            if not isinstance(k, (str, int)):
                raise ValueError(f"cannot name the leaf at {list(path)}: key {k!r} is a "
                                 f"{type(k).__name__}; keys must be str or int")
            if sep in str(k) or "\0" in str(k):
                raise ValueError(f"cannot name the leaf at {list(path)}: key {k!r} contains "
                                 f"{sep!r} (the path separator) or NUL")
        name = sep.join(map(str, path))
        if name in owners or name == _META:
            other = "the metadata" if name == _META else f"the leaf at {list(owners[name])}"
            raise ValueError(f"the leaf at {list(path)} and {other} would both be stored as {name!r}")
        owners[name] = path
        named.append((name, leaf))
    return named


def state_dict(params):
    """{dotted name: array} in flatten order, as torch's state_dict names them ('blocks.0.attn.qkv.w')."""
    return dict(_named_leaves(params, "."))


def count_params(params):
    """The number of scalars in a parameter tree."""
    return int(sum(np.size(leaf) for leaf in pytree.flatten(params)[0]))


def from_torch(model, torch_state_dict, strict=True):
    """Parameters for `model` (Linear, Embedding, LayerNorm, ..., GPT) from the state_dict of the
    equivalent torch model (torch.nn.Linear etc.; nanoGPT's names for GPT), in the model's dtype.

    Every parameter must be there with its shape (Linear weights come transposed: torch stores
    (n_out, n_in)). strict: no other entries either (nanoGPT's causal-mask buffers `attn.bias`,
    say; pass strict=False to ignore them). Tensors or numpy arrays; torch is not imported.
    """
    names = model.torch_names()
    sd = {k: np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v) for k, v in torch_state_dict.items()}
    missing = sorted(name for name, _ in names.values() if name not in sd)
    unexpected = sorted(set(sd) - {name for name, _ in names.values()}) if strict else []
    if missing or unexpected:
        raise ValueError(f"the state dict does not match {type(model).__name__}: missing {missing}, "
                         f"unexpected {unexpected}")
    like = model.init(0)
    leaves, treedef = pytree.flatten(like)
    out = []
    for path, leaf in zip(pytree.leaf_paths(treedef), leaves):
        name, transposed = names[path]
        a = sd[name].T if transposed else sd[name]
        if a.shape != leaf.shape:
            raise ValueError(f"{name} is {sd[name].shape}; {type(model).__name__} wants "
                             f"{leaf.shape[::-1] if transposed else leaf.shape}")
        out.append(np.ascontiguousarray(a, dtype=leaf.dtype))
    return pytree.unflatten(treedef, out)


def save(path, tree, meta=None):
    """Write a pytree of arrays to exactly `path` (no suffix is added) as an .npz: one .npy entry
    per leaf, named by its key path, plus `meta` as JSON (so tuples come back as lists).

    The file is written next to `path` and renamed over it only once complete, so a failed or
    interrupted save leaves the previous checkpoint intact.
    """
    arrays = []
    for name, leaf in _named_leaves(tree):
        a = np.asarray(leaf)
        if a.dtype.hasobject:  # load could not read it back without pickle
            raise ValueError(f"leaf {name!r} ({type(leaf).__name__}) is not an array of numbers or strings")
        arrays.append((name, a))
    arrays.append((_META, np.array(json.dumps({} if meta is None else meta))))
    path = os.fspath(path)
    tmp = f"{path}.tmp-{secrets.token_hex(4)}"
    try:
        with open(tmp, "xb") as f:
            with zipfile.ZipFile(f, "w", allowZip64=True) as z:
                for name, a in arrays:
                    with z.open(name + ".npy", "w", force_zip64=True) as entry:
                        np.lib.format.write_array(entry, a, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the rename makes it the checkpoint
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C included: never leave a half-written temporary behind
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def load_meta(path):
    """Only the `meta` that save stored: enough to rebuild the model before loading its arrays."""
    return _read(path)[1]


def load(path, like):
    """Read what `save` wrote into a pytree shaped like `like`, checking every name, shape and dtype.

    Returns (tree, meta). The template makes a stale or foreign file fail loudly, not half-load.
    A missing file raises FileNotFoundError; one that save could not have written, ValueError.
    """
    stored, meta = _read(path)
    named = _named_leaves(like)
    want = {name for name, _ in named}
    if set(stored) != want:
        raise ValueError(f"{path}: entries do not match the model: missing {sorted(want - set(stored))}, "
                         f"unexpected {sorted(set(stored) - want)}")
    for name, leaf in named:
        a, b = stored[name], np.asarray(leaf)
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"{path}: {name} is {a.shape} {a.dtype}, the model wants {b.shape} {b.dtype}")
    return pytree.unflatten(pytree.flatten(like)[1], [stored[name] for name, _ in named]), meta


def _read(path):
    """({name: array}, meta) from the zip's entries themselves: numpy's npz reader also answers
    'a.npy' with the entry 'a', which would hand a leaf the wrong array."""
    with open(path, "rb") as f:
        try:
            stored = {}
            with zipfile.ZipFile(f) as z:
                for member in z.namelist():
                    name = member.removesuffix(".npy")
                    if name == member or name in stored:
                        raise ValueError(f"unexpected entry {member!r}")
                    with z.open(member) as entry:
                        stored[name] = np.lib.format.read_array(entry, allow_pickle=False)
            text = stored.pop(_META, np.array("{}"))
            if text.shape != () or text.dtype.kind != "U":
                raise ValueError(f"{_META!r} is not a JSON string")
            return stored, json.loads(str(text))
        except (zipfile.BadZipFile, ValueError, EOFError, OSError, zlib.error, NotImplementedError) as e:
            raise ValueError(f"{path} is not a checkpoint written by burjit.nn.save ({e})") from e
