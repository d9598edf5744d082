"""Every layer, the GPT included, against a plain numpy twin: forward values and gradients.

Gradients are checked with the probe sum(layer(p, x) * w) for random weights w: for every
parameter leaf (and a float input), burjit's gradient dotted with a random direction must
equal the central finite difference of the numpy twin along that direction (float64). The
twins are written independently of burjit.nn (np.split for q/k/v, a -inf tril mask, numpy
fancy indexing for embeddings), so a shared mistake is unlikely. Last, save/load: exact paths,
exact arrays, and loud failures.
"""

import functools
import os
import zipfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import burjit
from burjit import nn
from burjit import ops as F


# -- numpy twins ------------------------------------------------------------------------------

def np_linear(p, x):
    return x @ p["w"] + p["b"] if "b" in p else x @ p["w"]


def np_layernorm(p, x, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p["g"] + p["b"]


def np_gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_attention(p, x, n_head):
    B, T, C = x.shape
    heads = [a.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)
             for a in np.split(np_linear(p["qkv"], x), 3, axis=-1)]
    q, k, v = heads
    att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(C // n_head)
    att = np.where(np.tril(np.ones((T, T), bool)), att, -np.inf)
    y = (np_softmax(att) @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    return np_linear(p["proj"], y)


NP_ACTIVATIONS = {"gelu": np_gelu, "relu": lambda x: np.maximum(x, 0.0)}


def np_mlp(p, x, activation):
    return np_linear(p["proj"], NP_ACTIVATIONS[activation](np_linear(p["fc"], x)))


def np_block(p, x, n_head, activation):
    x = x + np_attention(p["attn"], np_layernorm(p["ln1"], x), n_head)
    return x + np_mlp(p["mlp"], np_layernorm(p["ln2"], x), activation)


def np_gpt(p, idx, n_head, activation):
    x = p["wte"]["w"][idx] + p["wpe"]["w"][:idx.shape[-1]]
    for bp in p["blocks"]:
        x = np_block(bp, x, n_head, activation)
    return np_linear(p["head"], np_layernorm(p["ln_f"], x))


# kind: (layer from a hashable config, numpy twin taking that config, input maker)
LAYERS = {
    "linear": (lambda n_in, n_out, bias: nn.Linear(n_in, n_out, bias, dtype="float64"),
               lambda cfg, p, x: np_linear(p, x)),
    "embedding": (lambda num, dim: nn.Embedding(num, dim, std=1.0, dtype="float64"),
                  lambda cfg, p, idx: p["w"][idx]),
    "layernorm": (lambda dim: nn.LayerNorm(dim, dtype="float64"), lambda cfg, p, x: np_layernorm(p, x)),
    "attention": (lambda d, h, qkv_bias: nn.CausalSelfAttention(d, h, qkv_bias=qkv_bias, dtype="float64"),
                  lambda cfg, p, x: np_attention(p, x, cfg[1])),
    "mlp": (lambda d, act: nn.MLP(d, activation=act, dtype="float64"), lambda cfg, p, x: np_mlp(p, x, cfg[1])),
    "block": (lambda d, h, qkv_bias, act: nn.Block(d, h, qkv_bias=qkv_bias, activation=act, dtype="float64"),
              lambda cfg, p, x: np_block(p, x, cfg[1], cfg[3])),
    "gpt": (lambda v, t, n_layer, h, d, qkv_bias, act, head_bias: nn.GPT(
                v, t, n_layer, h, d, dtype="float64", qkv_bias=qkv_bias, activation=act, head_bias=head_bias),
            lambda cfg, p, idx: np_gpt(p, idx, cfg[3], cfg[6])),
}

# A few configs and input shapes per kind, so a compiling backend builds only a few programs.
CASES = {
    "linear": [((3, 2, True), (4, 3)), ((2, 1, False), (2, 3, 2)), ((1, 2, True), (1,))],
    "embedding": [((5, 3), (4,)), ((3, 2), (2, 3))],
    "layernorm": [((3,), (2, 3)), ((4,), (2, 2, 4))],
    "attention": [((4, 2, True), (2, 3, 4)), ((2, 1, True), (1, 1, 2)), ((4, 2, False), (2, 3, 4))],
    "mlp": [((2, "gelu"), (3, 2)), ((2, "relu"), (3, 2))],
    "block": [((4, 2, True, "gelu"), (1, 3, 4)), ((4, 2, False, "relu"), (1, 3, 4))],
    "gpt": [((7, 4, 2, 2, 8, True, "gelu", False), (2, 3)), ((7, 4, 2, 2, 8, False, "relu", True), (2, 3))],
}


@functools.cache
def _probe(kind, backend):
    """Compiled (probe loss, grads) for one layer kind; the config is static."""
    make = LAYERS[kind][0]

    def run(cfg, p, x, w):
        layer = make(*cfg)
        if x.dtype.startswith("int"):
            return burjit.value_and_grad(lambda p: F.sum(layer(p, x) * w))(p), None
        (loss, (gp, gx)) = burjit.value_and_grad(lambda p, x: F.sum(layer(p, x) * w), (0, 1))(p, x)
        return (loss, gp), gx
    return burjit.compile(run, backend=backend, static_argnums=0)


def _fd_check(f, x, g, rng, eps=1e-6):
    """<g, d> equals the central difference of f along a random direction d."""
    d = rng.standard_normal(x.shape)
    fd = (f(x + eps * d) - f(x - eps * d)) / (2 * eps)
    np.testing.assert_allclose(np.sum(g * d), fd, rtol=1e-5, atol=1e-7)


def _check_layer(kind, case, seed, backend):
    (cfg, x_shape), rng = CASES[kind][case], np.random.default_rng(seed)
    make, twin = LAYERS[kind]
    p = make(*cfg).init(seed)
    # Random (not init-default) values everywhere, so zero biases or unit gains hide nothing.
    p = burjit.pytree.tree_map(lambda a: rng.standard_normal(a.shape), p)
    x = rng.integers(0, cfg[0], x_shape) if kind in ("embedding", "gpt") else rng.standard_normal(x_shape)
    out = twin(cfg, p, x)
    w = rng.standard_normal(out.shape)
    (loss, gp), gx = _probe(kind, backend)(cfg, p, x, w)
    np.testing.assert_allclose(loss, np.sum(out * w), rtol=1e-9, atol=1e-9)

    leaves, td = burjit.pytree.flatten(p)
    for i, (leaf, g) in enumerate(zip(leaves, burjit.pytree.flatten(gp)[0])):
        def f(v, i=i):
            return np.sum(twin(cfg, burjit.pytree.unflatten(td, leaves[:i] + [v] + leaves[i + 1:]), x) * w)
        _fd_check(f, leaf, g, rng)
    if gx is not None:
        _fd_check(lambda v: np.sum(twin(cfg, p, v) * w), x, gx, rng)


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_layer_matches_numpy_twin_and_finite_differences(kind, backend):
    @given(case=st.integers(0, len(CASES[kind]) - 1), seed=st.integers(0, 2 ** 32 - 1))
    def check(case, seed):
        _check_layer(kind, case, seed, backend)
    check()


def test_init_is_deterministic_per_seed():
    m = nn.GPT(11, 8, n_layer=1, n_head=2, d_model=8)
    a, b, c = m.init(3), m.init(3), m.init(4)
    eq = [np.array_equal(x, y) for x, y in zip(burjit.pytree.flatten(a)[0], burjit.pytree.flatten(b)[0])]
    assert all(eq)
    assert not np.array_equal(a["wte"]["w"], c["wte"]["w"])
    assert all(x.dtype == np.float32 for x in burjit.pytree.flatten(a)[0])


def test_bias_options_shape_the_parameter_tree():
    """BurTorch's mini GPT (bias-free q/k/v, ReLU MLP, head with bias) has its published 46,337 parameters."""
    m = nn.GPT(65, 8, n_layer=6, n_head=6, d_model=24, qkv_bias=False, activation="relu", head_bias=True)
    p = m.init(0)
    assert "b" not in p["blocks"][0]["attn"]["qkv"] and "b" in p["head"]
    assert sum(a.size for a in burjit.pytree.flatten(p)[0]) == 46337
    assert "b" in nn.GPT(5, 4, n_layer=1, n_head=1, d_model=4).init(0)["blocks"][0]["attn"]["qkv"]


def test_bad_configs_fail_clearly():
    with pytest.raises(ValueError, match="divisible"):
        nn.CausalSelfAttention(6, 4)
    with pytest.raises(ValueError, match="unknown activation 'tanh'"):
        nn.MLP(4, activation="tanh")
    m = nn.GPT(5, 4, n_layer=1, n_head=1, d_model=4)
    step = burjit.compile(m, backend="reference")
    with pytest.raises(ValueError, match="block_size"):
        step(m.init(0), np.zeros((1, 5), np.int64))


@functools.cache
def _loss_grad(name, backend):
    return burjit.compile(burjit.value_and_grad(getattr(nn, name)), backend=backend)


def test_losses_have_exact_gradients_even_for_huge_logits(backend):
    """d CE / d logits = (softmax - one_hot) / N and d MSE / d pred = 2 (pred - target) / size, in closed form."""
    @given(seed=st.integers(0, 2 ** 32 - 1), scale=st.sampled_from([1.0, 1e3]))
    def check(seed, scale):
        rng = np.random.default_rng(seed)
        z, y = scale * rng.standard_normal((3, 5)), rng.integers(0, 5, 3)
        loss, g = _loss_grad("cross_entropy", backend)(z, y)
        log_p = z - z.max(-1, keepdims=True)
        log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
        np.testing.assert_allclose(loss, -log_p[np.arange(3), y].mean(), rtol=1e-12)
        np.testing.assert_allclose(g, (np.exp(log_p) - np.eye(5)[y]) / 3, atol=1e-12)
        pred, target = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
        loss, g = _loss_grad("mse", backend)(pred, target)
        np.testing.assert_allclose(loss, ((pred - target) ** 2).mean(), rtol=1e-12)
        np.testing.assert_allclose(g, 2 * (pred - target) / 6, rtol=1e-12)
    check()


# -- save and load ----------------------------------------------------------------------------

def _same_tree(a, b):
    (la, ta), (lb, tb) = burjit.pytree.flatten(a), burjit.pytree.flatten(b)
    return ta == tb and all(np.asarray(x).dtype == y.dtype and np.asarray(x).shape == y.shape
                            and np.asarray(x).tobytes() == y.tobytes() for x, y in zip(la, lb))


def test_save_writes_exactly_the_given_path_and_load_round_trips(tmp_path):
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
            "layers": [{"b": np.int64(7)}, None, (np.array("hé"), np.float16(0.5))]}
    nn.save(tmp_path / "ck", tree, {"step": 3, "vocab": "ab"})
    assert os.listdir(tmp_path) == ["ck"]  # no ck.npz, no temporary left behind
    got, meta = nn.load(str(tmp_path / "ck"), like=tree)
    assert meta == {"step": 3, "vocab": "ab"} == nn.load_meta(tmp_path / "ck")
    assert _same_tree(tree, got)


def test_names_numpy_would_confuse_round_trip(tmp_path):
    # np.load answers "a.npy" with the entry "a"; np.savez takes "file" and "allow_pickle" as its own arguments
    tree = {"a": np.zeros(2), "a.npy": np.ones(2), "file": np.full(1, 2.0), "allow_pickle": np.full(4, 3.0),
            "": {"": np.arange(2)}, 5: [np.arange(3)]}
    nn.save(tmp_path / "ck.npz", tree)
    assert _same_tree(tree, nn.load(tmp_path / "ck.npz", like=tree)[0])


@pytest.mark.parametrize("tree, message", [
    ({"a/b": np.zeros(1), "a": {"b": np.ones(1)}}, r"key 'a/b' contains '/'"),
    ({"a\0": np.zeros(1)}, "NUL"),
    ({1: np.zeros(1), "1": np.ones(1)}, r"the leaf at \['1'\] and the leaf at \[1\] would both be stored as '1'"),
    ({"__meta__": np.zeros(1)}, "the metadata would both be stored as '__meta__'"),
    ({(1, 2): np.zeros(1)}, r"key \(1, 2\) is a tuple; keys must be str or int"),
    ({"p": [object()]}, r"leaf 'p/0' \(object\) is not an array of numbers or strings"),
], ids=["separator", "nul", "int-and-str", "reserved", "tuple-key", "object-leaf"])
def test_save_refuses_names_that_would_not_load_back(tmp_path, tree, message):
    with pytest.raises(ValueError, match=message):
        nn.save(tmp_path / "ck", tree)
    assert os.listdir(tmp_path) == []


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ck.npz"
    nn.save(path, {"w": np.zeros(3)}, {"step": 1})

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(np.lib.format, "write_array", disk_full)
    with pytest.raises(OSError, match="No space"):
        nn.save(path, {"w": np.ones(3)}, {"step": 2})
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ck.npz"]
    tree, meta = nn.load(path, like={"w": np.ones(3)})
    assert meta == {"step": 1} and not tree["w"].any()


def test_load_fails_clearly_on_missing_and_corrupt_files(tmp_path):
    like = {"w": np.zeros(100)}
    with pytest.raises(FileNotFoundError):
        nn.load(tmp_path / "missing", like=like)
    nn.save(tmp_path / "ck", like)
    raw = (tmp_path / "ck").read_bytes()
    (tmp_path / "cut").write_bytes(raw[:len(raw) // 2])
    (tmp_path / "junk").write_bytes(b"not a checkpoint")
    with zipfile.ZipFile(tmp_path / "odd", "w") as z:
        z.writestr("w.txt", "hello")
    for name in ("cut", "junk", "odd"):
        with pytest.raises(ValueError, match="is not a checkpoint written by burjit.nn.save"):
            nn.load(tmp_path / name, like=like)


# -- names, sizes and torch state dicts -------------------------------------------------------

def test_state_dict_names_and_count_params():
    model = nn.GPT(11, 4, n_layer=2, n_head=2, d_model=8)
    params = model.init(0)
    sd = nn.state_dict(params)
    assert list(sd)[:2] == ["blocks.0.attn.proj.b", "blocks.0.attn.proj.w"]  # flatten order: sorted keys
    assert {"wte.w", "wpe.w", "blocks.1.ln1.g", "blocks.1.attn.qkv.b", "ln_f.b", "head.w"} <= set(sd)
    assert all(sd[name] is leaf for name, leaf in zip(sd, burjit.pytree.flatten(params)[0]))
    # embeddings, then per block: 2 LayerNorms, qkv and proj with biases, fc and proj with biases
    d, per_block = 8, 2 * 16 + (8 * 24 + 24) + (8 * 8 + 8) + (8 * 32 + 32) + (32 * 8 + 8)
    assert nn.count_params(params) == 11 * d + 4 * d + 2 * per_block + 2 * d + d * 11
    with pytest.raises(ValueError, match="contains '.'"):
        nn.state_dict({"a.b": np.zeros(1)})


def _torch_gpt(torch, vocab, block, n_layer, n_head, d):
    """nanoGPT's module tree (names and layouts), GELU with the tanh approximation as burjit's."""
    tnn = torch.nn

    class Attention(tnn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = tnn.Linear(d, 3 * d), tnn.Linear(d, d)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in self.c_attn(x).split(d, dim=2))
            att = (q @ k.transpose(-2, -1)) / (C // n_head) ** 0.5
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).tril().logical_not(), float("-inf"))
            return self.c_proj((att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))

    class Block(tnn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = tnn.LayerNorm(d), Attention(), tnn.LayerNorm(d)
            self.mlp = tnn.Module()
            self.mlp.c_fc, self.mlp.c_proj = tnn.Linear(d, 4 * d), tnn.Linear(4 * d, d)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp.c_proj(tnn.functional.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = tnn.ModuleDict(dict(wte=tnn.Embedding(vocab, d), wpe=tnn.Embedding(block, d),
                                                   h=tnn.ModuleList(Block() for _ in range(n_layer)),
                                                   ln_f=tnn.LayerNorm(d)))
            self.lm_head = tnn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            t = self.transformer
            x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))
            for b in t.h:
                x = b(x)
            return self.lm_head(t.ln_f(x))

    torch.manual_seed(0)
    return GPT().double()


def test_from_torch_gpt_gives_torch_logits():
    torch = pytest.importorskip("torch")
    tm = _torch_gpt(torch, 13, 6, 2, 2, 8)
    with torch.no_grad():  # LayerNorm starts at (1, 0): move it, so a swapped weight/bias would show
        for m in tm.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5), m.bias.uniform_(-0.5, 0.5)
    model = nn.GPT(13, 6, n_layer=2, n_head=2, d_model=8, dtype="float64")
    params = nn.from_torch(model, tm.state_dict())
    assert nn.count_params(params) == sum(p.numel() for p in tm.parameters())
    idx = np.random.default_rng(0).integers(0, 13, (3, 6))
    want = tm(torch.tensor(idx)).detach().numpy()
    np.testing.assert_allclose(burjit.compile(model)(params, idx), want, rtol=1e-10, atol=1e-12)


def test_from_torch_layers_and_errors():
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(3, 4).double()
    x = np.random.default_rng(1).standard_normal((2, 3))
    p = nn.from_torch(nn.Linear(3, 4, dtype="float64"), lin.state_dict())
    np.testing.assert_allclose(np_linear(p, x), lin(torch.tensor(x)).detach().numpy(), rtol=1e-12)
    emb = torch.nn.Embedding(5, 2)
    p = nn.from_torch(nn.Embedding(5, 2), emb.state_dict())
    assert p["w"].dtype == np.float32 and np.array_equal(p["w"], emb.weight.detach().numpy())
    with pytest.raises(ValueError, match=r"missing \['bias'\], unexpected \[\]"):
        nn.from_torch(nn.Linear(3, 4), torch.nn.Linear(3, 4, bias=False).state_dict())
    with pytest.raises(ValueError, match=r"missing \[\], unexpected \['extra'\]"):
        nn.from_torch(nn.Embedding(5, 2), {**emb.state_dict(), "extra": torch.zeros(1)})
    assert nn.from_torch(nn.Embedding(5, 2), {**emb.state_dict(), "extra": torch.zeros(1)}, strict=False)
    with pytest.raises(ValueError, match=r"weight is \(4, 3\); Linear wants \(3, 4\)"):  # torch's layout
        nn.from_torch(nn.Linear(4, 3, bias=False), torch.nn.Linear(3, 4, bias=False).state_dict())
    with pytest.raises(ValueError, match=r"weight is \(5, 2\); Embedding wants \(5, 3\)"):
        nn.from_torch(nn.Embedding(5, 3), emb.state_dict())
