"""Scalar regions (burjit/region.py): a large scalar program is one graph node holding flat
records; small ones, tier 'straight' and regions with too many opcodes become plain nodes; every
way of reading a region's values (outputs, tensor ops, later regions, grad) gives the reference's
values and straight-line code's bits."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import burjit
from burjit import ops as F
from burjit import primitives as P
from burjit import region, region_reverse

from test_grad_fd import check
from test_tape import scalar_program


def _chain(n):
    def f(x):
        xs = [x[0], x[1], x[2]]
        v = xs[0]
        for i in range(n):
            v = F.tanh(v * 1.01 + xs[i % 3]) + F.maximum(v, 0.0) * 0.5
        return v
    return burjit.value_and_grad(f)


def _ops(graph):
    return [graph[n]["op"] for n in graph.nx.nodes]


def test_a_large_scalar_program_is_one_region_node(monkeypatch):
    monkeypatch.delenv("BURJIT_TIER", raising=False)
    x = np.array([0.1, 0.2, 0.3])
    big = burjit.compile(_chain(region.REGION_OPS // 4), backend="reference", passes=[])
    ops = _ops(big.graph(x))
    assert ops.count("region") == 1 and len(ops) < 60  # the 3 inputs' slices, the region, its outputs
    small = burjit.compile(_chain(10), backend="reference", passes=[])
    assert "region" not in _ops(small.graph(x))
    line = burjit.compile(_chain(region.REGION_OPS // 4), backend="reference", passes=[], tier="straight")
    assert "region" not in _ops(line.graph(x)) and len(line.graph(x)) > region.REGION_OPS
    np.testing.assert_array_equal(big(x)[1], line(x)[1])
    assert "region of" in str(big.graph(x))


def test_a_large_region_runs_on_the_tape_with_straight_line_bits(monkeypatch):
    monkeypatch.delenv("BURJIT_TIER", raising=False)
    x = np.array([0.1, -0.2, 0.3])
    taped, line = burjit.compile(_chain(region.REGION_OPS // 4)), burjit.compile(_chain(region.REGION_OPS // 4), tier="straight")
    (v1, g1), (v2, g2) = taped(x), line(x)
    assert taped.stats(x)["tapes"] and not line.stats(x)["tapes"]
    assert np.asarray(v1).tobytes() == np.asarray(v2).tobytes() and g1.tobytes() == g2.tobytes()
    assert taped.memory_plan(x)["tape_bytes"] > 0


def _interleaved(x, f32=False):
    """Scalars, a tensor op reading them (closes the region), a new region reading old values,
    comparisons, and (f32) a float32 region beside the float64 one."""
    s = [x[i] * x[(i + 1) % 4] + F.tanh(x[i]) for i in range(4)]
    v = F.concatenate([F.reshape(t, (1,)) for t in s])
    m = F.sum(v * v)
    u = F.sigmoid(m) * s[0] + s[3] ** 2.0 + F.where(s[1] > 0.1, s[2], -s[2])
    w = F.astype(F.astype(u, "float32") * np.float32(1.5) + F.astype(s[1], "float32"), "float64") if f32 else u * 1.5 + s[1]
    return u + w * (s[2] < 0.0)


def _np_interleaved(x):
    s = [x[i] * x[(i + 1) % 4] + np.tanh(x[i]) for i in range(4)]
    m = np.sum(np.square(s))
    u = 1 / (1 + np.exp(-m)) * s[0] + s[3] ** 2.0 + np.where(s[1] > 0.1, s[2], -s[2])
    w = u * 1.5 + s[1]
    return u + w * (s[2] < 0.0)


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("walk_below", [0, region.WALK_BELOW])  # by templates, by the walk
def test_gradients_through_closed_regions_against_finite_differences(backend, walk_below, monkeypatch):
    monkeypatch.setenv("BURJIT_TIER", "tape")  # every region compact, however small
    monkeypatch.setattr(region, "WALK_BELOW", walk_below)
    graph = burjit.compile(burjit.value_and_grad(_interleaved), backend="reference", passes=[])
    assert _ops(graph.graph(np.zeros(4) + 0.5)).count("region") >= 2
    for x in ([0.3, -1.2, 0.7, 0.1], [-0.4, 0.9, -0.8, 1.3]):
        check(_interleaved, _np_interleaved, (np.array(x),), backend, rtol=1e-6, atol=1e-6)


def test_every_tier_gives_the_same_values(monkeypatch):
    monkeypatch.delenv("BURJIT_TIER", raising=False)
    x = np.array([0.3, -1.2, 0.7, 0.1])
    f = burjit.value_and_grad(lambda x: _interleaved(x, f32=True))
    want = burjit.compile(f, backend="reference", tier="straight")(x)
    for tier in ("auto", "straight", "tape"):
        for backend in ("reference", "native"):
            got = burjit.compile(f, backend=backend, tier=tier)(x)
            np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
            np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def test_nested_grad_and_grad_of_a_region_value(monkeypatch):
    monkeypatch.setenv("BURJIT_TIER", "tape")
    x = np.array([0.4, -0.3])

    def inner(y):
        return F.exp(y[0]) * y[1] + F.softplus(y[1] * y[0])

    def outer(x):
        g = burjit.grad(inner)(x)
        return g[0] * g[1] + F.tanh(g[0])
    got = burjit.compile(burjit.grad(outer))(x)
    want = burjit.compile(burjit.grad(outer), backend="reference", tier="straight")(x)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    got = burjit.compile(burjit.grad(lambda a, b: burjit.grad(lambda t: t * t * a)(b) * a))(np.float64(1.5), np.float64(2.0))
    assert got == pytest.approx(4 * 1.5 * 2.0)  # d/da (2ab * a)


def test_a_region_with_more_constants_than_opcodes_sets_them_at_run_time(monkeypatch):
    """Baked constants are an opcode each; past MAX_OPCODES a region's constants are `set` records."""
    monkeypatch.delenv("BURJIT_TIER", raising=False)

    def f(x):
        v = x[0]
        for i in range(region.REGION_OPS // 2):
            v = F.tanh(v * (1.0 + i * 1e-4)) + x[1]  # a new constant per step
        return v
    x = np.array([0.3, -0.2])
    step = burjit.compile(burjit.value_and_grad(f))
    got, want = step(x), burjit.compile(burjit.value_and_grad(f), backend="reference")(x)
    assert step.stats(x)["tapes"] and "region" in _ops(step.graph(x))
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)


def test_region_values_print_and_differ_by_content(monkeypatch):
    monkeypatch.setenv("BURJIT_TIER", "tape")
    seen = []

    def f(x):
        v = x[0] * 2.0 + x[1]
        seen.append(repr(v))  # repr must not close the region (nothing read it yet)
        assert v.region.is_open
        return v * v
    step = burjit.compile(f, backend="reference", passes=[])
    step(np.array([1.0, 2.0]))
    assert seen[0].startswith("Tracer(region value")
    digest = {}
    for scale in (2.0, 3.0, 2.0):
        g = burjit.compile(lambda x: F.tanh(x[0] * scale) + x[1], backend="reference", passes=[]).graph(np.zeros(2))
        (r,) = [g[n]["attrs"]["region"] for n in g.nx.nodes if g[n]["op"] == "region"]
        digest.setdefault(scale, set()).add(r.digest())
    assert len(digest[2.0]) == 1 and digest[2.0] != digest[3.0]


def test_a_traced_error_in_a_region_names_the_users_line(monkeypatch):
    monkeypatch.setenv("BURJIT_TIER", "tape")

    def f(x):
        v = F.tanh(x[0]) * x[1]
        if v > 0:  # Python control flow on a traced scalar
            return v
        return -v
    with pytest.raises(burjit.TracingError, match=r"test_region.py:\d+: if v > 0"):
        burjit.compile(f)(np.array([1.0, 2.0]))


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99)),
                min_size=1, max_size=30))
def test_templates_give_the_bits_of_the_record_by_record_walk(ops):
    """region.reverse lays out template copies; region.walk runs each VJP rule per record: the
    same records, so the same bits (and both the reference's values)."""
    x = np.array([-1.5, -0.25, -0.0, 0.0, 0.75, 2.0])
    fn = scalar_program(ops)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BURJIT_TIER", "tape")
        mp.setattr(region, "WALK_BELOW", 0)  # templates however small the region
        laid_out, stamp = [], region_reverse.reverse
        mp.setattr(region_reverse, "reverse", lambda *a: laid_out.append(1) or stamp(*a))
        by_templates = burjit.compile(fn)(x)
        assert laid_out
        mp.setattr(region_reverse, "reverse", _refuse)
        walked = burjit.compile(fn)(x)
    for a, b in zip(by_templates, walked):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    want = burjit.compile(fn, backend="reference", tier="straight")(x)
    np.testing.assert_allclose(by_templates[1], want[1], rtol=1e-9, atol=1e-12)


def _refuse(*args):
    raise region_reverse.NotScalar


def test_a_rule_that_leaves_the_region_is_walked(monkeypatch):
    """A VJP rule reading its values as graph nodes cannot be a template: that region is walked."""
    monkeypatch.setenv("BURJIT_TIER", "tape")
    monkeypatch.setattr(region, "WALK_BELOW", 0)
    calls = []
    walk = region.walk
    monkeypatch.setattr(region, "walk", lambda *a: calls.append(1) or walk(*a))
    original = P.PRIMITIVES["tanh"]
    leaving = dataclasses.replace(original, vjp=lambda F, g, out, xs, needs, a: [
        F.reshape(F.reshape(g * (1.0 - out * out), (1,)), ())])  # reshape: a graph op
    monkeypatch.setitem(P.PRIMITIVES, "tanh", leaving)
    region_reverse._TEMPLATES.clear()
    f = burjit.value_and_grad(lambda x: F.tanh(x[0] * x[1]) * x[0])
    x = np.array([0.4, -0.7])
    got = burjit.compile(f)(x)
    region_reverse._TEMPLATES.clear()
    assert calls
    t = np.tanh(x[0] * x[1])
    np.testing.assert_allclose(got[1], [t + x[0] * (1 - t * t) * x[1], x[0] * (1 - t * t) * x[0]], rtol=1e-12)


def test_a_region_value_kept_past_its_trace_is_refused(monkeypatch):
    monkeypatch.setenv("BURJIT_TIER", "tape")
    kept = []

    def f(x):
        v = F.tanh(x[0]) * x[1]
        kept.append(v)
        return v
    step = burjit.compile(f)
    step(np.array([1.0, 2.0]))
    with pytest.raises(burjit.TracingError, match="finished trace"):
        kept[0].node
    with pytest.raises(burjit.TracingError, match=r"finished\) trace was used"):
        burjit.compile(lambda x: x[0] * kept[0])(np.array([1.0, 2.0]))
