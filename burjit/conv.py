"""conv1d, conv2d and max_pool2d in PyTorch's layout and semantics, as compositions of ops.

A convolution is im2col: the KH*KW strided windows of the zero-padded input are sliced out and
stacked, then contracted with the reshaped weights in one matmul, so it runs on the matmul
kernel and its gradients are those of slice, pad and matmul. conv1d is conv2d of height 1.
"""

import operator

import numpy as np

from . import ops as F
from .errors import ShapeError, TracingError
from .tracer import describe, user_src


def _error(name, msg):
    return ShapeError(f"{describe(user_src())}\n  {name}: {msg}")


def _ints(v, n, what, name, least):
    """An int or n ints (torch's int-or-tuple arguments), each at least `least`."""
    try:
        vs = tuple(map(operator.index, v)) if isinstance(v, (tuple, list)) else (operator.index(v),) * n
    except TypeError:
        raise TypeError(f"{describe(user_src())}\n  {name}: {what} must be an int or {n} ints, got {v!r}") from None
    if len(vs) != n or any(s < least for s in vs):
        raise _error(name, f"{what} must be {'an int' if n == 1 else f'an int or {n} ints'} >= {least}, got {v!r}")
    return vs


def _out_sizes(name, spatial, kernel, stride, padding):
    padded = tuple(s + 2 * p for s, p in zip(spatial, padding))
    if any(k > s for k, s in zip(kernel, padded)):
        raise _error(name, f"kernel {kernel} is larger than the padded input {padded}")
    return tuple((s - k) // st + 1 for s, k, st in zip(padded, kernel, stride))


def _pad(x, pads, value=0.0):
    """x (N, C, H, W) with pads[0] rows and pads[1] columns of `value` on both sides."""
    if not any(pads):
        return x
    if value == 0:
        shape = x.shape[:2] + tuple(s + 2 * p for s, p in zip(x.shape[2:], pads))
        return F.bind("pad", [x], starts=(0, 0) + tuple(pads), steps=(1,) * 4, shape=shape)
    for axis, p in zip((2, 3), pads):
        if p:
            edge = F.bind("const", [], value=value, shape=x.shape[:axis] + (p,) + x.shape[axis + 1:], dtype=x.dtype)
            x = F.concatenate([edge, x, edge], axis)
    return x


def _windows(x, kernel, stride, out):
    """The KH*KW slices x[:, :, i::sh, j::sw] of output size, in row-major window order."""
    (kh, kw), (sh, sw), (oh, ow) = kernel, stride, out
    return [x[:, :, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw] for i in range(kh) for j in range(kw)]


def _operands(name, x, w, b, nd, dilation, groups):
    for what, v in (("dilation", dilation), ("groups", groups)):
        if v not in (1, (1,) * nd, [1] * nd):
            raise TracingError(f"{describe(user_src())}\n  {name}: {what} != 1 is not supported")
    x, w = F.lift(x), F.lift(w)
    if x.ndim != nd + 2 or w.ndim != nd + 2:
        layout = ("N, C, L", "O, C, K") if nd == 1 else ("N, C, H, W", "O, C, KH, KW")
        raise _error(name, f"needs x ({layout[0]}) and w ({layout[1]}), got shapes {x.shape} and {w.shape}")
    if x.shape[1] != w.shape[1]:
        raise _error(name, f"x has {x.shape[1]} channels, w expects {w.shape[1]} (shapes {x.shape}, {w.shape})")
    xs = [x, w] if b is None else [x, w, F.lift(b)]
    if b is not None and xs[2].shape != (w.shape[0],):
        raise _error(name, f"bias of shape {xs[2].shape} for {w.shape[0]} output channels")
    xs = F._promote(xs, floating=True)
    return xs + [None] * (3 - len(xs))


def _conv(x, w, b, stride, padding, out):
    """im2col: windows (N, C, KH*KW, OH*OW), then (N, O, C*KH*KW) @ (N, C*KH*KW, OH*OW)."""
    (n, c), (o, _, kh, kw) = x.shape[:2], w.shape
    wins = _windows(_pad(x, padding), (kh, kw), stride, out)
    cols = F.concatenate([F.reshape(v, (n, c, 1) + out) for v in wins], axis=2)
    cols = F.reshape(cols, (n, c * kh * kw, out[0] * out[1]))
    y = F.reshape(F.matmul(F.reshape(w, (o, c * kh * kw)), cols), (n, o) + out)
    return y if b is None else y + F.reshape(b, (o, 1, 1))


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv2d (a cross-correlation, zero padding): x (N, C, H, W),
    w (O, C, KH, KW), b (O,) -> (N, O, OH, OW). Integers are computed in float64."""
    x, w, b = _operands("conv2d", x, w, b, 2, dilation, groups)
    stride, padding = _ints(stride, 2, "stride", "conv2d", 1), _ints(padding, 2, "padding", "conv2d", 0)
    return _conv(x, w, b, stride, padding, _out_sizes("conv2d", x.shape[2:], w.shape[2:], stride, padding))


def conv1d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv1d: x (N, C, L), w (O, C, K), b (O,) -> (N, O, OL)."""
    x, w, b = _operands("conv1d", x, w, b, 1, dilation, groups)
    (s,), (p,) = _ints(stride, 1, "stride", "conv1d", 1), _ints(padding, 1, "padding", "conv1d", 0)
    out = (1,) + _out_sizes("conv1d", x.shape[2:], w.shape[2:], (s,), (p,))
    y = _conv(F.reshape(x, x.shape[:2] + (1,) + x.shape[2:]), F.reshape(w, w.shape[:2] + (1,) + w.shape[2:]),
              b, (1, s), (0, p), out)
    return F.reshape(y, y.shape[:2] + y.shape[3:])


def max_pool2d(x, kernel_size, stride=None, padding=0):
    """torch.nn.functional.max_pool2d: the max over each window; stride defaults to the kernel,
    padding is -inf and at most half the kernel (as torch), so every window holds an input.
    On ties the gradient goes to one element, the first in row-major window order, as in torch
    (a fold of maximum(window, running max): maximum sends a tie to its second operand)."""
    x = F.lift(x)
    (x,) = F._promote([x], floating=True)
    if x.ndim != 4:
        raise _error("max_pool2d", f"needs x of shape (N, C, H, W), got {x.shape}")
    kernel = _ints(kernel_size, 2, "kernel_size", "max_pool2d", 1)
    stride = kernel if stride is None else _ints(stride, 2, "stride", "max_pool2d", 1)
    padding = _ints(padding, 2, "padding", "max_pool2d", 0)
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise _error("max_pool2d", f"padding {padding} is more than half the kernel {kernel}")
    out = _out_sizes("max_pool2d", x.shape[2:], kernel, stride, padding)
    wins = _windows(_pad(x, padding, -np.inf), kernel, stride, out)
    y = wins[0]
    for v in wins[1:]:
        y = F.maximum(v, y)
    return y
