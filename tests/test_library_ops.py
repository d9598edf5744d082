"""The numpy-style functions built from primitives (argmax/argmin, clip, var/std, cumsum,
layer_norm/rms_norm, and min over every dtype) against numpy on every backend, with gradients
against finite differences and errors naming the user's line."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import burjit
from burjit import ops as F
from test_grad_fd import check

DTYPES = ["float64", "float32", "int64", "int32", "bool"]


def _layer_norm(x, g, b, eps=1e-5):
    d = x - x.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + eps) * g + b


def _rms_norm(x, g, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


ARRAYS = st.sampled_from(DTYPES).flatmap(lambda dt: hnp.arrays(
    dt, hnp.array_shapes(min_dims=1, max_dims=3, max_side=5),
    elements=st.integers(-3, 3) if dt.startswith("int") else None if dt == "bool" else st.floats(-4, 4, width=32)))

STEPS = {}  # one compiled function per (name, backend): hypothesis examples reuse it


def _same(name, backend, fn, *args):
    """fn traced through burjit (on backend) equals fn on numpy arrays, by ops named like numpy's."""
    if (name, backend) not in STEPS:
        STEPS[name, backend] = burjit.compile(lambda *a: fn(F, *a), backend=backend)
    got, want = STEPS[name, backend](*args), fn(np, *args)
    if name.startswith("cumsum") and args[0].dtype == np.int32:  # integer sums keep int32 (README, Numerics)
        want = want.astype(np.int32)
    assert np.asarray(got).dtype == np.asarray(want).dtype, name
    exact = np.asarray(want).dtype.kind in "biu"
    np.testing.assert_allclose(got, want, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-5, err_msg=name)


CASES = {  # name -> (fn(np or F, x, axis), accepts dtype)
    "argmax": (lambda m, x, ax: m.argmax(x, axis=ax), lambda dt: True),
    "argmin": (lambda m, x, ax: m.argmin(x, axis=ax), lambda dt: True),
    "min": (lambda m, x, ax: m.min(x, axis=ax), lambda dt: True),
    "max": (lambda m, x, ax: m.max(x, axis=ax), lambda dt: True),
    "cumsum": (lambda m, x, ax: m.cumsum(x, axis=ax), lambda dt: True),
    "var": (lambda m, x, ax: m.var(x, axis=ax), lambda dt: dt.startswith("float")),
    "std_ddof1": (lambda m, x, ax: m.std(x, axis=ax, ddof=1, keepdims=True), lambda dt: dt.startswith("float")),
    "clip": (lambda m, x, ax: m.clip(x, -1, 2), lambda dt: dt != "bool"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_numpy(name, backend):
    fn, accepts = CASES[name]

    @settings(max_examples=40 if backend == "reference" else 10)
    @given(x=ARRAYS, data=st.data())
    def run(x, data):
        if not accepts(str(x.dtype)) or (name == "std_ddof1" and x.size < 2):
            return
        axis = data.draw(st.sampled_from([None] + list(range(-x.ndim, x.ndim))))
        STEPS.pop((name, backend), None)  # a new axis is a new function
        _same(name, backend, lambda m, x: fn(m, x, axis), x)
    run()


def test_argmax_ties_and_nans_follow_numpy(backend):
    x = np.array([[1.0, 3.0, 3.0, np.nan], [2.0, 2.0, -np.inf, 0.0], [np.nan, 1.0, np.nan, 5.0]])
    for axis in (None, 0, 1):
        _same(f"argmax{axis}", backend, lambda m, x: (m.argmax(x, axis=axis), m.argmin(x, axis=axis)), x)


def test_min_of_the_most_negative_int(backend):
    """-x wraps at the most negative int: min must not flip through negation."""
    for dt in (np.int64, np.int32):
        x = np.array([5, np.iinfo(dt).min, np.iinfo(dt).max], dt)
        _same(f"min{dt.__name__}", backend, lambda m, x: (m.min(x), m.argmin(x), m.max(x), m.argmax(x)), x)


def test_cumsum_is_exact_on_long_int_rows(backend):
    x = np.random.default_rng(0).integers(-10 ** 12, 10 ** 12, (3, 1000))
    _same("cumsum_long", backend, lambda m, x: m.cumsum(x, axis=1), x)


def test_norms_match_numpy(backend):
    rng = np.random.default_rng(1)
    x, g, b = rng.standard_normal((2, 3, 8)), rng.standard_normal(8), rng.standard_normal(8)
    ln = burjit.compile(lambda x, g, b: (F.layer_norm(x, g, b), F.rms_norm(x, g), F.layer_norm(x)), backend=backend)
    got = ln(x, g, b)
    np.testing.assert_allclose(got[0], _layer_norm(x, g, b), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[1], _rms_norm(x, g), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[2], _layer_norm(x, 1.0, 0.0), rtol=1e-12, atol=1e-12)


def test_layer_norm_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x, g, b = rng.standard_normal((4, 6)), rng.standard_normal(6), rng.standard_normal(6)
    want = torch.nn.functional.layer_norm(*map(torch.tensor, (x,)), (6,), torch.tensor(g), torch.tensor(b), 1e-5)
    np.testing.assert_allclose(burjit.compile(F.layer_norm)(x, g, b), want.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,fn,npf,shapes", [
    ("var", lambda x: F.var(x, 1), lambda x: np.var(x, 1), [(3, 4)]),
    ("std", lambda x: F.std(x, 0, ddof=1), lambda x: np.std(x, 0, ddof=1), [(3, 4)]),
    ("cumsum", lambda x: F.cumsum(x, 1), lambda x: np.cumsum(x, 1), [(2, 7)]),
    ("cumsum_flat", F.cumsum, np.cumsum, [(3, 3)]),
    ("clip", lambda x: F.clip(x, -0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5), [(9,)]),
    ("layer_norm", F.layer_norm, _layer_norm, [(2, 5), (5,), (5,)]),
    ("rms_norm", F.rms_norm, _rms_norm, [(2, 5), (5,)]),
])
def test_gradients_match_finite_differences(name, fn, npf, shapes, backend):
    rng = np.random.default_rng(3)
    args = [rng.uniform(-1, 1, s) for s in shapes]
    if name == "clip":
        args[0][0], args[0][1] = 0.7, -0.9  # away from the kinks, where finite differences agree
    check(fn, npf, args, backend)


def test_errors_name_the_users_line():
    with pytest.raises(burjit.ShapeError, match=r"test_library_ops\.py:\d+: .*\n  max of an empty axis"):
        burjit.compile(lambda x: F.argmax(x, 1))(np.zeros((2, 0)))
    with pytest.raises(burjit.errors.AxisError, match=r"test_library_ops\.py:\d+: .*\n  axis 2 is out of range"):
        burjit.compile(lambda x: F.cumsum(x, 2))(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"test_library_ops\.py:\d+: .*\n  clip needs lo or hi"):
        burjit.compile(lambda x: F.clip(x))(np.zeros(2))
    with pytest.raises(TypeError, match=r"test_library_ops\.py:\d+: .*\n  var/std: ddof must be an int, got 'a'"):
        burjit.compile(lambda x: F.std(x, ddof="a"))(np.zeros(2))


def test_numpy_functions_on_traced_values_dispatch_to_ops():
    funcs = lambda m, x: (m.cos(x), m.expm1(x), m.sin(x), m.argmax(x), m.argmin(x), m.cumsum(x),  # noqa: E731
                          m.clip(x, 0, 1), m.var(x), m.std(x), m.einsum("i,i->", x, x))
    x = np.array([0.5, 2.0, -1.0])
    for got, want in zip(burjit.compile(lambda x: funcs(np, x))(x), funcs(np, x)):
        np.testing.assert_allclose(got, want, rtol=1e-12)
