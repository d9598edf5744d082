"""Every op's gradient against central finite differences of a numpy twin, on random shapes.

Each case pairs a burjit function with the numpy function it must equal. The scalar probe
sum(f(x) * w), with fixed random weights w, checks a random vector-Jacobian product, so a
wrong VJP cannot hide behind symmetry. Domains keep inputs away from kinks and poles.
"""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import burjit
from burjit import ops as F
from burjit.jit import BACKENDS
from conftest import need_mlir_tools

POS = (0.3, 2.0)     # log, log1p, sqrt, pow base, divisors
ANY = (-2.0, 2.0)


def _np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _np_gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


# name: (burjit fn, numpy fn, domains per argument, how argument shapes relate)
UNARY = {
    "neg": (F.negative, np.negative), "exp": (F.exp, np.exp), "tanh": (F.tanh, np.tanh),
    "square": (F.square, np.square), "sigmoid": (F.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "gelu": (F.gelu, _np_gelu), "softplus": (F.softplus, lambda x: np.log1p(np.exp(x))),
    "abs": (F.abs, np.abs), "relu": (F.relu, lambda x: np.maximum(x, 0)),
    "log": (F.log, np.log), "log1p": (F.log1p, np.log1p), "expm1": (F.expm1, np.expm1),
    "cos": (F.cos, np.cos), "sin": (F.sin, np.sin),
    "sqrt": (F.sqrt, np.sqrt), "rpow": (lambda x: 2.0 ** x, lambda x: 2.0 ** x),
    "pow3": (lambda x: x ** 3, lambda x: x ** 3), "scale": (lambda x: 3.0 * x - x / 4.0 + 1, lambda x: 3.0 * x - x / 4.0 + 1),
    "sum": (lambda x: F.sum(x), lambda x: np.sum(x)), "mean": (F.mean, np.mean),
    "max": (F.max, np.max), "min": (F.min, np.min),
    "sum_last_keep": (lambda x: x.sum(-1, keepdims=True) if x.ndim else x, lambda x: x.sum(-1, keepdims=True) if x.ndim else x),
    "max_first": (lambda x: x.max(0) if x.ndim else x, lambda x: x.max(0) if x.ndim else x),
    "softmax": (lambda x: F.softmax(x) if x.ndim else x, lambda x: _np_softmax(x) if x.ndim else x),
    "log_softmax": (lambda x: F.log_softmax(x) if x.ndim else x,
                    lambda x: np.log(_np_softmax(x)) if x.ndim else x),
    "logsumexp": (lambda x: F.logsumexp(x) if x.ndim else x,
                  lambda x: np.log(np.exp(x).sum(-1)) if x.ndim else x),
    "transpose": (F.transpose, np.transpose), "T": (lambda x: x.T, lambda x: x.T),
    "reshape": (lambda x: x.reshape(-1), lambda x: x.reshape(-1)),
    "slice": (lambda x: x[::-1, 1:] if x.ndim >= 2 else x[::2] if x.ndim else x,
              lambda x: x[::-1, 1:] if x.ndim >= 2 else x[::2] if x.ndim else x),
    "index": (lambda x: x[0] if x.ndim else x, lambda x: x[0] if x.ndim else x),
    "newaxis": (lambda x: x[None, ..., None], lambda x: x[None, ..., None]),
    "concat": (lambda x: F.concatenate([x, 2 * x], 0) if x.ndim else x,
               lambda x: np.concatenate([x, 2 * x], 0) if x.ndim else x),
    "broadcast": (lambda x: F.broadcast_to(x, (2,) + x.shape), lambda x: np.broadcast_to(x, (2,) + x.shape)),
    "where": (lambda x: F.where(x > 0, x * x, -x), lambda x: np.where(x > 0, x * x, -x)),
    "take": (lambda x: F.take(x, np.array([[0, 0], [0, 0]])) if x.ndim else x,
             lambda x: np.take(x, np.array([[0, 0], [0, 0]]), axis=0) if x.ndim else x),
    "take_axis_last": (lambda x: F.take(x, np.array([0, 0]), axis=-1) if x.ndim else x,
                       lambda x: np.take(x, np.array([0, 0]), axis=-1) if x.ndim else x),
}
POSITIVE = {"log", "log1p", "sqrt"}
AWAY_FROM_ZERO = {"abs", "relu", "where"}
DISTINCT = {"max", "min", "max_first"}

BINARY = {
    "add": (F.add, np.add), "sub": (F.subtract, np.subtract), "mul": (F.multiply, np.multiply),
    "div": (F.divide, np.divide), "pow": (F.power, np.power),
    "maximum": (F.maximum, np.maximum), "minimum": (F.minimum, np.minimum),
    "mse": (F.mse, lambda a, b: np.mean((a - b) ** 2)),
}


def fd_grad(npf, args, k, w, h=1e-6):
    """Central differences of sum(npf(*args) * w) with respect to args[k]."""
    x = args[k]
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        vals = []
        for s in (h, -h):
            xs = [a.copy() for a in args]
            xs[k][i] += s
            vals.append(np.sum(npf(*xs) * w))
        g[i] = (vals[0] - vals[1]) / (2 * h)
    return g


def check(fn, npf, args, backend, rtol=1e-5, atol=1e-6):
    if backend == "mlir":
        need_mlir_tools()
    args = tuple(np.array(a, dtype=np.float64) for a in args)
    expected = npf(*args)
    w = np.random.default_rng(0).uniform(0.5, 1.5, np.shape(expected))
    nums = tuple(range(len(args)))
    step = burjit.compile(burjit.value_and_grad(lambda *a: F.sum(fn(*a) * w), argnums=nums), backend=backend)
    value, grads = step(*args)
    np.testing.assert_allclose(value, np.sum(expected * w), rtol=rtol, atol=atol)
    for k, g in enumerate(grads):
        assert g.shape == args[k].shape and g.dtype == args[k].dtype
        np.testing.assert_allclose(g, fd_grad(npf, args, k, w), rtol=1e-4, atol=1e-5, err_msg=f"arg {k}")


def _values(draw, shape, lo, hi):
    return draw(hnp.arrays(np.float64, shape, elements=st.floats(lo, hi)))


def _spread(x):
    """Distinct values at least 0.05 apart (max/min without ties), same shape, random order."""
    order = np.argsort(np.argsort(x, axis=None, kind="stable"), kind="stable").reshape(x.shape)
    return order * 0.1 - 1.0


def _unary_args(draw, name):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3))
    x = _values(draw, shape, *(POS if name in POSITIVE else ANY))
    if name in AWAY_FROM_ZERO:
        x = np.where(np.abs(x) < 0.1, 0.5, x)
    if name in DISTINCT:
        x = np.asarray(_spread(x), dtype=np.float64)
    return (x,)


def _binary_args(draw, name):
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3)).input_shapes
    a = _values(draw, shapes[0], *(POS if name == "pow" else ANY))
    b = _values(draw, shapes[1], *(POS if name in ("div", "pow") else ANY))
    if name in ("maximum", "minimum"):  # shift b until no pair is within 0.05 of a tie
        shift = next((d for d in np.arange(0, 1, 0.13)
                      if np.all(np.abs(np.subtract(*np.broadcast_arrays(a, b + d))) >= 0.05)), None)
        assume(shift is not None)
        b = b + shift
    return a, b


def _make_tests(backend):
    n = 20 if backend == "reference" else 4

    @pytest.mark.parametrize("name", sorted(UNARY) + sorted(BINARY))
    @settings(max_examples=n)
    @given(data=st.data())
    def test_op(name, data):
        fn, npf = UNARY.get(name) or BINARY[name]
        check(fn, npf, (_unary_args if name in UNARY else _binary_args)(data.draw, name), backend)

    @settings(max_examples=n)
    @given(data=st.data())
    def test_matmul(data):
        m, k, n_, b = (data.draw(st.integers(1, 4)) for _ in range(4))
        kind = data.draw(st.sampled_from(["2d", "batched", "vec_left", "vec_right", "dot", "nd_by_2d"]))
        shapes = {"2d": ((m, k), (k, n_)), "batched": ((b, m, k), (b, k, n_)), "vec_left": ((k,), (k, n_)),
                  "vec_right": ((m, k), (k,)), "dot": ((k,), (k,)), "nd_by_2d": ((b, m, k), (k, n_))}[kind]
        args = tuple(_values(data.draw, s, *ANY) for s in shapes)
        check(F.matmul, np.matmul, args, backend)

    @settings(max_examples=n)
    @given(data=st.data())
    def test_cross_entropy(data):
        b, c = data.draw(st.integers(1, 4)), data.draw(st.integers(2, 5))
        logits = _values(data.draw, (b, c), -3, 3)
        y = np.array(data.draw(st.lists(st.integers(0, c - 1), min_size=b, max_size=b)))
        if data.draw(st.booleans()):  # a masked logit in another class: loss and slopes stay finite
            logits[0, (y[0] + 1) % c] = -np.inf
        check(lambda z: F.cross_entropy(z, y), lambda z: -np.mean(np.log(_np_softmax(z)[np.arange(b), y])),
              (logits,), backend)

    return {f"test_{k}_{backend}": v for k, v in
            dict(op=test_op, matmul=test_matmul, cross_entropy=test_cross_entropy).items()}


for _backend in sorted(BACKENDS):
    globals().update(_make_tests(_backend))


def test_every_differentiable_primitive_is_covered():
    """A new primitive with a VJP must get a finite-difference case here (by name)."""
    covered = {"neg", "exp", "log", "tanh", "sqrt", "abs", "sigmoid", "add", "sub", "mul", "div", "pow",
               "maximum", "minimum", "where", "convert", "id", "reduce_sum", "reduce_max", "broadcast_to",
               "reshape", "transpose", "slice", "pad", "concatenate", "take", "matmul", "stop_gradient",
               "sign", "scatter_add", "softplus", "log1p", "expm1", "cos", "sin",
               "region",  # tests/test_region.py: finite differences through closed scalar regions
               "loop", "bitcast",  # their vjps refuse clearly for now (tests/test_loops.py)
               "allreduce"}  # refuses, naming the user's line (tests/mpi_program.py in_step)
    from burjit.primitives import PRIMITIVES
    assert {n for n, p in PRIMITIVES.items() if p.vjp} <= covered
