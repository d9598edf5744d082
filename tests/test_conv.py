"""conv1d, conv2d and max_pool2d against numpy loop references (checked once against torch) on
every backend, their gradients against finite differences, ties in max_pool2d's gradient as
torch gives them, their lowering (one matmul) and their errors (naming the user's line)."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import burjit
from burjit import ops as F
from test_grad_fd import check


def conv2d_ref(x, w, b=None, stride=(1, 1), padding=(0, 0)):
    (sh, sw), (ph, pw) = stride, padding
    x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    (n, _, h, wd), (o, _, kh, kw) = x.shape, w.shape
    out = np.zeros((n, o, (h - kh) // sh + 1, (wd - kw) // sw + 1), x.dtype)
    for i in range(out.shape[2]):
        for j in range(out.shape[3]):
            patch = x[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]  # n, c, kh, kw
            out[:, :, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [1, 2, 3]))
    return out if b is None else out + b[:, None, None]


def conv1d_ref(x, w, b=None, stride=1, padding=0):
    return conv2d_ref(x[:, :, None], w[:, :, None], b, (1, stride), (0, padding))[:, :, 0]


def max_pool2d_ref(x, kernel, stride, padding):
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf)
    out = np.empty(x.shape[:2] + ((x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1), x.dtype)
    for i in range(out.shape[2]):
        for j in range(out.shape[3]):
            out[:, :, i, j] = x[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw].max(axis=(2, 3))
    return out


# x shape, w shape, stride, padding: stride > kernel, padding > 0, pairs, 1x1 output
CONV2D = [((2, 3, 6, 5), (4, 3, 3, 2), 1, 0), ((2, 3, 7, 6), (4, 3, 3, 3), 2, 1),
          ((1, 2, 9, 8), (3, 2, 2, 2), 3, (1, 2)), ((2, 1, 4, 4), (2, 1, 4, 4), (1, 2), 0),
          ((1, 2, 5, 5), (3, 2, 1, 1), 1, 2)]
CONV1D = [((2, 3, 7), (4, 3, 3), 1, 0), ((2, 2, 9), (3, 2, 2), 3, 1), ((1, 1, 4), (2, 1, 5), 1, 1)]
POOL = [((2, 3, 6, 6), 2, None, 0), ((1, 2, 7, 6), 3, 2, 1), ((1, 2, 8, 7), 2, 3, 1), ((2, 1, 5, 6), (3, 2), 1, (1, 1))]
TOL = {"float64": 1e-12, "float32": 1e-5}


def _pair(v):
    return v if isinstance(v, tuple) else (v, v)


def _data(rng, dtype, *shapes):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("xs,ws,stride,padding", CONV2D)
def test_conv2d_values(xs, ws, stride, padding, dtype, backend):
    x, w, b = _data(np.random.default_rng(0), dtype, xs, ws, ws[:1])
    got = burjit.compile(lambda x, w, b: F.conv2d(x, w, b, stride, padding), backend=backend)(x, w, b)
    want = conv2d_ref(x.astype(np.float64), w, b, _pair(stride), _pair(padding))
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("xs,ws,stride,padding", CONV1D)
def test_conv1d_values(xs, ws, stride, padding, dtype, backend):
    x, w = _data(np.random.default_rng(0), dtype, xs, ws)
    got = burjit.compile(lambda x, w: F.conv1d(x, w, stride=stride, padding=padding), backend=backend)(x, w)
    want = conv1d_ref(x.astype(np.float64), w, None, stride, padding)
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("xs,kernel,stride,padding", POOL)
def test_max_pool2d_values(xs, kernel, stride, padding, dtype, backend):
    (x,) = _data(np.random.default_rng(0), dtype, xs)
    got = burjit.compile(lambda x: F.max_pool2d(x, kernel, stride, padding), backend=backend)(x)
    want = max_pool2d_ref(x, _pair(kernel), _pair(kernel if stride is None else stride), _pair(padding))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


def test_references_and_tied_gradients_match_torch():
    torch = pytest.importorskip("torch")
    T = torch.nn.functional
    rng = np.random.default_rng(2)
    for xs, ws, stride, padding in CONV2D:
        x, w, b = _data(rng, "float64", xs, ws, ws[:1])
        want = T.conv2d(*map(torch.tensor, (x, w, b)), stride=stride, padding=padding).numpy()
        np.testing.assert_allclose(conv2d_ref(x, w, b, _pair(stride), _pair(padding)), want, rtol=1e-12, atol=1e-12)
    for xs, ws, stride, padding in CONV1D:
        x, w = _data(rng, "float64", xs, ws)
        want = T.conv1d(torch.tensor(x), torch.tensor(w), stride=stride, padding=padding).numpy()
        np.testing.assert_allclose(conv1d_ref(x, w, None, stride, padding), want, rtol=1e-12, atol=1e-12)
    for xs, kernel, stride, padding in POOL:
        x = rng.integers(0, 2, xs).astype(np.float64)  # many ties
        t = torch.tensor(x, requires_grad=True)
        y = T.max_pool2d(t, kernel, stride, padding)
        np.testing.assert_array_equal(
            max_pool2d_ref(x, _pair(kernel), _pair(kernel if stride is None else stride), _pair(padding)),
            y.detach().numpy())
        weights = rng.uniform(0.5, 1.5, y.shape)
        (y * torch.tensor(weights)).sum().backward()
        grad = burjit.compile(burjit.grad(lambda x: F.sum(F.max_pool2d(x, kernel, stride, padding) * weights)),
                              backend="native")(x)
        np.testing.assert_array_equal(grad, t.grad.numpy())


def test_conv2d_gradients():
    rng = np.random.default_rng(3)
    for xs, ws, stride, padding in [((2, 2, 5, 4), (3, 2, 3, 2), (2, 1), 1), ((1, 1, 4, 4), (2, 1, 2, 2), 3, 0)]:
        check(lambda x, w, b: F.conv2d(x, w, b, stride, padding),
              lambda x, w, b: conv2d_ref(x, w, b, _pair(stride), _pair(padding)),
              _data(rng, "float64", xs, ws, ws[:1]), "native")


def test_conv1d_gradients():
    rng = np.random.default_rng(4)
    check(lambda x, w, b: F.conv1d(x, w, b, 2, 1), lambda x, w, b: conv1d_ref(x, w, b, 2, 1),
          _data(rng, "float64", (2, 2, 7), (3, 2, 3), (3,)), "native")


def test_max_pool2d_gradients():
    x = np.random.default_rng(5).permutation(2 * 7 * 6).reshape(2, 1, 7, 6) * 0.1  # no ties
    for kernel, stride, padding in [(2, None, 0), (3, 2, 1), (2, 1, 1)]:
        check(lambda x: F.max_pool2d(x, kernel, stride, padding),
              lambda x: max_pool2d_ref(x, _pair(kernel), _pair(kernel if stride is None else stride), _pair(padding)),
              [x], "native")


def test_conv_is_one_matmul():
    step = burjit.compile(lambda x, w: F.conv2d(x, w, stride=2, padding=1), backend="reference")
    graph = step.graph(np.ones((2, 3, 6, 6)), np.ones((4, 3, 3, 3)))
    assert [graph[n]["op"] for n in graph.nx.nodes].count("matmul") == 1


@pytest.mark.parametrize("fn,shapes,error,message", [
    (lambda x, w: F.conv2d(x, w), [(1, 3, 5, 5), (2, 4, 3, 3)], burjit.ShapeError, "x has 3 channels, w expects 4"),
    (lambda x, w: F.conv2d(x, w, padding=1), [(1, 1, 2, 5), (2, 1, 5, 3)], burjit.ShapeError,
     r"kernel \(5, 3\) is larger than the padded input \(4, 7\)"),
    (lambda x, w: F.conv2d(x, w, stride=(1, 0)), [(1, 1, 5, 5), (1, 1, 3, 3)], burjit.ShapeError,
     r"stride must be an int or 2 ints >= 1, got \(1, 0\)"),
    (lambda x, w: F.conv2d(x, w, padding=-1), [(1, 1, 5, 5), (1, 1, 3, 3)], burjit.ShapeError, "padding must be"),
    (lambda x, w: F.conv2d(x, w, np.ones(3)), [(1, 1, 5, 5), (2, 1, 3, 3)], burjit.ShapeError,
     r"bias of shape \(3,\) for 2 output channels"),
    (lambda x, w: F.conv2d(x, w), [(1, 5, 5), (2, 1, 3, 3)], burjit.ShapeError, r"needs x \(N, C, H, W\)"),
    (lambda x, w: F.conv2d(x, w, dilation=2), [(1, 1, 5, 5), (1, 1, 3, 3)], burjit.TracingError,
     "dilation != 1 is not supported"),
    (lambda x, w: F.conv1d(x, w, stride=0), [(1, 1, 5), (1, 1, 3)], burjit.ShapeError, "conv1d: stride must be"),
    (lambda x, w: F.conv1d(x, w), [(1, 1, 2), (1, 1, 3)], burjit.ShapeError, r"kernel \(3,\) is larger"),
    (lambda x, w: F.conv1d(x, w, groups=2), [(1, 2, 5), (1, 1, 3)], burjit.TracingError, "groups != 1"),
    (lambda x: F.max_pool2d(x, 2, padding=2), [(1, 1, 5, 5)], burjit.ShapeError, "more than half the kernel"),
    (lambda x: F.max_pool2d(x, 6), [(1, 1, 5, 5)], burjit.ShapeError, "larger than the padded input"),
    (lambda x: F.max_pool2d(x, 2, stride=-1), [(1, 1, 5, 5)], burjit.ShapeError, "stride must be"),
    (lambda x: F.max_pool2d(x, 2.5), [(1, 1, 5, 5)], TypeError, "kernel_size must be an int"),
])
def test_errors_name_the_line(fn, shapes, error, message):
    with pytest.raises(error, match=message) as e:
        burjit.compile(fn, backend="reference")(*[np.ones(s) for s in shapes])
    assert "test_conv.py:" in str(e.value) and "lambda" in str(e.value)


@given(data=st.data())
def test_property_conv2d_and_max_pool2d_match_the_references(data):
    """Drawn shapes, strides and paddings (the output at least 1x1), on the native backend."""
    n, c, o = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    kh, kw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    stride = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    padding = (data.draw(st.integers(0, kh // 2)), data.draw(st.integers(0, kw // 2)))  # pooling allows no more
    h, w_ = data.draw(st.integers(max(kh - 2 * padding[0], 1), 7)), data.draw(st.integers(max(kw - 2 * padding[1], 1), 7))
    x, w, b = _data(np.random.default_rng(data.draw(st.integers(0, 99))), "float64", (n, c, h, w_), (o, c, kh, kw), (o,))
    conv, pool = burjit.compile(lambda x, w, b: (F.conv2d(x, w, b, stride, padding),
                                                 F.max_pool2d(x, (kh, kw), stride, padding)))(x, w, b)
    np.testing.assert_allclose(conv, conv2d_ref(x, w, b, stride, padding), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(pool, max_pool2d_ref(x, (kh, kw), stride, padding))
