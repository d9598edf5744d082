"""The tracer, autodiff and front door: values, gradients, pytrees, caching, donation, errors."""

import os
import re
import runpy
import subprocess
import sys

import numpy as np
import pytest

import burjit
from burjit import ops as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_micrograd_expression(backend):
    expression = runpy.run_path(os.path.join(ROOT, "examples", "micrograd_expr.py"))["expression"]
    step = burjit.compile(burjit.value_and_grad(expression, argnums=(0, 1)), backend=backend)
    g, (da, db) = step(np.float64(-4.0), np.float64(2.0))
    assert round(float(g), 4) == 24.7041
    assert round(float(da), 4) == 138.8338
    assert round(float(db), 4) == 645.5773


def test_micrograd_example_prints_values():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "micrograd_expr.py")],
                         capture_output=True, text=True, check=True).stdout
    assert "g     = 24.7041" in out and "dg/da = 138.8338" in out and "dg/db = 645.5773" in out


def _mlp_init(rng, sizes):
    return [{"w": rng.uniform(-1, 1, (i, o)), "b": np.zeros(o)} for i, o in zip(sizes, sizes[1:])]


def _mlp(params, x):
    for k, layer in enumerate(params):
        x = x @ layer["w"] + layer["b"]
        x = F.tanh(x) if k < len(params) - 1 else x
    return x


def test_mlp_training_step_lowers_loss(backend):
    rng = np.random.default_rng(0)
    params = _mlp_init(rng, [2, 16, 16, 1])
    x = rng.normal(size=(32, 2))
    y = np.sign(x[:, :1] * x[:, 1:])

    @burjit.compile(backend=backend, donate_argnums=0)
    def step(params, x, y):
        loss, g = burjit.value_and_grad(lambda p: F.mean(F.relu(1 - y * _mlp(p, x))))(params)
        return [{k: p[k] - 0.05 * gp[k] for k in p} for p, gp in zip(params, g)], loss

    ids = [id(layer["w"]) for layer in params]
    losses = [float(step(params, x, y)[1]) for _ in range(60)]
    assert losses[-1] < 0.7 * losses[0]
    assert [id(layer["w"]) for layer in params] == ids  # updated in place, same arrays


def test_donated_outputs_are_the_input_arrays():
    @burjit.compile(donate_argnums=0, backend="reference")
    def step(p, x):
        return {"w": p["w"] + x}, F.sum(x)

    p = {"w": np.zeros(3)}
    new_p, s = step(p, np.ones(3))
    assert new_p["w"] is p["w"] and np.array_equal(p["w"], np.ones(3)) and float(s) == 3.0


def test_failed_step_leaves_donated_buffers_untouched(backend):
    @burjit.compile(donate_argnums=0, backend=backend)
    def step(p, idx):
        return {"e": p["e"] - F.take(p["e"], idx).sum() * 0.1}, F.sum(p["e"])

    p = {"e": np.arange(6.0).reshape(3, 2)}
    before = p["e"].copy()
    with pytest.raises(IndexError):
        step(p, np.array([0, 3]))
    assert np.array_equal(p["e"], before)
    step(p, np.array([0, 2]))
    assert not np.array_equal(p["e"], before)


def test_donation_needs_a_matching_output():
    step = burjit.compile(lambda p: F.sum(p), donate_argnums=0)
    with pytest.raises(burjit.TracingError, match="donate_argnums"):
        step(np.ones(2))


def test_pytrees_in_and_out(backend):
    @burjit.compile(backend=backend)
    def f(tree):
        return {"s": tree["a"] + tree["b"][0], "t": (tree["b"][1] * 2, [tree["a"]])}

    out = f({"b": [np.ones(2), np.float32(3)], "a": np.arange(2.0)})
    assert set(out) == {"s", "t"} and isinstance(out["t"], tuple) and isinstance(out["t"][1], list)
    np.testing.assert_array_equal(out["s"], [1.0, 2.0])
    assert out["t"][0].dtype == np.float32 and float(out["t"][0]) == 6.0


def test_cache_retraces_on_new_shape_and_static_value():
    traces = []

    @burjit.compile(backend="reference")
    def f(x, scale):
        traces.append(x.shape)
        return x * scale

    f(np.ones(2), 2.0)
    f(np.zeros(2), 2.0)
    assert len(traces) == 1
    np.testing.assert_array_equal(f(np.ones(3), 2.0), [2.0] * 3)
    np.testing.assert_array_equal(f(np.ones(3), 5.0), [5.0] * 3)
    assert len(traces) == 3


def test_grad_eagerly_and_of_pytrees():
    g = burjit.grad(lambda p: F.sum(p["a"] ** 2) + p["b"][0] * 3.0)({"a": np.array([1.0, -2.0]), "b": [np.float64(1.0)]})
    np.testing.assert_allclose(g["a"], [2.0, -4.0])
    assert float(g["b"][0]) == 3.0


def test_grad_has_aux_and_unused_argument():
    f = burjit.value_and_grad(lambda x, y: (F.sum(x * x), x + 1), argnums=(0, 1), has_aux=True)
    (loss, aux), (gx, gy) = f(np.array([1.0, 2.0]), np.array([5.0]))
    assert float(loss) == 5.0
    np.testing.assert_allclose(aux, [2.0, 3.0])
    np.testing.assert_allclose(gx, [2.0, 4.0])
    np.testing.assert_allclose(gy, [0.0])


def test_second_order_through_slice_and_take():
    """grad of grad exercises the VJPs of pad and scatter_add (the adjoints of slice and take)."""
    def inner(x):
        return F.sum(F.take(x, np.array([0, 2, 2])) ** 3) + F.sum(x[1:] ** 2)
    hvp = burjit.grad(lambda x: F.sum(burjit.grad(inner)(x) * np.array([1.0, 2.0, 3.0])))
    x = np.array([0.5, -1.0, 2.0])
    # d/dx of [3x0^2, 2x1, 6x2^2 + 2x2] . [1, 2, 3] = [6x0, 4, 36x2 + 6]
    np.testing.assert_allclose(hvp(x), [3.0, 4.0, 78.0])


def test_grad_is_taken_only_through_the_argument():
    def f(p):
        return burjit.grad(lambda q: F.sum(q * p))(p)  # p inside is a constant for d/dq
    np.testing.assert_allclose(burjit.compile(f, backend="reference")(np.array([2.0, 3.0])), [2.0, 3.0])


def test_convert_cotangent_keeps_input_dtype():
    g = burjit.grad(lambda x: F.sum(F.astype(x, "float32") * np.float32(2)))(np.ones(3))
    assert g.dtype == np.float64
    np.testing.assert_array_equal(g, [2.0, 2.0, 2.0])


@pytest.mark.parametrize("through", ["int32", "int64", "bool"])
def test_no_gradient_through_a_cast_to_int_or_bool(backend, through):
    """Rounding to an integer is flat almost everywhere: its slope is 0 (as in jax), not 1."""
    f = lambda x: F.sum(F.astype(F.astype(x, through), "float64") * 3.7) + F.sum(F.astype(x, "float32"))
    g = burjit.compile(burjit.grad(f), backend=backend)(np.array([0.4, 1.6, -2.5]))
    np.testing.assert_array_equal(g, [1.0, 1.0, 1.0])


def test_pow_gradients_at_zero_base_and_exponent(backend):
    """d/dy x^y at x = 0 is 0 (not 0 * log 0) and d/dx x^0 is 0 (not 0 * 0^-1), as in jax and torch."""
    x, y = np.array([0.0, 0.0, 2.0, 0.0]), np.array([2.0, 3.0, 3.0, 0.0])
    gx, gy = burjit.compile(burjit.grad(lambda x, y: F.sum(x ** y), argnums=(0, 1)), backend=backend)(x, y)
    np.testing.assert_allclose(gy, [0.0, 0.0, 8 * np.log(2.0), 0.0])
    np.testing.assert_allclose(gx, [0.0, 0.0, 12.0, 0.0])


def test_logsumexp_of_infinite_rows(backend):
    """As jax, torch and scipy: all -inf gives -inf, a +inf anywhere gives inf, nan stays nan."""
    x = np.array([[-np.inf, -np.inf], [0.0, np.inf], [1.0, -np.inf], [np.nan, 1.0], [-np.inf, np.inf]])
    got = burjit.compile(lambda x: F.logsumexp(x, -1), backend=backend)(x)
    np.testing.assert_array_equal(got, [-np.inf, np.inf, 1.0, np.nan, np.inf])


def test_softplus_sigmoid_stay_finite_far_out():
    g = burjit.grad(lambda x: F.sum(F.softplus(x) + F.sigmoid(x)))(np.array([-800.0, 0.0, 800.0]))
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, [0.0, 0.75, 1.0])


def test_graph_printer_lists_one_op_per_line():
    step = burjit.compile(lambda x: F.exp(x) * 2.0, backend="reference")
    text = str(step.graph(np.ones((2, 3), np.float32)))
    lines = text.splitlines()
    assert lines[0].startswith("{ lambda %0:f32[2,3]")
    assert any("= exp %0" in ln for ln in lines) and lines[-1].startswith("  in (")


# -- errors point at the user's line ------------------------------------------------------------

def _line_of(fn, needle):
    import inspect
    src, start = inspect.getsourcelines(fn)
    return start + next(i for i, s in enumerate(src) if needle in s)


def test_python_if_on_tracer_names_the_line():
    def f(x):
        if x > 0:  # the offending line
            return x
        return -x
    with pytest.raises(burjit.TracingError) as e:
        burjit.compile(f)(np.ones(2))
    assert f"test_frontend.py:{_line_of(f, 'if x > 0')}" in str(e.value) and "bool()" in str(e.value)


@pytest.mark.parametrize("use", [float, int, bool])
def test_float_int_bool_of_tracer_refused(use):
    with pytest.raises(burjit.TracingError, match=use.__name__):
        burjit.compile(lambda x: use(x))(np.float64(1.0))


def test_while_on_tracer_refused():
    def f(x):
        while x < 3:
            x = x + 1
        return x
    with pytest.raises(burjit.TracingError, match="control flow"):
        burjit.compile(f)(np.float64(1.0))


def test_shape_mismatch_names_both_shapes_and_line():
    def f(a, b):
        return a + b  # mismatch
    with pytest.raises(burjit.ShapeError) as e:
        burjit.compile(f)(np.ones((2, 3)), np.ones((4,)))
    msg = str(e.value)
    assert "(2, 3)" in msg and "(4,)" in msg and f"test_frontend.py:{_line_of(f, 'a + b')}" in msg


def test_matmul_mismatch_message():
    with pytest.raises(burjit.ShapeError, match=r"\(2, 3\) and \(4, 5\)"):
        burjit.compile(lambda a, b: a @ b)(np.ones((2, 3)), np.ones((4, 5)))


@pytest.mark.parametrize("dtype", [np.float16, np.complex64, np.uint8])
def test_unsupported_dtypes_refused(dtype):
    with pytest.raises(burjit.TracingError, match="dtype"):
        burjit.compile(lambda x: x * 2)(np.ones(2, dtype))


def test_leaked_tracer_is_refused():
    leaked = []
    burjit.compile(lambda x: leaked.append(x) or x, backend="reference")(np.ones(2))
    with pytest.raises(burjit.TracingError, match="another"):
        burjit.compile(lambda y: y + leaked[0], backend="reference")(np.ones(2))


def test_grad_of_non_scalar_refused():
    with pytest.raises(burjit.TracingError, match="scalar"):
        burjit.grad(lambda x: x * 2)(np.ones(3))


def test_static_index_out_of_range():
    with pytest.raises(IndexError, match="out of range"):
        burjit.compile(lambda x: x[5])(np.ones(3))


def test_non_contiguous_input_is_copied(backend):
    x = np.arange(12.0).reshape(3, 4).T
    np.testing.assert_array_equal(burjit.compile(lambda a: a * 1.0, backend=backend)(x), x)


def test_mixed_precision_promotes_like_numpy(backend):
    out = burjit.compile(lambda a, b: (a + b, a * 2.0, a + 1), backend=backend)(
        np.ones(2, np.float32), np.ones(2, np.float64))
    assert [o.dtype for o in out] == [np.float64, np.float32, np.float32]


def test_scalar_mlp_micrograd_style(backend):
    """A 2-16-16-1 MLP written neuron by neuron on 0-d values, as in micrograd, trains."""
    rng = np.random.default_rng(1)
    sizes = [2, 16, 16, 1]
    params = [[[np.float64(v) for v in rng.uniform(-1, 1, i + 1)] for _ in range(o)]
              for i, o in zip(sizes, sizes[1:])]
    xs = rng.uniform(-1, 1, (8, 2)).tolist()  # Python floats: static data, baked into the code
    ys = [1.0 if a * b > 0 else -1.0 for a, b in xs]

    def forward(params, x):
        for k, layer in enumerate(params):
            x = [sum((wi * xi for wi, xi in zip(n[:-1], x)), n[-1]) for n in layer]
            x = [F.tanh(v) for v in x] if k < len(params) - 1 else x
        return x[0]

    def loss(params):
        return sum(F.relu(1.0 - y * forward(params, x)) for x, y in zip(xs, ys)) * (1.0 / len(xs))

    @burjit.compile(backend=backend)
    def step(params):
        value, g = burjit.value_and_grad(loss)(params)
        return [[[w - 0.05 * gw for w, gw in zip(n, gn)] for n, gn in zip(layer, gl)]
                for layer, gl in zip(params, g)], value

    losses = []
    for _ in range(15):
        params, value = step(params)
        losses.append(float(value))
    assert losses[-1] < 0.8 * losses[0]


def test_numpy_functions_on_tracers_trace(backend):
    @burjit.compile(backend=backend)
    def f(x):
        return np.exp(x) + np.ones(2) * x, np.sum(x, axis=0), np.maximum(x, 0.5)

    x = np.array([0.0, 1.0])
    a, s, m = f(x)
    np.testing.assert_allclose(a, np.exp(x) + x)
    assert float(s) == 1.0
    np.testing.assert_allclose(m, [0.5, 1.0])


def test_unsupported_numpy_function_is_a_clear_error():
    with pytest.raises(burjit.TracingError, match="numpy.sort"):
        burjit.compile(lambda x: np.sort(x))(np.ones(3))


def test_burjit_numpy_module():
    import burjit.numpy as bnp
    assert bnp.softmax is F.softmax


def test_same_array_twice_is_fine_unless_donated():
    step = burjit.compile(lambda p, a, b: (p + a * b, F.sum(a)), donate_argnums=0, backend="reference")
    x = np.ones(2)
    p, _ = step(np.zeros(2), x, x)
    np.testing.assert_array_equal(p, [1.0, 1.0])
    with pytest.raises(ValueError, match="donated argument 0"):
        step(x, x, np.ones(2))


def test_generated_flattener_matches_flatten_and_rejects_other_structures():
    from collections import namedtuple
    from burjit import pytree
    NT = namedtuple("NT", "a b")
    for tree in [{"a": [1, (2, None)], "b": NT(3, {"z": 4})}, [], (), {}, None, 5, [np.ones(2)], (7,)]:
        leaves, td = pytree.flatten(tree)
        got = pytree.flattener(td)(tree)
        assert len(got) == len(leaves) and all(a is b for a, b in zip(got, leaves))
        rebuilt = pytree.unflattener(td)(leaves)
        assert pytree.flatten(rebuilt)[1] == td and all(a is b for a, b in zip(pytree.flatten(rebuilt)[0], leaves))
    one = pytree.flattener(pytree.flatten({"a": 1})[1])
    assert one({"a": [1]}) is None and one({"b": 1}) is None and one({"a": 1, "b": 2}) is None
    assert pytree.flattener(pytree.flatten([1, 2])[1])((1, 2)) is None


def test_structure_change_between_calls_retraces(backend):
    f = burjit.compile(lambda t: F.sum(t[0]) if len(t) == 1 else F.sum(t[0] * t[1]), backend=backend)
    assert float(f([np.ones(2)])) == 2.0
    assert float(f([np.ones(2), np.full(2, 3.0)])) == 6.0
    assert float(f([np.ones(3)])) == 3.0


@pytest.mark.parametrize("bad", [3, -1])
def test_cross_entropy_refuses_out_of_range_targets(backend, bad):
    step = burjit.compile(burjit.value_and_grad(F.cross_entropy), backend=backend)
    logits = np.zeros((2, 3))
    loss, _ = step(logits, np.array([0, 2]))
    np.testing.assert_allclose(loss, np.log(3.0))
    with pytest.raises(IndexError):
        step(logits, np.array([0, bad]))


# -- numpy's rules for arguments, and errors that name the user's line -----------------------------

HERE = os.path.abspath(__file__)


def _raises(fn, error, match, *args):
    """fn traced on args raises `error`: its first line names this file (the user's line), the rest matches."""
    with pytest.raises(error) as info:
        burjit.compile(fn, backend="reference")(*(args or (np.ones((2, 3)),)))
    where, _, what = str(info.value).partition("\n")
    assert where.startswith(HERE + ":"), str(info.value)
    assert re.search(match, what), str(info.value)


@pytest.mark.parametrize("fn, error, match", [
    (lambda x: F.concatenate([x, x], axis=5), IndexError, "axis 5 is out of range"),
    (lambda x: F.concatenate([x, x], axis=-3), ValueError, "axis -3 is out of range"),
    (lambda x: F.transpose(x, (0, 5)), IndexError, "axis 5 is out of range"),
    (lambda x: F.transpose(x, (1, 1)), ValueError, "not a permutation"),
    (lambda x: F.sum(x, axis=1.0), TypeError, "axis must be an integer"),
    (lambda x: F.sum(x, axis=(1, -1)), ValueError, "repeated axis"),
    (lambda x: F.concatenate([]), ValueError, "at least one array"),
    (lambda x: F.reshape(x, (-3, -1)), ValueError, "at most one -1"),
    (lambda x: F.reshape(x, (-1, -1)), ValueError, "at most one -1"),
    (lambda x: F.reshape(x, 2.0), TypeError, "shape must be"),
    (lambda x: x[1.5], IndexError, "unsupported index"),
    (lambda x: F.arange(x.shape[0] * 1.0, step=0), ZeroDivisionError, "step 0"),
    (lambda x: np.asarray(x), burjit.TracingError, r"numpy.asarray\(\) of a traced value"),
    (lambda x: x == None, burjit.TracingError, "NoneType cannot be used as an array"),  # noqa: E711
    (lambda x: burjit.grad(F.sum, has_aux=True)(x), burjit.TracingError, r"has_aux=True needs f to return a pair"),
    (lambda x: burjit.grad(lambda y: (F.sum(y), 1, 2), has_aux=True)(x), burjit.TracingError, "of length 3"),
    (lambda x: burjit.grad(F.sum, argnums=3)(x), burjit.TracingError, "argnums 3 is out of range"),
])
def test_invalid_arguments_raise_numpys_error_at_the_users_line(fn, error, match):
    _raises(fn, error, match)


@pytest.mark.parametrize("fn, want", [
    (lambda x: x[True], lambda x: x[True]),
    (lambda x: x[False], lambda x: x[False]),
    (lambda x: x[None, True, 1], lambda x: x[None, True, 1]),
    (lambda x: F.arange(3.7), lambda x: np.arange(3.7)),
    (lambda x: F.arange(1, 8, 3), lambda x: np.arange(1, 8, 3)),
    (lambda x: F.arange(0.5, 2, 0.25), lambda x: np.arange(0.5, 2, 0.25)),
    (lambda x: F.arange(5, 1, -2), lambda x: np.arange(5, 1, -2)),
    (lambda x: F.arange(4, dtype="float32"), lambda x: np.arange(4, dtype="float32")),
    (lambda x: F.concatenate([x, x], axis=None), lambda x: np.concatenate([x, x], axis=None)),
    (lambda x: F.concatenate([x, x], axis=-1), lambda x: np.concatenate([x, x], axis=-1)),
    (lambda x: F.transpose(x, (-1, 0)), lambda x: np.transpose(x, (-1, 0))),
    (lambda x: F.reshape(x, (3, -1)), lambda x: np.reshape(x, (3, -1))),
    (lambda x: F.mean(x[:, :0]), lambda x: np.float64("nan")),
    (lambda x: F.mean(x[:0], axis=0), lambda x: np.full(3, np.nan)),
    (lambda x: F.cross_entropy(x[:0], np.zeros(0, np.int64)), lambda x: np.float64("nan")),
    (lambda x: F.softmax(x[:, :0]), lambda x: x[:, :0]),
    (lambda x: F.log_softmax(x[:0], axis=0), lambda x: x[:0]),
    (lambda x: F.logsumexp(x[:, :0]), lambda x: np.full(2, -np.inf)),
    (lambda x: F.logsumexp(x[:0], axis=0, keepdims=True), lambda x: np.full((1, 3), -np.inf)),
])
def test_numpy_results_for_edge_arguments(backend, fn, want):
    x = np.arange(6.0).reshape(2, 3)
    got = burjit.compile(fn, backend=backend)(x)
    expected = np.asarray(want(x))
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_grad_with_respect_to_an_empty_dict_and_negative_argnums(backend):
    step = burjit.compile(burjit.grad(lambda d, x: F.sum(x * x), argnums=(0, -1)), backend=backend)
    g_d, g_x = step({}, np.arange(3.0))
    assert g_d == {} and np.array_equal(g_x, [0.0, 2.0, 4.0])
    assert burjit.compile(burjit.grad(lambda d, x: F.sum(x * x)), backend=backend)({}, np.arange(3.0)) == {}


def test_user_code_in_a_folder_named_numpy_is_the_users_line(tmp_path):
    folder = tmp_path / "numpy"
    folder.mkdir()
    (folder / "user_step.py").write_text("def step(x):\n    return x.reshape((5, 7))\n")
    sys.path.insert(0, str(folder))
    try:
        import user_step
        with pytest.raises(burjit.ShapeError, match=r"user_step.py:2: return x.reshape\(\(5, 7\)\)"):
            burjit.compile(user_step.step, backend="reference")(np.ones(4))
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("user_step", None)
