"""Native code against the reference evaluator: every op, fused kernel forms, matmul, math functions,
random graphs, and the shape of the emitted IR (vector loops, straight-line scalar code)."""

import os
import re
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import burjit
from burjit import ops as F
from burjit.codegen import build, objects
from burjit.passes import memplan, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed: a plain `pytest`
from benchmarks import ulp  # noqa: E402

TOL = {"float64": dict(rtol=1e-12, atol=1e-12), "float32": dict(rtol=2e-5, atol=2e-6)}
PASS_CONFIGS = {"default": None, "unfused": ["simplify"], "none": []}


def traced(fn, *args):
    return burjit.compile(fn, backend="reference", passes=[]).graph(*args)


def with_groups(graph, groups):
    """graph lowered with hand-made fusion groups and the naive plan."""
    g = graph.copy()
    g.meta["groups"] = [tuple(x) for x in groups]
    return build(memplan.naive(schedule.schedule(g)))


def compare(fn, *args, passes=None, tol=None, donate=()):
    """Run fn natively and on the reference backend; assert equal outputs."""
    want = burjit.compile(fn, backend="reference", donate_argnums=donate)(*[np.copy(a) for a in args])
    got = burjit.compile(fn, backend="native", passes=passes, donate_argnums=donate)(*args)
    for w, g in zip(burjit.pytree.flatten(want)[0], burjit.pytree.flatten(got)[0], strict=True):
        w, g = np.asarray(w), np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, **(tol or TOL[str(w.dtype)]))
        else:
            np.testing.assert_array_equal(g, w)
    return got


def _data(dtype, shape, seed=0, lo=-2.0, hi=2.0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        return rng.integers(-5, 6, size=shape).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


# -- every elementwise op -------------------------------------------------------------------------

UNARY = {"neg": F.negative, "abs": F.abs, "sign": F.sign, "exp": F.exp, "tanh": F.tanh, "sigmoid": F.sigmoid,
         "log": lambda x: F.log(F.abs(x) + 0.1), "log1p": lambda x: F.log1p(F.abs(x) - 0.9),
         "sqrt": lambda x: F.sqrt(F.abs(x)), "square": F.square, "relu": F.relu, "gelu": F.gelu,
         "softplus": F.softplus, "expm1": F.expm1, "cos": F.cos, "sin": F.sin}
BINARY = {"add": F.add, "sub": F.subtract, "mul": F.multiply, "div": lambda x, y: x / (F.abs(y) + 0.5),
          "pow": lambda x, y: F.power(F.abs(x) + 0.1, y), "pow2": lambda x, y: x ** 2.0, "max": F.maximum,
          "min": F.minimum, "lt": F.less, "le": F.less_equal, "gt": F.greater, "ge": F.greater_equal,
          "eq": F.equal, "ne": F.not_equal, "where": lambda x, y: F.where(x > y, x, y * 2.0),
          "and": lambda x, y: F.logical_and(x > 0, y > 0), "or": lambda x, y: F.logical_or(x > 0, y > 0),
          "not": lambda x, y: F.logical_not(x > y)}


SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 50.0]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("passes", ["default", "none"])
def test_elementwise_float_ops(dtype, passes):
    x, y = _data(dtype, (37,), 1), _data(dtype, (37,), 2)
    y[::5] = x[::5]  # ties for eq/le/ge/max
    x[1:36:5] = SPECIAL  # each op's nan/inf/signed-zero results must be numpy's too
    y[3:36:5] = SPECIAL[::-1]
    compare(lambda x, y: {**{k: f(x) for k, f in UNARY.items()}, **{k: f(x, y) for k, f in BINARY.items()}},
            x, y, passes=PASS_CONFIGS[passes])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("passes", ["default", "none"])
def test_arithmetic_rounds_like_numpy_op_by_op(dtype, passes):
    """+ - * / round each op exactly as numpy does: no FMA contraction across separately written ops
    (with it, a*a - b*b at a == b is nonzero and sqrt of it NaN for about half the elements)."""
    a, b, c = _data(dtype, (257,), 5), _data(dtype, (257,), 6), _data(dtype, (257,), 7)
    fns = {"square_diff": lambda a, b, c: a * a - b * b, "diff_of_products": lambda a, b, c: a * b - c * a,
           "mul_add": lambda a, b, c: a * b + c, "chain": lambda a, b, c: (a * b + c) * c - a / (b * b + 1.0)}
    b[::2] = a[::2]
    got = burjit.compile(lambda a, b, c: {k: f(a, b, c) for k, f in fns.items()}, passes=PASS_CONFIGS[passes])(a, b, c)
    for k, f in fns.items():
        np.testing.assert_array_equal(got[k], f(a, b, c), err_msg=k)  # numpy evaluates the same expression
    assert not got["square_diff"][::2].any()


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_elementwise_int_ops_and_converts(dtype):
    x, y = _data(dtype, (3, 5), 3), _data(dtype, (3, 5), 4)
    ops = {"add": F.add, "sub": F.subtract, "mul": F.multiply, "max": F.maximum, "min": F.minimum,
           "neg": lambda x, y: -x, "abs": lambda x, y: F.abs(x), "sign": lambda x, y: F.sign(x),
           "lt": F.less, "eq": F.equal, "ne": F.not_equal, "where": lambda x, y: F.where(x > y, x, y),
           "to_f32": lambda x, y: F.astype(x, "float32"), "to_f64": lambda x, y: F.astype(y, "float64"),
           "to_bool": lambda x, y: F.astype(x, "bool"), "to_other_int": lambda x, y: F.astype(x, "int32" if dtype == "int64" else "int64"),
           "bool_to_int": lambda x, y: F.astype(x > y, dtype), "float_to_int": lambda x, y: F.astype(F.astype(x, "float64") * 1.7, dtype),
           "nan_inf_to_int": lambda x, y: F.astype(F.astype(x, "float64") * np.array([np.nan, np.inf, -np.inf, 1e30, 2.5]), dtype)}
    compare(lambda x, y: {k: f(x, y) for k, f in ops.items()}, x, y)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_math_functions_at_special_and_extreme_arguments(dtype):
    """exp/log/log1p/tanh/softplus are our own polynomials (expm1 is built on exp and log): check
    the whole range, with numpy's inf/nan/0 results."""
    tiny = np.finfo(dtype).tiny
    wide = np.concatenate([np.linspace(-50, 50, 2001), np.geomspace(1e-30, 1e3, 500), -np.geomspace(1e-30, 1e3, 500)])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 700.0, 709.7, 710.0, -740.0, -745.0,
                        -750.0, 88.0, 89.0, -103.0, -110.0, 1e-300, tiny, tiny / 4])
    x = np.concatenate([wide, special]).astype(dtype)
    pos = np.concatenate([np.geomspace(float(tiny) / 1024, 1e30, 3000), [0.0, -1.0, np.inf, np.nan, 1.0, 0.5, 2.0]])
    pos = pos.astype(dtype)
    with np.errstate(all="ignore"):
        want = {"exp": np.exp(x), "tanh": np.tanh(x), "log": np.log(pos), "log1p": np.log1p(x),
                "softplus": np.logaddexp(0, x), "expm1": np.expm1(x)}
    got = burjit.compile(lambda x, p: {"exp": F.exp(x), "tanh": F.tanh(x), "log": F.log(p), "log1p": F.log1p(x),
                                       "softplus": F.softplus(x), "expm1": F.expm1(x)})(x, pos)
    ulp = {"float64": 4e-16, "float32": 2.4e-7}[dtype]
    for k in want:
        w, g = want[k], got[k]
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=k)
        np.testing.assert_array_equal(np.isinf(g), np.isinf(w), err_msg=k)
        ok = np.isfinite(w)
        denorm = np.abs(w) < np.finfo(dtype).tiny  # subnormal results: absolute, not relative, accuracy
        np.testing.assert_allclose(g[ok & ~denorm], w[ok & ~denorm], rtol=8 * ulp, atol=0, err_msg=k)
        np.testing.assert_allclose(g[ok & denorm], w[ok & denorm], rtol=0, atol=2 * float(np.finfo(dtype).smallest_subnormal), err_msg=k)
    for k in ("log1p", "expm1"):  # also log1p(-0) = expm1(-0) = -0
        np.testing.assert_array_equal(np.signbit(got[k]), np.signbit(want[k]), err_msg=k)


ULP_BOUNDS = {"tanh": 2.0, "softplus": 4.0, "log1p": 4.0, "exp": 1.5, "log": 2.5, "expm1": 4.0, "cos": 1.0, "sin": 1.0}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_math_functions_ulp_on_dense_sweeps(dtype):
    """Max error in ulp on ~2^20-point sweeps against numpy in a wider type (benchmarks/ulp.py).
    tanh's old 1 - 2/(exp(2x) + 1) lost 6 ulp near 0.2; softplus via log(1 + exp(x)) lost
    everything below x = -37 (float64) / -17 (float32)."""
    if ulp.WIDE[dtype] is None:
        pytest.skip("no type wider than float64 for the reference")
    worst = ulp.max_ulps(dtype)
    assert {k: v for k, v in worst.items() if v[0] > ULP_BOUNDS[k]} == {}, worst


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_softplus_stays_positive_down_to_the_subnormal_limit(dtype):
    """log(softplus(x)) is finite down to x = log(smallest subnormal), and accurate while
    softplus(x) is normal (it was -inf from x = -37 in float64, -17 in float32)."""
    x = np.linspace(-800.0, -17.0, 1 << 16).astype(dtype)
    lp = burjit.compile(lambda x: F.log(F.softplus(x)))(x)
    assert np.isfinite(lp[x >= np.log(float(np.finfo(dtype).smallest_subnormal))]).all()
    normal = x >= np.log(float(np.finfo(dtype).tiny))
    np.testing.assert_allclose(lp[normal], np.log(np.logaddexp(0, x[normal])), rtol=4 * float(np.finfo(dtype).eps))


# -- reductions, data movement, gather/scatter ------------------------------------------------------

@settings(max_examples=12)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), data=st.data(),
       dtype=st.sampled_from(["float64", "float32", "int64"]))
def test_reductions(shape, data, dtype):
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    x = _data(dtype, tuple(shape), 5)
    compare(lambda x: (F.sum(x, axes), F.max(x, axes), F.sum(F.exp(F.astype(x, "float64") * 0.1), axes)), x)


_SUMS = burjit.compile(lambda x, tall, wide, w: (F.sum(x), F.mean(x), F.sum(tall, 0), F.mean(tall, 0), F.sum(wide, 0),
                                                 burjit.grad(lambda w: F.sum(tall * w) * 0.5)(w)))  # sums tall / 2 over axis 0


@pytest.mark.parametrize("kind", ["1.1", "uniform", "normal"])
def test_float32_sums_of_a_million_elements_err_no_more_than_numpys_pairwise_sums(kind):
    """Naive float32 accumulation of 10^6 copies of 1.1 errs by 1.6e-4; numpy's pairwise sum by 1e-7."""
    rng = np.random.default_rng(19)
    x = {"1.1": np.full(10**6, 1.1), "uniform": rng.random(10**6), "normal": rng.normal(size=10**6)}[kind]
    x = x.astype("float32")
    tall, wide, w = x.reshape(-1, 4), x.reshape(-1, 200), rng.random(4).astype("float32")
    got = _SUMS(x, tall, wide, w)
    x64, tall64, wide64 = (a.astype("float64") for a in (x, tall, wide))
    exact = [x64.sum(), x64.mean(), tall64.sum(0), tall64.mean(0), wide64.sum(0), tall64.sum(0) / 2]
    rows = [np.ascontiguousarray(tall.T), np.ascontiguousarray(wide.T)]  # numpy sums a contiguous row pairwise
    numpy = [x.sum(), x.mean(), rows[0].sum(1), rows[0].mean(1), rows[1].sum(1), rows[0].sum(1) / 2]
    for g, n, e in zip(got, numpy, exact, strict=True):
        ulp = np.max(np.spacing(np.abs(e).astype("float32")))
        assert np.max(np.abs(g - e)) <= 4 * np.max(np.abs(n - e)) + ulp
    assert _SUMS.memory_plan()["scratch_bytes"] >= 8 * 200  # the float64 totals of the wide sum over axis 0


def test_blocked_float32_sums_in_loop_nests_that_do_not_collapse():
    """Outputs updated across two reduced loops (the last split into blocks with a remainder) or
    with a register loop inside each update, and register blocks split along an outer loop (the
    broadcast w keeps the loops apart)."""
    x, y, z = (_data("float32", s, k, 1.0, 1.2) for k, s in enumerate([(5, 3, 500, 5), (2000, 3, 7), (3, 20000, 3)]))
    w = _data("float32", (3,), 3, 1.0, 1.2)
    got = burjit.compile(lambda x, y, z, w: (F.sum(x, (0, 2)), F.sum(y, (0, 2)), F.sum(z * w, (1, 2))))(x, y, z, w)
    x, y, z, w = (a.astype("float64") for a in (x, y, z, w))
    for g, want in zip(got, [x.sum((0, 2)), y.sum((0, 2)), (z * w).sum((1, 2))], strict=True):
        np.testing.assert_allclose(g, want, rtol=2e-7)


def test_empty_arrays(monkeypatch):
    monkeypatch.setenv("BURJIT_POISON_ARENA", "1")  # unwritten arena bytes read as NaN
    x = np.zeros((0, 3))
    compare(lambda x: (F.sum(x, 0) + 1.0, F.sum(x), F.sum(x * 2.0, 1), x @ np.ones((3, 2)),
                       np.ones((2, 0)) @ np.ones((0, 4)) + 1.0, burjit.grad(lambda x: F.sum(F.tanh(x)))(x),
                       F.take(np.ones((2, 3)), np.zeros(0, np.int64))), x, passes=["simplify"])


def test_fused_softmax_and_logsumexp_rows_and_columns():
    x = _data("float32", (7, 33), 6, -30, 30)
    compare(lambda x: (F.softmax(x, -1), F.softmax(x, 0), F.logsumexp(x, -1), F.log_softmax(x, 0)), x)


def test_data_movement():
    x = _data("float64", (3, 4, 5), 7)
    compare(lambda x: {"t": F.transpose(x, (2, 0, 1)), "rev": x[::-1, :, ::2], "slice": x[1:, 1:3, 4],
                       "bcast": F.broadcast_to(x[:, :1, :], (2, 3, 4, 5)), "reshape": F.reshape(F.transpose(x), (20, 3)),
                       "concat": F.concatenate([x, x * 2.0, x[:, :1]], 1), "iota": F.arange(6, dtype="int32"),
                       "onehot": F.one_hot(F.minimum(F.arange(4), 2), 5)}, x)
    for passes in PASS_CONFIGS.values():
        compare(lambda x: burjit.grad(lambda x: F.sum(x[::-1, 1:3] * x[::-1, 1:3]) + F.sum(F.concatenate([x, x], 2)))(x),
                x, passes=passes)


@pytest.mark.parametrize("idx_dtype", ["int32", "int64"])
def test_gather_and_scatter_add(idx_dtype):
    table = _data("float32", (10, 3, 2), 8)
    idx = np.array([[0, 9, 3], [3, 3, 1]], dtype=idx_dtype)  # repeats accumulate in the adjoint
    compare(lambda t, i, j: (F.take(t, i), burjit.grad(lambda t: F.sum(F.take(t, i) ** 2.0))(t), F.take(t, j, 1)),
            table, idx, idx % 3)


def test_gathers_and_scatters_of_any_count_share_one_kernel():
    table = _data("float64", (10, 6), 17)
    f = burjit.compile(lambda t, i: (F.take(t, i), burjit.grad(lambda t: F.sum(F.take(t, i) ** 2.0))(t)))
    texts = []
    for n in (4, 36):  # 24 and 216 elements: the elementwise kernel's grain is 8 at both
        idx = np.arange(n) * 7 % 10
        texts.append(f.llvm_ir(table, idx, optimized=False))
        got, grad = f(table, idx)
        want = np.zeros_like(table)
        np.add.at(want, idx, 2.0 * table[idx])
        np.testing.assert_allclose(got, table[idx])
        np.testing.assert_allclose(grad, want, rtol=1e-12)
    symbols = [set(re.findall(r'^define i32 @"?(burjit_k\w+)', t, re.M)) for t in texts]
    assert len(symbols[0]) == 3 and symbols[0] == symbols[1]


# -- matmul -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mkn", [(1, 1, 1), (3, 5, 7), (4, 8, 16), (16, 16, 16), (17, 33, 65), (64, 64, 64),
                                 (5, 300, 40), (130, 260, 37), (9, 0, 3), (3, 4, 16), (6, 40, 16), (67, 12, 24),
                                 (2, 513, 16), (6, 600, 40), (9, 1024, 24), (10, 40, 72), (5, 24, 48)])
def test_matmul_against_numpy(dtype, mkn):
    m, k, n = mkn
    a, b = _data(dtype, (m, k), 9), _data(dtype, (k, n), 10)
    got = burjit.compile(lambda a, b: a @ b)(a, b)
    tol = {"float64": 1e-12, "float32": 1e-5}[dtype]
    np.testing.assert_allclose(got, a.astype("float64") @ b.astype("float64"), rtol=tol, atol=tol * max(k, 1))


def test_products_of_any_batch_share_one_kernel():
    """The rows of a product (at least 4) and the count of a batched one are kernel arguments,
    so products that differ in them alone (as batch sizes do) share one function, right at each."""
    w = _data("float64", (12, 24), 13)
    texts = []
    for rows in (6, 67, 4):
        x, u, v = (_data("float64", s, 14 + k) for k, s in enumerate([(rows, 12), (rows + 1, 4, 5), (rows + 1, 5, 3)]))
        f = burjit.compile(lambda x, u, w, v: (x @ w, u @ v))
        texts.append(f.llvm_ir(x, u, w, v, optimized=False))
        for got, want in zip(f(x, u, w, v), (x @ w, u @ v)):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    symbols = [set(re.findall(r'^define i32 @"?(burjit_k\w+)', t, re.M)) for t in texts]
    assert len(symbols[0]) == 2 and symbols[0] == symbols[1] == symbols[2]


def test_batched_matmul_and_its_gradients():
    a, b = _data("float64", (2, 3, 9, 5), 11), _data("float64", (2, 3, 5, 6), 12)
    compare(lambda a, b: burjit.value_and_grad(lambda a, b: F.sum(F.tanh(a @ b)), argnums=(0, 1))(a, b), a, b)


# -- random graphs ------------------------------------------------------------------------------------

_UNARY_R = [F.tanh, F.exp, F.sigmoid, F.relu, F.negative, lambda u: u * u, lambda u: F.log(1.0 + u * u)]
_BINARY_R = [F.add, F.subtract, F.multiply, F.maximum, lambda u, v: u / (1.0 + v * v)]


def _broadcastable(a, b):
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


@settings(max_examples=15)
@given(ops=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=12),
       passes=st.sampled_from(sorted(PASS_CONFIGS)), poison=st.booleans())
def test_random_sgd_steps(ops, passes, poison):
    """A random loss, its gradients and an in-place SGD update; poisoned, a bad memory plan shows."""
    def loss(x, w):
        pool = [x, w, F.sum(x, 0, keepdims=True), F.max(w, 1, keepdims=True)]
        for kind, i, j in ops:
            u, v = pool[i % len(pool)], pool[j % len(pool)]
            if kind == 1 and not _broadcastable(u.shape, v.shape):
                continue
            if kind == 0:
                pool.append(_UNARY_R[j % len(_UNARY_R)](u))
            elif kind == 1:
                pool.append(_BINARY_R[i % len(_BINARY_R)](u, v))
            elif kind == 2:
                pool.append(F.sum(u, j % 2, keepdims=True) if u.ndim else u)
            elif kind == 3:
                pool.append(F.tanh(u @ F.transpose(w)) if u.shape[-1] == 4 else F.softmax(u, -1))
            else:
                pool.append(F.transpose(u) * 0.5 if u.shape[0] == u.shape[-1] else F.broadcast_to(u, (3, 4)) + 0.0)
        return F.sum(pool[-1]) + F.sum(pool[-2]) * 0.1

    def step(x, w):
        value, (gx, gw) = burjit.value_and_grad(loss, argnums=(0, 1))(x, w)
        return w - 0.1 * gw, value, gx
    x, w = _data("float64", (3, 4), 13), _data("float64", (3, 4), 14)
    os.environ["BURJIT_POISON_ARENA"] = "1" if poison else ""
    try:
        compare(step, x, w, passes=PASS_CONFIGS[passes], tol=dict(rtol=1e-10, atol=1e-10), donate=1)
    finally:
        del os.environ["BURJIT_POISON_ARENA"]


# -- hand-made kernel forms -----------------------------------------------------------------------------

def _nodes(graph, *ops):
    return [n for n in graph.topo() if graph[n]["op"] in ops]


def test_elementwise_group_reads_broadcast_operands_through_index_maps():
    x, b = _data("float64", (4, 5), 15), _data("float64", (5,), 16)
    g = traced(lambda x, b: F.exp(x + b) * 2.0, x, b)
    group = _nodes(g, "broadcast_to", "add", "exp", "mul")
    exe = with_groups(g, [group])
    assert len(exe.graph.meta["schedule"]) == 1
    np.testing.assert_allclose(exe([x, b])[0], np.exp(x + b) * 2.0, rtol=1e-14)


def test_reduction_group_with_elementwise_prologue():
    x = _data("float32", (6, 40), 17)
    g = traced(lambda x: F.sum(F.exp(x - F.max(x, 1, keepdims=True)), 1), x)
    reduce_max = _nodes(g, "reduce_max")
    rest = [n for n in g.topo() if g[n]["op"] not in ("input", "const", "iota", "literal") and n not in reduce_max]
    exe = with_groups(g, [reduce_max, rest])
    want = np.sum(np.exp(x - x.max(1, keepdims=True)), 1)
    np.testing.assert_allclose(exe([x])[0], want, rtol=1e-5)
    assert _kernels(exe.llvm_ir(optimized=False)) == (2, 2)


def test_scalar_graph_in_one_group_is_straight_line_code(monkeypatch):
    monkeypatch.setenv("BURJIT_TIER", "straight")  # what it checks; CI also runs the suite on the tape
    expression = runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "examples", "micrograd_expr.py"))["expression"]
    a, b = np.asarray(-4.0), np.asarray(2.0)
    g = traced(burjit.value_and_grad(expression, argnums=(0, 1)), a, b)
    exe = with_groups(g, [[n for n in g.topo() if g[n]["op"] not in ("input", "const", "iota", "literal")]])
    value, da, db = exe([a, b])
    assert (round(float(value), 4), round(float(da), 4), round(float(db), 4)) == (24.7041, 138.8338, 645.5773)
    fused = burjit.compile(burjit.value_and_grad(expression, argnums=(0, 1)))  # the default pipeline
    fused(a, b)
    for ir_text in (exe.llvm_ir(), fused.llvm_ir()):
        (step,) = [f for f in ir_text.split("define ")[1:] if re.search(r'@"?burjit_step"?\(', f.split("\n")[0])]
        assert "br " not in step and "phi " not in step
        assert not re.search(r"call .*@(?!llvm\.(maximum|minimum|fabs|sqrt|fma))", step)  # no libm calls


def _kernels(ir_text):
    """(distinct kernel functions, kernel calls) in a step's raw LLVM IR."""
    return (len(re.findall(r'^define i32 @"?burjit_k', ir_text, re.M)),
            len(re.findall(r'call i32 @"?burjit_k', ir_text)))


def test_kernels_repeated_across_layers_are_one_function():
    counts = {}
    for layers in (2, 3):
        model = burjit.nn.GPT(vocab_size=65, block_size=8, n_layer=layers, n_head=2, d_model=8)
        p = model.init(0)
        step = burjit.compile(lambda p, i: burjit.value_and_grad(model.loss)(p, i, i))
        counts[layers] = _kernels(step.llvm_ir(p, np.zeros((2, 8), np.int64), optimized=False))
    assert counts[3][0] == counts[2][0] and counts[3][1] > counts[2][1] + 50, counts  # a layer adds calls only


def test_stats_report_what_the_build_cost(tmp_path, monkeypatch):
    monkeypatch.setenv("BURJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(objects, "_MEMORY", {})  # kernels other tests compiled are not this build's
    model = burjit.nn.GPT(vocab_size=65, block_size=8, n_layer=2, n_head=2, d_model=8)
    p, idx = model.init(0), np.zeros((2, 8), np.int64)
    built, cached = (burjit.compile(lambda p, i: burjit.value_and_grad(model.loss)(p, i, i)).stats(p, idx)
                     for _ in range(2))
    assert not built["from_cache"] and built["ir_s"] > 0 and built["llvm_s"] > 0 and built["object_bytes"] > 0
    assert 0 < built["kernel_functions"] < built["kernels"]
    assert built["kernels_compiled"] == built["kernel_functions"] == len(built["per_kernel"])
    assert sum(k["calls"] for k in built["per_kernel"]) <= built["kernels"]
    assert all(k["compile_s"] > 0 and k["object_bytes"] > 0 and k["source"] == "compiled" for k in built["per_kernel"])
    assert cached["from_cache"] and cached["llvm_s"] == 0 and cached["kernels_compiled"] == 0
    assert cached["object_bytes"] == built["object_bytes"]
    assert [k["symbol"] for k in cached["per_kernel"]] == [k["symbol"] for k in built["per_kernel"]]


def test_a_changed_shape_or_dtype_is_another_kernel_but_a_changed_batch_is_not():
    """The leading trip count is a kernel argument: rows of 4 at batch 3 and 7 are one kernel,
    rows of 5 or float32 rows are others."""
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s) for s in ((3, 4), (7, 4), (3, 5))] + [rng.standard_normal((3, 4)).astype(np.float32)]
    rows = [rng.standard_normal(x.shape[1]).astype(x.dtype) for x in xs]
    step = burjit.compile(lambda xs, rows: [F.tanh(x + r) * 2.0 for x, r in zip(xs, rows)])
    assert _kernels(step.llvm_ir(xs, rows, optimized=False)) == (3, 4)
    for x, r, got in zip(xs, rows, step(xs, rows)):
        np.testing.assert_allclose(got, np.tanh(x + r) * 2.0, rtol=1e-6)


def test_sums_of_any_batch_share_one_kernel_unless_they_sum_over_it_in_registers():
    """Row sums (over kept rows) and column sums (updating their output row by row) take their
    rows at run time; a sum of everything blocks its register loop by its length, so does not."""
    rng = np.random.default_rng(1)
    f = burjit.compile(lambda x: (F.sum(F.exp(x), axis=1), F.sum(x * 3.0, axis=0), F.sum(F.tanh(x))))
    texts = []
    for rows in (5, 400):
        x = rng.standard_normal((rows, 7))
        texts.append(f.llvm_ir(x, optimized=False))
        for got, want in zip(f(x), (np.exp(x).sum(1), (x * 3.0).sum(0), np.tanh(x).sum())):
            np.testing.assert_allclose(got, want, rtol=1e-12)
    symbols = [set(re.findall(r'^define i32 @"?(burjit_k\w+)', t, re.M)) for t in texts]
    assert len(symbols[0]) == len(symbols[1]) == 3 and len(symbols[0] & symbols[1]) == 2


def test_code_size_does_not_grow_with_the_batch():
    """Outer loops are not unrolled, so a 64x larger batch is about the same code (with them
    unrolled, one layer of BurTorch's GPT had 2.34x the assembly at batch 64; now 1.03x)."""
    model = burjit.nn.GPT(vocab_size=65, block_size=8, n_layer=1, n_head=6, d_model=24, qkv_bias=False,
                          activation="relu", head_bias=True)
    p = model.init(0)
    size = {b: len(burjit.compile(lambda p, i: burjit.value_and_grad(model.loss)(p, i, i)).asm(p, np.zeros((b, 8), np.int64)))
            for b in (1, 64)}
    assert size[64] < 1.25 * size[1], size


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("n", [8, 16, 24, 48, 72, 96])
def test_a_products_register_blocks_cover_its_columns_when_they_can(dtype, n):
    """No column of a product with a multiple of 8 columns is left to the slower i-k-j loop
    (with 24 columns, a third were: BurTorch's GPT products ran 1.5-2x slower)."""
    from burjit.codegen import engine, matmul
    w, nv = matmul._layout(dtype, n)
    assert n % (w * nv) == 0 and nv in (1, 2, 3)
    assert w >= engine.vector_bytes() // np.dtype(dtype).itemsize // 2  # vectors at least half the widest


def test_the_loop_around_a_products_leftover_columns_may_be_unrolled():
    """Its loop over K holds a loop over fewer columns than a register block, which LLVM flattens:
    unrolling it is unrolling an innermost loop (forbidden, GPT steps ran 12-21% more instructions)."""
    a, w = _data("float32", (8, 96), 1), _data("float32", (96, 65), 2)  # a GPT's vocab head: 65 columns
    step = burjit.compile(lambda a, w: a @ w)
    np.testing.assert_allclose(step(a, w), a.astype(np.float64) @ w, rtol=1e-5, atol=1e-4)
    ir_text = step.llvm_ir(a, w, optimized=False)
    nodes = dict(re.findall(r"^(!\d+) = (?:distinct )?!{(.*)}$", ir_text, re.M))
    ids = [ops.split(", ") for ops in nodes.values()]  # a loop ID: itself, its tag, its hints
    loops = [sorted(nodes[h] for h in ops[2:]) for ops in ids if len(ops) > 2 and '"burjit.loop.' in nodes[ops[1]]]
    no_vectorise = '!"llvm.loop.vectorize.enable", i1 false'
    assert [no_vectorise] in loops  # the loop over K: not vectorised, free to unroll
    assert sorted(['!"llvm.loop.unroll.disable"', no_vectorise]) in loops  # rows: neither


def test_elementwise_loops_are_vectorised():
    x = _data("float64", (1000,), 18)
    step = burjit.compile(lambda x, y: F.exp(x) * y + F.tanh(y) - F.log(F.abs(x) + 1.0) + F.softplus(y))
    step(x, x)
    assert re.search(r"<\d+ x double>", step.llvm_ir())
    assert not re.search(r"<\d+ x double>", step.llvm_ir(optimized=False))
    assert "llvm.loop.interleave.count" in step.llvm_ir(optimized=False)
    assert not re.search(r"@(exp|log|log1p|tanh)\b", step.llvm_ir())  # no libm calls
    assert re.search(r"\bv\w+pd\b|\b\w+pd\b", step.asm())


def test_large_scalar_graph_compiles():
    def f(a, b):
        x = a
        for i in range(1500):
            x = F.tanh(x * b + 0.1) if i % 50 == 0 else x * b + a - 0.5 * x
        return x
    compare(f, np.float64(0.3), np.float64(0.7))


def test_straight_line_math_calls_one_shared_function_per_kind(monkeypatch):
    """0-d code calls exp/log/tanh out of line (small IR, fast builds); loops keep them inline."""
    monkeypatch.setenv("BURJIT_TIER", "straight")
    def f(x):
        return F.sum(F.exp(x[0]) + F.exp(x[1]) * F.log(x[2]) + F.tanh(x[0] * x[1]))
    x = np.array([0.3, -1.2, 2.5])
    step = burjit.compile(burjit.value_and_grad(f))
    value, grad = step(x)
    ref_value, ref_grad = burjit.compile(burjit.value_and_grad(f), backend="reference")(x)
    np.testing.assert_allclose(value, ref_value, rtol=1e-13)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-13)
    ir_text = step.llvm_ir(optimized=False)
    assert {"burjit.exp.f64", "burjit.log.f64", "burjit.tanh.f64"} <= set(re.findall(r"define internal double @\"?([\w.]+)", ir_text))
    vector = burjit.compile(lambda v: F.exp(v) * 2.0)
    vector(np.ones(64))
    assert "burjit.exp" not in vector.llvm_ir(optimized=False)
