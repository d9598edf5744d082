"""Loops traced once (burjit/control.py): values against plain Python loops on every backend and
tier, training steps inside a body, and the errors that name the user's line."""

import numpy as np
import pytest

import burjit
from burjit import ops as F
from conftest import need_mlir_tools

TIERS = ("straight", "tape")


def _close(a, b):
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


def _leaves(tree):
    if isinstance(tree, (tuple, list)):
        return [leaf for t in tree for leaf in _leaves(t)]
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in _leaves(tree[k])]
    return [np.asarray(tree)]


@pytest.mark.parametrize("tier", TIERS)
def test_fori_loop_tuple_carry_matches_python(backend, tier):
    def f(a, b):
        def body(i, c):
            x, y = c
            return x * 0.5 + y, y + F.astype(i, "float64") * a
        return burjit.fori_loop(2, 7, body, (a, b))
    a, b = np.array([1.0, 2.0, 3.0]), np.array([0.5, -1.0, 2.0])
    x, y = a.copy(), b.copy()
    for i in range(2, 7):
        x, y = x * 0.5 + y, y + i * a
    _close(burjit.compile(f, backend=backend, tier=tier)(a, b), (x, y))


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("tier", TIERS)
def test_scan_stacks_outputs_and_reads_captured_values(backend, tier, reverse):
    def f(w, xs):
        def body(c, x):  # w is read from the enclosing step: captured once, an operand of the loop
            c2 = F.tanh(c * w + x["u"]) - x["v"]
            return c2, (c2 * 2.0, F.sum(c2))
        return burjit.scan(body, w * 0.0, xs, reverse=reverse)
    w = np.array([0.3, -0.7, 1.1])
    xs = {"u": np.arange(12.0).reshape(4, 3) / 10, "v": np.linspace(0, 1, 12).reshape(4, 3)}
    c, ys, sums = np.zeros(3), [None] * 4, [None] * 4
    for i in (reversed(range(4)) if reverse else range(4)):
        c = np.tanh(c * w + xs["u"][i]) - xs["v"][i]
        ys[i], sums[i] = c * 2.0, c.sum()
    _close(burjit.compile(f, backend=backend, tier=tier)(w, xs), (c, (np.stack(ys), np.array(sums))))


def test_scan_without_xs_nested_loops_and_zero_trips(backend):
    def f(x):
        def body(c, _):
            return burjit.fori_loop(0, 3, lambda i, d: d * 1.5 + 1.0, c), F.sum(c)
        out, sums = burjit.scan(body, x, None, length=4)
        return out, sums, burjit.fori_loop(5, 5, lambda i, c: c * 0.0, x)
    x = np.array([0.25, -2.0])
    c, sums = x.copy(), []
    for _ in range(4):
        sums.append(c.sum())
        for _ in range(3):
            c = c * 1.5 + 1.0
    _close(burjit.compile(f, backend=backend)(x), (c, np.array(sums), x))


def _model(p, x, y):
    h = F.tanh(x @ p["w1"] + p["b1"])
    return F.mean((h @ p["w2"] - y) ** 2)


def _params(rng):
    return {"w1": rng.normal(size=(3, 8)), "b1": np.zeros(8), "w2": rng.normal(size=(8, 1))}


def _sgd(p, x, y):
    loss, g = burjit.value_and_grad(_model)(p, x, y)
    return {k: p[k] - 0.1 * g[k] for k in p}, loss


@pytest.mark.parametrize("tier", TIERS)
def test_an_epoch_of_training_steps_in_one_call_matches_one_call_per_step(backend, tier):
    """value_and_grad + SGD per minibatch inside scan, the parameters donated: the same
    parameters and losses as one compiled step per minibatch."""
    rng = np.random.default_rng(0)
    xs, ys = rng.normal(size=(6, 5, 3)), rng.normal(size=(6, 5, 1))
    epoch = burjit.compile(lambda p, xs, ys: burjit.scan(lambda p, b: _sgd(p, *b), p, (xs, ys)),
                           backend=backend, tier=tier, donate_argnums=0)
    step = burjit.compile(_sgd, backend=backend, tier=tier, donate_argnums=0)
    p, losses = _params(rng), []
    q = {k: v.copy() for k, v in p.items()}
    for x, y in zip(xs, ys):
        p, loss = step(p, x, y)
        losses.append(loss)
    q, q_losses = epoch(q, xs, ys)
    _close((q, q_losses), (p, np.array(losses)))
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("backend", ["native", "mlir"])
def test_an_index_out_of_range_in_a_body_raises_and_changes_no_parameter(backend):
    if backend == "mlir":
        need_mlir_tools()

    def f(p, idx):
        def body(p, i):
            row = F.take(p["table"], i)
            return {"table": p["table"] * 0.5, "acc": p["acc"] + row}, F.sum(row)
        return burjit.scan(body, p, idx)
    step = burjit.compile(f, donate_argnums=0, backend=backend)
    p = {"table": np.arange(6.0).reshape(3, 2), "acc": np.zeros(2)}
    before = {k: v.copy() for k, v in p.items()}
    good, _ = step(p, np.array([0, 2, 1]))
    p = {k: v.copy() for k, v in before.items()}
    with pytest.raises(IndexError, match=r"out of range.*in the loop at .*test_loops.py"):
        step(p, np.array([0, 1, 5]))
    _close(p, before)
    np.testing.assert_allclose(good["acc"], [0 + 2.0 + 0.5, 1 + 2.5 + 0.75])  # the table halves per row read


def test_poisoned_arena_gives_the_same_values(monkeypatch):
    monkeypatch.setenv("BURJIT_POISON_ARENA", "1")
    rng = np.random.default_rng(1)
    xs, ys = rng.normal(size=(3, 4, 3)), rng.normal(size=(3, 4, 1))
    fn = lambda p, xs, ys: burjit.scan(lambda p, b: _sgd(p, *b), p, (xs, ys))  # noqa: E731
    p = _params(rng)
    _close(burjit.compile(fn)(p, xs, ys), burjit.compile(fn, backend="reference")(p, xs, ys))


def _error(fn, *args, match):
    with pytest.raises(burjit.TracingError, match=match) as e:
        burjit.compile(fn)(*args)
    assert "test_loops.py" in str(e.value)
    return str(e.value)


def test_carry_that_changes_shape_or_dtype_names_the_line():
    x = np.ones(3)
    _error(lambda x: burjit.fori_loop(0, 2, lambda i, c: F.sum(c), x), x, match=r"carry leaf 0 .*float64\[3\].*\[\]")
    _error(lambda x: burjit.fori_loop(0, 2, lambda i, c: F.astype(c, "float32"), x), x,
           match="keeps its shape and dtype")
    _error(lambda x: burjit.fori_loop(0, 2, lambda i, c: (c, c), x), x, match="another structure")


def test_bad_loop_arguments_name_the_line():
    x = np.ones(3)
    _error(lambda x, n: burjit.fori_loop(0, n, lambda i, c: c, x), x, np.float64(3), match=r"upper must be a Python int or a "
           r"traced integer scalar, got a traced float64\[\]")
    _error(lambda x: burjit.fori_loop(0.5, 2, lambda i, c: c, x), x, match="lower must be .* got float")
    _error(lambda x: burjit.scan(lambda c, r: (c, r), x, (np.ones((2, 3)), np.ones((3, 3)))), x,
           match="disagree on the number of iterations: 2, 3")
    _error(lambda x: burjit.scan(lambda c, r: (c, r), x, np.ones((2, 3)), length=5), x, match="2, 5")
    _error(lambda x: burjit.scan(lambda c, r: (c, r), x), x, match="give length")
    _error(lambda x: burjit.scan(lambda c, r: c, x, length=2), x, match=r"must return \(carry, y\)")


@pytest.mark.parametrize("tier", TIERS)
def test_fori_loop_with_traced_bounds_compiles_once_for_every_count(backend, tier):
    step = burjit.compile(lambda x, lo, hi: burjit.fori_loop(lo, hi, lambda i, c: c * 2.0 + F.astype(i, "float64"), x),
                          backend=backend, tier=tier)
    for lo, hi in ((0, 3), (2, 7), (5, 5), (4, 1)):
        expect = np.ones(2)
        for i in range(lo, hi):
            expect = expect * 2.0 + i
        _close(step(np.ones(2), np.int64(lo), np.int32(hi)), expect)
    assert len(step._cache) == 1  # the counts are arguments, not part of the signature
    _error(burjit.grad(lambda x, n: F.sum(burjit.fori_loop(0, n, lambda i, c: c * c, x))), np.ones(2), np.int64(2),
           match="while_loop has no trip count")


def test_python_loop_over_a_traced_bound_points_to_fori_loop():
    def f(x, n):
        for _ in range(n):
            x = x * 2.0
        return x
    _error(f, np.ones(2), np.int64(3), match="fori_loop")


def test_a_loop_step_loads_from_the_disk_cache_with_its_body(tmp_path, monkeypatch):
    monkeypatch.setenv("BURJIT_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(2)
    xs, ys = rng.normal(size=(3, 4, 3)), rng.normal(size=(3, 4, 1))
    fn = lambda p, xs, ys: burjit.scan(lambda p, b: _sgd(p, *b), p, (xs, ys))  # noqa: E731
    p = _params(rng)
    first, second = burjit.compile(fn), burjit.compile(fn)
    a = first(p, xs, ys)
    assert not first.stats(p, xs, ys)["from_cache"]
    del first
    b = second(p, xs, ys)
    stats = second.stats(p, xs, ys)
    assert stats["from_cache"] and stats["kernel_functions"] > 0  # the body's kernels (its step is in the driver)
    _close(a, b)


def test_the_moons_example_runs_k_steps_per_call_with_the_same_numbers(capsys):
    import runpy
    from pathlib import Path
    main = runpy.run_path(str(Path(__file__).parents[1] / "examples" / "micrograd_mlp.py"))["main"]
    runs = []
    for k in (1, 7):
        acc = main(["--steps", "30", "--steps-per-call", str(k)])
        runs.append((acc, capsys.readouterr().out))
    assert runs[0] == runs[1] and runs[0][1].count("\n") == 4  # steps 0, 10, 20, 29


@pytest.mark.parametrize("tier", TIERS)
def test_while_loop_matches_python_and_may_run_no_iteration(backend, tier):
    def f(x, lim):  # (steps, x): doubles x until its sum reaches lim, lim read from the step
        return burjit.while_loop(lambda c: F.sum(c[1]) < lim, lambda c: (c[0] + 1.0, c[1] * 2.0),
                                 (F.sum(x) * 0.0, x))
    step = burjit.compile(f, backend=backend, tier=tier)
    for lim in (100.0, 1.0, 1.5):
        n, x = 0.0, np.array([0.5, 1.0])
        while x.sum() < lim:
            n, x = n + 1.0, x * 2.0
        _close(step(np.array([0.5, 1.0]), np.float64(lim)), (np.float64(n), x))


def test_while_loop_inside_scan_newton_square_roots(backend):
    def f(a):
        def sqrt(c, v):
            x = burjit.while_loop(lambda x: F.abs(x * x - v) > 1e-12 * v, lambda x: 0.5 * (x + v / x), v)
            return c + x, x
        return burjit.scan(sqrt, F.sum(a) * 0.0, a)
    a = np.array([2.0, 9.0, 0.25, 1e6])
    total, roots = burjit.compile(f, backend=backend)(a)
    np.testing.assert_allclose(roots, np.sqrt(a), rtol=1e-12)
    np.testing.assert_allclose(total, np.sqrt(a).sum(), rtol=1e-12)


def test_while_loop_condition_must_be_a_bool_scalar():
    x = np.ones(3)
    _error(lambda x: burjit.while_loop(lambda c: F.sum(c), lambda c: c * 0.5, x), x,
           match=r"cond_fun must return a bool scalar, got float64\[\]")
    _error(lambda x: burjit.while_loop(lambda c: c > 0.5, lambda c: c * 0.5, x), x, match=r"got bool\[3\]")


@pytest.mark.parametrize("tier", TIERS)
def test_a_carry_of_several_dtypes_adamw_with_its_int_step_count(backend, tier, monkeypatch):
    """float32 parameters, AdamW's int64 step count and stacked float32 / int64 outputs share
    the loop's packed vector; the same numbers as one compiled step per minibatch."""
    from burjit import optim
    monkeypatch.setenv("BURJIT_POISON_ARENA", "1")
    opt = optim.adamw(1e-2)

    def train(p, s, x):
        loss, g = burjit.value_and_grad(lambda p: F.sum((p["w"] * x - 1.0) ** 2))(p)
        p, s = opt.update(p, g, s)
        return p, s, loss

    def epoch(p, s, xs):
        def body(c, x):
            p, s, loss = train(*c, x)
            return (p, s), (loss, s["step"])
        return burjit.scan(body, (p, s), xs)
    p = {"w": np.array([0.5, 2.0, -1.0], np.float32)}
    xs = np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3)
    (q, t), (losses, counts) = burjit.compile(epoch, backend=backend, tier=tier)(p, opt.init(p), xs)
    step = burjit.compile(train, backend=backend, tier=tier)
    s, expect = opt.init(p), []
    for x in xs:
        p, s, loss = step(p, s, x)
        expect.append(loss)
    assert q["w"].dtype == np.float32 and counts.dtype == np.int64 and t["step"] == 5
    _close((q, t), (p, s))
    _close(losses, np.array(expect, np.float32))
    np.testing.assert_array_equal(counts, [1, 2, 3, 4, 5])


def test_while_loop_with_an_int_counter(backend):
    def f(x):
        return burjit.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 2.0), (np.int64(0), x))
    n, x = burjit.compile(f, backend=backend)(np.ones(3))
    assert n == 5 and n.dtype == np.int64
    _close(x, np.full(3, 32.0))


def test_gradients_through_a_while_loop_refuse():
    def until(x):
        return F.sum(burjit.while_loop(lambda c: F.sum(c) < 10.0, lambda c: c * 2.0, x))
    _error(burjit.grad(until), np.ones(2), match="while_loop has no trip count")


# -- reverse mode through loops (burjit/loop_reverse.py) ----------------------------------------

def _rnn(reverse):
    def f(w, u, xs):
        def cell(h, x):
            h2 = F.tanh(h * w + x * u)
            return h2, F.sum(h2 * h2)
        h, ys = burjit.scan(cell, w * 0.0, xs, reverse=reverse)
        return F.sum(h) + F.sum(ys * ys)

    def unrolled(w, u, xs):
        h, ys = w * 0.0, []
        for k in (reversed(range(xs.shape[0])) if reverse else range(xs.shape[0])):
            h = F.tanh(h * w + xs[k] * u)
            ys.append(F.sum(h * h))
        return F.sum(h) + sum(y * y for y in ys)
    return f, unrolled


def _fd(f, args, k, eps=1e-6):
    """Central finite differences of scalar f in argument k."""
    out = np.zeros_like(args[k])
    for j in np.ndindex(args[k].shape):
        hi, lo = [a.copy() for a in args], [a.copy() for a in args]
        hi[k][j] += eps
        lo[k][j] -= eps
        out[j] = (f(*hi) - f(*lo)) / (2 * eps)
    return out


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("tier", TIERS)
def test_grad_through_scan_equals_unrolled_and_finite_differences(backend, tier, reverse):
    f, unrolled = _rnn(reverse)
    rng = np.random.default_rng(3)
    args = [rng.normal(size=3), rng.normal(size=3), rng.normal(size=(5, 3))]
    g = burjit.compile(burjit.grad(f, argnums=(0, 1, 2)), backend=backend, tier=tier)(*args)
    _close(g, burjit.compile(burjit.grad(unrolled, argnums=(0, 1, 2)), backend=backend, tier=tier)(*args))
    value = burjit.compile(f, backend="reference")
    for k in range(3):
        np.testing.assert_allclose(g[k], _fd(lambda *a: float(value(*a)), args, k), rtol=1e-6, atol=1e-8)


def _mixed(unroll, small):
    """A loop whose carry mixes dtypes (an int64 counter, a float64 state, a `small` state; `small`
    outputs stacked, int64 ones too): its leaves are packed words (control.PACKED)."""
    def cell(c, x):
        n, h, s = c
        h2 = F.tanh(h * x + F.astype(n, "float64") * 0.1)
        s2 = s * F.astype(F.sum(h2), small) + 0.5
        return (n + 1, h2, s2), (F.astype(h2 * h2, small), n * 2)

    def f(h0, s0, xs):
        c = (np.int64(1), h0, s0)
        if unroll:
            ys = []
            for k in range(xs.shape[0]):
                c, y = cell(c, xs[k])
                ys.append(F.sum(y[0]))
            ys = sum(ys)
        else:
            c, (ys, _) = burjit.scan(cell, c, xs)
        return F.sum(c[1]) + F.astype(F.sum(c[2]) + F.sum(ys), "float64")
    return f


@pytest.mark.parametrize("small", ["float32", "float64"])
@pytest.mark.parametrize("tier", TIERS)
def test_grad_through_a_loop_of_several_dtypes_equals_unrolled_and_finite_differences(backend, tier, small):
    rng = np.random.default_rng(5)
    args = [rng.normal(size=3), (rng.normal(size=2) * 0.5).astype(small), rng.normal(size=(4, 3))]
    grad = burjit.compile(burjit.grad(_mixed(False, small), argnums=(0, 1, 2)), backend=backend, tier=tier)
    g = grad(*args)
    assert [x.dtype for x in g] == [np.float64, np.dtype(small), np.float64]
    unrolled = burjit.compile(burjit.grad(_mixed(True, small), argnums=(0, 1, 2)), backend=backend, tier=tier)
    for x, y in zip(g, unrolled(*args), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5 if small == "float32" else 1e-12, atol=1e-6 if small == "float32" else 1e-12)
    if small == "float64":  # finite differences of float32 values are mostly rounding
        value = burjit.compile(_mixed(False, small), backend="reference")
        for k in range(3):
            np.testing.assert_allclose(g[k], _fd(lambda *a: float(value(*a)), args, k), rtol=1e-6, atol=1e-8)


def test_grad_through_an_unrolled_optimiser_with_respect_to_the_start(backend, monkeypatch):
    """fori_loop of SGD steps on a quadratic, differentiated w.r.t. the starting point and a
    captured scale: meta-gradients, checked against the same loop unrolled in Python (under
    the poisoned arena: the stored carries and the adjoint's carry must not overlap)."""
    monkeypatch.setenv("BURJIT_POISON_ARENA", "1")
    target = np.array([1.0, -2.0, 0.5])

    def inner(p, s):
        return F.sum(s * (p - target) ** 2)

    def after(p0, s, unroll):
        def step(i, p):
            return p - 0.1 * burjit.grad(inner)(p, s)
        p = p0
        if unroll:
            for i in range(4):
                p = step(i, p)
        else:
            p = burjit.fori_loop(0, 4, step, p0)
        return F.sum(p * p) + F.sum(s * p)
    args = (np.array([0.3, 0.2, -0.1]), np.array([1.0, 2.0, 0.5]))
    g = burjit.compile(burjit.grad(lambda p, s: after(p, s, False), argnums=(0, 1)), backend=backend)(*args)
    _close(g, burjit.compile(burjit.grad(lambda p, s: after(p, s, True), argnums=(0, 1)), backend=backend)(*args))


def test_grad_through_nested_loops_and_a_tuple_carry(backend):
    def f(a, b):
        def outer(c, _):
            x, y = c
            x = burjit.fori_loop(0, 2, lambda i, z: F.tanh(z) * y, x)
            return (x + y, y * 0.9), F.sum(x)
        (x, y), s = burjit.scan(outer, (a, b), None, length=3)
        return F.sum(x * y) + F.sum(s)

    def unrolled(a, b):
        x, y, total = a, b, 0.0
        for _ in range(3):
            for _ in range(2):
                x = F.tanh(x) * y
            total = total + F.sum(x)
            x, y = x + y, y * 0.9
        return F.sum(x * y) + total
    args = (np.array([0.2, -0.4]), np.array([1.1, 0.7]))
    g = burjit.compile(burjit.grad(f, argnums=(0, 1)), backend=backend)(*args)
    _close(g, burjit.compile(burjit.grad(unrolled, argnums=(0, 1)), backend=backend)(*args))


def test_memory_plan_states_what_reverse_mode_stores():
    f, _ = _rnn(False)
    rng = np.random.default_rng(4)
    args = [rng.normal(size=3), rng.normal(size=3), rng.normal(size=(7, 3))]
    loops = burjit.compile(burjit.grad(f, argnums=(0, 1, 2))).memory_plan(*args)["loops"]
    roles = sorted(r["role"] for r in loops.values())
    assert roles == ["adjoint", "loop"], loops
    (stored,) = [r for r in loops.values() if r["role"] == "loop"]
    assert stored["iterations"] == 7 and stored["stored_carry_bytes"] == 8 * 7 * 3  # the carry entering each iteration
    assert stored["vector_bytes"] == 8 * (3 + 7 + 7 * 3)  # final carry, its 7 outputs, then the 7 carries
    assert all(r["body_arena_bytes"] > 0 and "test_loops.py" in r["src"] for r in loops.values())


def test_second_order_gradients_through_scan_equal_unrolled(backend):
    """grad of grad: the adjoint scan is differentiated in turn, and the loop whose carries
    are already stored is differentiated again (reusing them)."""
    def f(w, xs):
        h, ys = burjit.scan(lambda h, x: (F.tanh(h * w + x), F.sum(h)), w * 0.0, xs)
        return F.sum(h) + F.sum(ys)

    def unrolled(w, xs):
        h, total = w * 0.0, 0.0
        for k in range(xs.shape[0]):
            total = total + F.sum(h)
            h = F.tanh(h * w + xs[k])
        return F.sum(h) + total
    w, xs = np.array([0.7, -0.3]), np.linspace(-1, 1, 8).reshape(4, 2)
    second = [burjit.compile(burjit.grad(lambda w, xs: F.sum(burjit.grad(g)(w, xs) ** 2)), backend=backend)(w, xs)
              for g in (f, unrolled)]
    _close(*second)


@pytest.mark.parametrize("tier", TIERS)
def test_grad_through_a_loop_of_scalar_code(backend, tier):
    """BurTorch's exp1 as a loop body of 0-d ops (a scalar region on the tape tier, replayed
    record by record by the adjoint): descent steps on it, differentiated w.r.t. the start."""
    def tiny(a, b):
        e = (a + b) - (a * b + b ** 3)
        return e * e / 2.0

    def run(x, unroll):
        def step(i, c):
            a, b = c
            ga, gb = burjit.grad(tiny, argnums=(0, 1))(a, b)
            return a - 1e-4 * ga, b - 1e-4 * gb
        c = (x[0], x[1])
        if unroll:
            for i in range(3):
                c = step(i, c)
        else:
            c = burjit.fori_loop(0, 3, step, c)
        return tiny(*c)
    x = np.array([-4.1, 0.2])
    got = burjit.compile(burjit.grad(lambda x: run(x, False)), backend=backend, tier=tier)(x)
    _close(got, burjit.compile(burjit.grad(lambda x: run(x, True)), backend=backend, tier=tier)(x))


EDGES = {
    "empty carry": (lambda x: (burjit.fori_loop(0, 3, lambda i, c: c, ()), x * 2.0), (np.ones(2),)),
    "None carry": (lambda x: (burjit.fori_loop(0, 3, lambda i, c: c, None), x * 2.0), (np.ones(2),)),
    "scan y None": (lambda x: burjit.scan(lambda c, r: (c + r, None), x, np.ones((3, 2))), (np.ones(2),)),
    "scan of no rows": (lambda x, xs: burjit.scan(lambda c, r: (c + r, c * 2.0), x, xs), (np.ones(2), np.ones((0, 2)))),
    "while never": (lambda x: burjit.while_loop(lambda c: c[0] > 5, lambda c: (c[0] + 1, c[1] * 2.0), (np.int64(0), x)),
                    (np.ones(2),)),
    "int carry only": (lambda x: burjit.scan(lambda c, r: (c + 1, c), np.int64(0), x), (np.ones((3, 2)),)),
    "bool and float carry": (lambda x: burjit.fori_loop(0, 3, lambda i, c: (c[0] | (F.sum(c[1]) > 2.0), c[1] * 2.0),
                                                       (F.sum(x) > 100.0, x)), (np.ones(2),)),
    "0-d carry": (lambda x: burjit.fori_loop(0, 4, lambda i, c: c * 2.0 + 1.0, F.sum(x)), (np.ones(2),)),
    "upper below lower": (lambda x: burjit.fori_loop(3, 1, lambda i, c: c + 1.0, x), (np.ones(2),)),
}


@pytest.mark.parametrize("tier", TIERS + ("mlir",))
@pytest.mark.parametrize("case", sorted(EDGES))
def test_edge_cases_match_the_reference(case, tier):
    fn, args = EDGES[case]
    expected = burjit.compile(fn, backend="reference")(*args)
    if tier == "mlir":
        need_mlir_tools()
    got = burjit.compile(fn, **({"backend": "mlir"} if tier == "mlir" else {"tier": tier}))(*args)
    for a, b in zip(_leaves(got), _leaves(expected), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_the_graph_listing_shows_each_body_below_its_loop():
    step = burjit.compile(lambda w, xs: burjit.scan(lambda c, x: (F.tanh(c * w + x), F.sum(c)), w * 0.0, xs))
    text = str(step.graph(np.ones(3), np.ones((4, 3))))
    head = next(line for line in text.splitlines() if "= loop[" in line)
    assert "body(length=4, start=0, reverse=False)" in head
    body = text.splitlines()[text.splitlines().index(head) + 1:]
    assert body[0].startswith("      { lambda ") and any("tanh" in line for line in body)
