"""The tape tier (codegen/tape.py): forced on, it must give the bits straight-line code gives and
the reference's values; auto picks it for large scalar programs only; failures stay clean."""

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import burjit
from burjit import ops as F
from burjit.codegen import tape

from test_grad_fd import ANY, BINARY, POS, POSITIVE, UNARY, check

_SCALAR_UNARY = [F.tanh, F.exp, F.sigmoid, F.relu, F.softplus, F.abs, F.negative, F.gelu, lambda u: u ** 3,
                 lambda u: F.where(u > 0.1, u * u, -u), lambda u: F.log1p(u * u), lambda u: F.sqrt(u * u + 1.0),
                 lambda u: 2.0 ** F.tanh(u), lambda u: F.astype(F.astype(u * 3.0, "int32"), "float64")]
_SCALAR_BINARY = [F.add, F.subtract, F.multiply, F.maximum, F.minimum, lambda u, v: u / (1.0 + v * v),
                  lambda u, v: F.where(u < v, u, v * 0.5), lambda u, v: F.power(u * u + 0.5, F.tanh(v))]


def scalar_program(ops):
    """value_and_grad of a micrograd-style scalar graph grown from the 6 scalars of x by `ops`."""
    def f(x):
        pool = [x[i] for i in range(x.shape[0])]
        for kind, i, j, k in ops:
            u, v = pool[i % len(pool)], pool[j % len(pool)]
            pool.append(_SCALAR_UNARY[k % len(_SCALAR_UNARY)](u) if kind else _SCALAR_BINARY[k % len(_SCALAR_BINARY)](u, v))
        return sum(pool[6:], pool[0] * 0.0) + pool[-1] * pool[-1]
    return burjit.value_and_grad(f)


def _run(fn, x, tier, monkeypatch):
    monkeypatch.setenv("BURJIT_TIER", tier)
    step = burjit.compile(fn)
    out = step(x)
    return out, step.stats(x)


@settings(max_examples=15)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99)),
                min_size=1, max_size=40))
def test_tape_gives_the_bits_of_straight_line_code_and_the_reference_values(ops):
    x = np.array([-1.5, -0.25, -0.0, 0.0, 0.75, 2.0])
    fn = scalar_program(ops)
    with pytest.MonkeyPatch.context() as mp:
        (v_line, g_line), line = _run(fn, x, "straight", mp)
        assert not line["tapes"]
        (v_tape, g_tape), stats = _run(fn, x, "tape", mp)
        assert stats["tapes"], "the forced tier put no program on the tape"
        mp.setattr(tape, "PAIR_MIN", 1)  # every pair an opcode: fused records give the same bits
        (v_pair, g_pair), _ = _run(fn, x, "tape", mp)
    for v, g in ((v_tape, g_tape), (v_pair, g_pair)):
        np.testing.assert_array_equal(np.asarray(v).view(np.int64), np.asarray(v_line).view(np.int64))
        np.testing.assert_array_equal(g.view(np.int64), g_line.view(np.int64))
    v_ref, g_ref = burjit.compile(fn, backend="reference")(x)
    np.testing.assert_allclose(v_tape, v_ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(g_tape, g_ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", sorted(UNARY) + sorted(BINARY))
def test_every_op_on_scalars_against_finite_differences(name, monkeypatch):
    monkeypatch.setenv("BURJIT_TIER", "tape")
    fn, npf = UNARY.get(name) or BINARY[name]
    lo, hi = POS if name in POSITIVE or name in ("div", "pow") else ANY
    args = (np.float64(lo + 0.37 * (hi - lo)),) if name in UNARY else (np.float64(lo + 0.37 * (hi - lo)), np.float64(hi * 0.8))
    check(fn, npf, args, "native")


def test_float32_and_bool_values_on_the_tape(monkeypatch):
    monkeypatch.setenv("BURJIT_TIER", "tape")
    f = burjit.compile(lambda a, b: (F.where((a > b) & (b > 0), a * b, a - b), a > 1.0, F.astype(a, "float64") * 2))
    for a, b in [(2.5, 0.5), (0.5, 2.5), (2.0, -1.0)]:
        got = f(np.float32(a), np.float32(b))
        want = burjit.compile(f.fn, backend="reference")(np.float32(a), np.float32(b))
        for x, y in zip(got, want):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
    assert f.stats(np.float32(1), np.float32(1))["tapes"]


def _chain(n):
    def f(x):
        v = x[0]
        for i in range(n):
            v = F.tanh(v * 1.01 + x[i % 3])
        return v
    return burjit.value_and_grad(f)


def test_auto_tier_by_size_and_env_override(monkeypatch):
    monkeypatch.delenv("BURJIT_TIER", raising=False)
    x = np.array([0.1, 0.2, 0.3])
    small, big = burjit.compile(_chain(10)), burjit.compile(_chain(tape.TAPE_ENTRIES // 4))
    v_small, v_big = small(x), big(x)
    assert not small.stats(x)["tapes"]
    (t,) = big.stats(x)["tapes"]
    assert t["records"] > tape.TAPE_ENTRIES and t["registers"] < t["records"] / 4  # reused: ~ the forward values the backward reads
    assert big.memory_plan(x)["tape_bytes"] >= t["registers"] * tape.REGISTER
    monkeypatch.setenv("BURJIT_TIER", "straight")
    forced = burjit.compile(_chain(tape.TAPE_ENTRIES // 4))
    assert not forced.stats(x)["tapes"]
    np.testing.assert_array_equal(forced(x)[1], v_big[1])
    monkeypatch.setenv("BURJIT_TIER", "tape")
    tiny = burjit.compile(_chain(10))
    assert tiny.stats(x)["tapes"] and np.array_equal(tiny(x)[1], v_small[1])


def _neurons(width, depth):
    """micrograd's neurons as scalars: sums of products, each product read once (mul into add)."""
    def f(w):
        h = [w[0, 0, j] for j in range(width)]
        for layer in range(1, depth + 1):
            h = [F.relu(sum((w[layer, k, j] * h[j] for j in range(width)), w[0, 1, k])) for k in range(width)]
        return sum(h[1:], h[0])
    return burjit.value_and_grad(f)


def test_products_read_once_are_fused_into_their_sums(monkeypatch):
    w = np.random.default_rng(0).normal(size=(4, 12, 12))
    fn = _neurons(12, 3)
    (v_line, g_line), _ = _run(fn, w, "straight", monkeypatch)
    monkeypatch.setattr(tape, "PAIR_MIN", 10 ** 9)  # no pair gets an opcode
    _, stats = _run(fn, w, "tape", monkeypatch)
    (plain,) = stats["tapes"]
    monkeypatch.setattr(tape, "PAIR_MIN", 100)
    (v, g), stats = _run(fn, w, "tape", monkeypatch)
    (fused,) = stats["tapes"]
    assert plain["pairs"] == 0 and fused["pairs"] >= 3 * 12 * 12  # the forward's products at least
    assert fused["records"] == plain["records"] - fused["pairs"] and fused["registers"] < plain["registers"]
    assert v == v_line and np.array_equal(g.view(np.int64), g_line.view(np.int64))


@pytest.mark.parametrize("per_run", [True, False])
def test_dispatch_per_run_or_per_record_gives_the_same_bits(per_run, monkeypatch):
    w = np.random.default_rng(1).normal(size=(4, 8, 8))
    fn = _neurons(8, 3)
    (v_line, g_line), _ = _run(fn, w, "straight", monkeypatch)
    monkeypatch.setattr(tape, "RUN", 1 if per_run else 10 ** 9)
    (v, g), stats = _run(fn, w, "tape", monkeypatch)
    (t,) = stats["tapes"]
    assert (t["runs"] is not None) == per_run and (not per_run or t["runs"] < t["records"])
    assert v == v_line and np.array_equal(g.view(np.int64), g_line.view(np.int64))


def test_the_argument_overrides_the_env_var(monkeypatch):
    x = np.array([0.1, 0.2, 0.3])
    monkeypatch.setenv("BURJIT_TIER", "tape")
    line = burjit.compile(_chain(10), tier="straight")
    monkeypatch.setenv("BURJIT_TIER", "straight")
    taped = burjit.compile(_chain(10), tier="tape")
    assert np.array_equal(line(x)[1], taped(x)[1])
    assert not line.stats(x)["tapes"] and taped.stats(x)["tapes"]
    assert copy.copy(taped).tier == "tape"


def test_unknown_tier_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="tier must be one of auto, straight, tape, got 'fast'"):
        burjit.compile(lambda x: x * 2.0, tier="fast")
    monkeypatch.setenv("BURJIT_TIER", "fast")
    with pytest.raises(ValueError, match="BURJIT_TIER='fast'; known: auto, straight, tape"):
        burjit.compile(lambda x: x * 2.0)(np.float64(1))


def test_interpreter_shared_by_steps_with_one_op_set(monkeypatch, tmp_path):
    monkeypatch.setenv("BURJIT_TIER", "tape")
    monkeypatch.setenv("BURJIT_CACHE_DIR", str(tmp_path))
    a = burjit.compile(lambda x: F.tanh(x * 3.0) + x)
    b = burjit.compile(lambda x: F.tanh(F.tanh(x * 3.0) + x) + x)  # same ops, other order and count
    a(np.float64(0.5)), b(np.float64(0.5))
    sa, sb = a.stats(np.float64(0.5)), b.stats(np.float64(0.5))
    assert sb["kernels_compiled"] == 0 and [k["symbol"] for k in sa["per_kernel"]] == [k["symbol"] for k in sb["per_kernel"]]


def test_poisoned_arena_and_donation_on_the_tape(monkeypatch):
    monkeypatch.setenv("BURJIT_TIER", "tape")
    monkeypatch.setenv("BURJIT_POISON_ARENA", "1")

    def train(p):
        v, g = burjit.value_and_grad(lambda p: F.tanh(p[0] * p[1]) + F.exp(p[2] - p[0]) * p[1])(p)
        return p - 0.1 * g, v
    step = burjit.compile(train, donate_argnums=0)
    p = np.array([0.3, -0.7, 1.1])
    want = burjit.compile(train, backend="reference")(p.copy())
    got = step(p)
    assert got[0] is p and step.stats(p)["tapes"]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


def test_a_failing_step_with_a_tape_changes_no_parameter(monkeypatch):
    """The tape updates scalars in place; an index computed later is out of range: restored."""
    monkeypatch.setenv("BURJIT_TIER", "tape")

    @burjit.compile(donate_argnums=0)
    def step(p, table):
        s = F.tanh(p[0] * p[1]) + p[2]
        new = F.concatenate([F.reshape(v, (1,)) for v in (p[0] - 0.1 * s, p[1] * s, p[2] + s)])
        idx = F.astype(F.reshape(s * 0.0 + p[2], (1,)), "int32")  # computed: checked as the step runs
        return new, F.sum(F.take(table, idx))

    p, table = np.array([0.5, -0.5, 2.0]), np.arange(4.0)
    before = p.copy()
    with pytest.raises(IndexError):
        step(p, table[:2])
    assert np.array_equal(p, before) and step.stats(p, table[:2])["tapes"]
    out, total = step(p, table)
    assert out is p and total == 2.0 and not np.array_equal(p, before)
