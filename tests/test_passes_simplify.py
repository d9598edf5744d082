"""simplify: each rewrite fires where it should and nowhere else; signature positions survive."""

import numpy as np

import burjit
from burjit import ops as F
from burjit.passes import simplify

from test_passes_programs import assert_same, model_graph, traced


def _simplified(fn, *args):
    graph, inputs = traced(fn, args)
    out = simplify.simplify(graph)
    assert_same(graph, out, inputs)
    return out


def _ops(g):
    return sorted(g[n]["op"] for n in g.nx.nodes if g[n]["op"] != "input")


def test_neutral_elements_and_identities_disappear():
    out = _simplified(lambda x: -(-(((x * 1.0 + -0.0) - 0.0) / 1.0)) + F.stop_gradient(x) * 0 + F.astype(x, "float64"),
                      np.arange(3.0))
    assert _ops(out) == ["add", "add", "const", "mul"]  # x + 0*sg(x) + x: the 0 * x stays (NaN-safe)


def test_where_on_a_constant_condition_picks_its_operand():
    out = _simplified(lambda x: (F.where(np.float64(3.0) == 0.0, x * 2.0, x * 3.0),
                                 F.where(F.ones_like(x, "bool"), -x, x)), np.arange(3.0))
    assert _ops(out) == ["const", "mul", "neg"]


def test_signed_zeros_stay_apart():
    """x + 0.0 is +0.0 at x = -0.0, so it stays; int zeros are neutral; 0.0 and -0.0 are two constants."""
    x = np.array([-0.0, 1.0])
    out = _simplified(lambda x, i: (x + 0.0, 0.0 + x, x - -0.0, i + 0, x * -0.0 + x * 0.0), x, np.arange(2))
    assert _ops(out) == ["add", "add", "add", "const", "const", "mul", "mul", "sub"]
    got = burjit.evaluate(out, [x, np.arange(2)])
    assert not np.signbit(got[0][0]) and not np.signbit(got[1][0]) and not np.signbit(got[4][1])


def test_non_neutral_constants_stay():
    out = _simplified(lambda x: x * 2.0 + 1.0, np.arange(3.0))
    assert _ops(out) == ["add", "const", "const", "mul"]


def test_chains_of_moves_collapse():
    def f(x):
        y = F.reshape(F.reshape(x, (6,)), (3, 2))
        z = F.transpose(F.transpose(x, (1, 0)), (1, 0))
        w = F.broadcast_to(F.broadcast_to(F.reshape(x[0], (1, 3)), (2, 3)), (4, 2, 3))
        return y, z, w
    out = _simplified(f, np.arange(6.0).reshape(2, 3))
    assert _ops(out) == ["broadcast_to", "reshape", "slice"]  # x[0] is a (1, 3) slice already
    assert out.outputs[1] == out.inputs[0]


def test_transpose_that_only_moves_unit_axes_is_a_reshape():
    out = _simplified(lambda x, y: (F.transpose(x), F.transpose(y, (1, 0, 2))), np.ones((5, 1)), np.ones((1, 2, 3)))
    assert _ops(out) == ["reshape", "reshape"]
    out = _simplified(lambda x: F.transpose(x, (2, 1, 0)), np.ones((2, 1, 3)))
    assert _ops(out) == ["transpose"]


def test_constant_subgraphs_fold_uniform_to_const_and_small_others_to_literal():
    def f(x):
        mask = F.reshape(F.arange(4), (4, 1)) >= F.reshape(F.arange(4), (1, 4))
        return x * (F.ones_like(x) * 3.0 + 1.0), F.where(mask, x, 0.0)
    out = _simplified(f, np.ones((4, 4)))
    consts = [out[n]["attrs"]["value"] for n in out.nx.nodes if out[n]["op"] == "const"]
    assert 4.0 in consts and "literal" in _ops(out) and "iota" not in _ops(out)


def test_cse_merges_repeated_work():
    out = _simplified(lambda x: F.exp(x) * F.exp(x) + F.exp(x), np.arange(3.0))
    assert _ops(out).count("exp") == 1


def test_dce_keeps_every_input_and_output_position():
    def f(a, unused, b):
        return b, a * 2.0, b
    graph, inputs = traced(f, (np.ones(2), np.ones(2), np.zeros(2)))
    out = simplify.simplify(graph)
    assert out.inputs == graph.inputs and out.outputs[0] == out.outputs[2] == out.inputs[2]
    assert _ops(out) == ["const", "mul"]


def test_gradients_nobody_asked_for_are_not_computed():
    def f(a, b):
        value, (ga, gb) = burjit.value_and_grad(lambda a, b: F.sum(F.tanh(a @ b)), argnums=(0, 1))(a, b)
        return value, ga  # gb is dropped
    out = _simplified(f, np.ones((2, 3)), np.ones((3, 4)))
    assert _ops(out).count("matmul") == 2  # forward, and da = g @ b.T; no db = a.T @ g


def test_models_shrink():
    for name in ("mlp", "gpt"):
        graph, inputs = model_graph(name)
        out = simplify.simplify(graph)
        assert len(out) < 0.8 * len(graph)
        assert not any(out[n]["op"] in ("id", "stop_gradient") for n in out.nx.nodes)


def test_pads_that_tile_an_axis_become_one_concatenate():
    """The adjoint of x[0] and x[1] of a two-row x: one copy per row, not zero fills and an add."""
    x = np.linspace(-2, 2, 10).reshape(2, 5)
    out = _simplified(burjit.grad(lambda x: F.sum(F.exp(x[0]) * F.tanh(x[1]))), x)
    assert "concatenate" in _ops(out) and "pad" not in _ops(out)
    gap = _simplified(burjit.grad(lambda x: F.sum(F.exp(x[0]) * F.tanh(x[2]))), np.ones((3, 5)))
    assert "concatenate" not in _ops(gap) and _ops(gap).count("pad") == 2  # a zero row between: kept
    cols = _simplified(burjit.grad(lambda x: F.sum(F.exp(x[:, :2]) * F.tanh(x[:1, 2:4]))), np.ones((2, 4)))
    assert "concatenate" not in _ops(cols)  # the pads differ on two axes: kept
