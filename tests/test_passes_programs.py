"""Random programs and real models for the pass tests, and the differential test of every pass
configuration against the unpassed graph (the other test_passes_* files import from here)."""

import os

import numpy as np
import pytest
from hypothesis import given, strategies as st

import burjit
from burjit import nn, ops as F
from burjit.errors import ShapeError
from burjit.passes import pipeline

CONFIGS = [list(pipeline.PASSES)] + [[p for p in pipeline.PASSES if p != off] for off in pipeline.PASSES]


def traced(fn, args, donate=()):
    """The raw graph (no passes) of fn(*args), and the flat inputs it takes."""
    graph = burjit.compile(fn, backend="reference", passes=[], donate_argnums=donate).graph(*args)
    leaves = [leaf for a in args for leaf in burjit.pytree.flatten(a)[0]]
    return graph, [np.asarray(x) for x in leaves]


# -- random programs: a pool of values grown by random ops, trained one SGD step -------------------

_UNARY = [F.tanh, F.sigmoid, F.relu, F.negative, F.stop_gradient, lambda u: u * 1.0, lambda u: u + 0.0,
          lambda u: F.exp(F.tanh(u)), lambda u: u * u, lambda u: -(-u),
          lambda u: u * -0.0 + 0.0]  # +0.0 only if x + 0.0 is kept and the zeros are not merged
_BINARY = [F.add, F.subtract, F.multiply, F.maximum, lambda u, v: u / (1.0 + v * v), lambda u, v: 0.0 + u - 0.0]


def _apply(kind, u, v, k):
    try:
        if kind == "unary":
            return _UNARY[k % len(_UNARY)](u)
        if kind == "binary":
            return _BINARY[k % len(_BINARY)](u, v)
        if kind == "reduce" and u.ndim:
            return (F.sum if k % 2 else F.max)(u, k % u.ndim, keepdims=bool(k % 3))
        if kind == "matmul" and u.ndim == 2:
            return u @ (v if v.ndim and v.shape[0] == u.shape[1] else F.transpose(u))
        if kind == "move" and u.ndim:
            return [F.reshape(u, (-1,)), F.transpose(u), F.broadcast_to(u, (2,) + u.shape),
                    F.reshape(F.reshape(u, (-1,)), u.shape), u[::-1], F.concatenate([u, u[1:]]),
                    F.take(u, np.array([u.shape[0] - 1, 0, 0]))][k % 7]
        if kind == "softmax" and u.ndim:
            return F.softmax(u, -1)
    except ShapeError:
        return None
    return None


ops_lists = st.lists(st.tuples(st.sampled_from(["unary", "binary", "reduce", "matmul", "move", "move", "softmax"]),
                               st.integers(0, 50), st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=10)


def program(ops):
    """(step, args): one SGD step of a loss built from `ops`, returning (params, loss, every value built)."""
    def step(p, x):
        def loss(p):
            pool = [p["a"], p["b"], x, p["s"]]
            for kind, i, j, k in ops:
                r = _apply(kind, pool[i % len(pool)], pool[j % len(pool)], k)
                if r is not None:
                    pool.append(r)
            return sum(F.sum(t) * 0.1 for t in pool[1:]) + F.mean(pool[0]), pool[4:]
        (value, last), g = burjit.value_and_grad(loss, has_aux=True)(p)
        return {k: p[k] - 0.1 * g[k] for k in p}, value, last
    rng = np.random.default_rng(len(ops))
    params = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(4), "s": np.float64(0.5)}
    x = rng.standard_normal((3, 4))
    x[0] = -0.0, 0.0, -0.0, 0.0  # rewrites must keep the sign of zero (x + 0.0 is not x at -0.0)
    return step, (params, x)


# -- the models of the done-criteria -------------------------------------------------------------

def mlp():
    """784-128-10 MLP, batch 32, cross-entropy, SGD, parameters donated."""
    def step(p, x, y):
        def loss(p):
            return F.cross_entropy(F.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"], y)
        value, g = burjit.value_and_grad(loss)(p)
        return {k: p[k] - 0.1 * g[k] for k in p}, value
    rng = np.random.default_rng(0)
    p = {"w1": (rng.standard_normal((784, 128)) * 0.05).astype("f4"), "b1": np.zeros(128, "f4"),
         "w2": (rng.standard_normal((128, 10)) * 0.1).astype("f4"), "b2": np.zeros(10, "f4")}
    return step, (p, rng.standard_normal((32, 784)).astype("f4"), rng.integers(0, 10, 32))


def gpt():
    """burjit.nn.GPT (2 layers, 4 heads, d 32, block 16), batch 4, AdamW, parameters and state donated.

    eps is large enough that the first Adam step, lr * g / (|g| + eps), is smooth in g: with a
    tiny eps it is lr * sign(g), and float noise in a gradient that is mathematically zero
    (the key bias's) would flip whole steps between equally correct backends."""
    model = nn.GPT(vocab_size=65, block_size=16, n_layer=2, n_head=4, d_model=32)
    opt = burjit.optim.adamw(lr=1e-3, eps=1e-4)

    def step(p, state, idx, tgt):
        value, g = burjit.value_and_grad(model.loss)(p, idx, tgt)
        p, state = opt.update(p, g, state)
        return p, state, value
    rng = np.random.default_rng(1)
    p = model.init(0)
    return step, (p, opt.init(p), rng.integers(0, 65, (4, 16)), rng.integers(0, 65, (4, 16)))


MODELS = {"mlp": mlp, "gpt": gpt}


def model_graph(name):
    step, args = MODELS[name]()
    return traced(step, args, donate=(0, 1) if name == "gpt" else 0)


# -- differential tests --------------------------------------------------------------------------

def assert_same(graph, passed, inputs):
    for want, got in zip(burjit.evaluate(graph, inputs), burjit.evaluate(passed, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
        zero = np.asarray(want) == 0
        np.testing.assert_array_equal(np.signbit(got)[zero], np.signbit(want)[zero], err_msg="sign of zero")


@given(ops_lists)
def test_every_pass_configuration_matches_the_unpassed_graph(ops):
    graph, inputs = traced(*program(ops), donate=0)
    for names in CONFIGS:
        passed = pipeline.prepare(pipeline.run(graph, names))
        assert passed.inputs == graph.inputs and len(passed.outputs) == len(graph.outputs)
        assert_same(graph, passed, inputs)


@pytest.mark.parametrize("name", MODELS)
def test_models_match_with_every_pass_configuration(name):
    graph, inputs = model_graph(name)
    for names in CONFIGS:
        assert_same(graph, pipeline.prepare(pipeline.run(graph, names)), inputs)


def test_env_switch_turns_a_pass_off(monkeypatch):
    graph, _ = traced(*program([("unary", 0, 0, 5)]))
    monkeypatch.setenv("BURJIT_DISABLE_PASSES", "simplify, fuse")
    off = pipeline.run(graph)
    assert "groups" not in off.meta and any(off[n]["op"] == "id" for n in off.nx.nodes)
    monkeypatch.delenv("BURJIT_DISABLE_PASSES")
    on = pipeline.run(graph)
    assert "groups" in on.meta and not any(on[n]["op"] == "id" for n in on.nx.nodes)


def test_unknown_pass_is_refused():
    graph, _ = traced(*program([("unary", 0, 0, 0)]))
    with pytest.raises(ValueError, match="unknown passes"):
        pipeline.run(graph, ["simplify", "fusion"])


def test_passes_do_not_mutate_their_input():
    graph, _ = model_graph("mlp")
    before = (graph.fingerprint(), dict(graph.meta))
    for fn in pipeline.PASSES.values():
        fn(graph)
    assert (graph.fingerprint(), dict(graph.meta)) == before
    assert os.environ.get("BURJIT_DISABLE_PASSES") is None
