"""numpy-style functions on traced values (also importable as burjit.numpy).

Everything here is written in primitives (primitives.py), so each function gets gradients,
fusion and native code for free. These functions apply numpy's broadcasting and dtype
promotion by inserting explicit broadcast_to / convert nodes.
"""

import builtins
import math
import operator

import numpy as np

from . import primitives as P
from .errors import AxisError, ShapeError, TracingError
from .tracer import Tracer, bind, describe, lift, check_dtype, user_src

__all__ = [
    "add", "subtract", "multiply", "divide", "power", "negative", "abs", "sign", "exp", "log", "log1p",
    "expm1", "cos", "sin", "tanh", "sqrt", "square", "sigmoid", "relu", "gelu", "softplus", "maximum", "minimum",
    "where",
    "less", "less_equal", "greater", "greater_equal", "equal", "not_equal", "logical_and", "logical_or",
    "logical_not", "matmul", "sum", "mean", "max", "min", "argmax", "argmin", "var", "std", "cumsum", "clip",
    "layer_norm", "rms_norm", "softmax", "log_softmax", "logsumexp", "take",
    "embedding", "concatenate", "broadcast_to", "transpose", "reshape", "one_hot", "cross_entropy",
    "mse", "astype", "zeros_like", "ones_like", "stop_gradient", "arange", "getitem", "bind",
]


# -- helpers ----------------------------------------------------------------------------------

def _lift_pair(a, b):
    like = a if isinstance(a, Tracer) else b if isinstance(b, Tracer) else None
    return lift(a, like), lift(b, like)


def _promote(xs, floating=False):
    first = xs[0].dtype
    if all(x.dtype == first for x in xs) and (first in P.FLOATS or not floating):
        return xs
    dtype = str(np.result_type(*[np.dtype(x.dtype) for x in xs]))
    if floating and dtype not in P.FLOATS:
        dtype = "float64"
    return [astype(x, dtype) for x in xs]


def _broadcast_all(xs):
    if all(x.shape == xs[0].shape for x in xs):  # the common case (every scalar op): nothing to do
        return xs
    try:
        shape = np.broadcast_shapes(*[x.shape for x in xs])
    except ValueError:
        raise ShapeError(f"{describe(user_src())}\n  shapes " + " and ".join(str(x.shape) for x in xs)
                         + " do not broadcast") from None
    return [broadcast_to(x, shape) for x in xs]


def _elementwise(op, *xs, floating=False):
    first = xs[0]
    if isinstance(first, Tracer) and (first.dtype in P.FLOATS or not (floating or op in P.ELEMENTWISE_FLOAT_ONLY)):
        for x in xs:  # the common case (every scalar op): operands of one shape and dtype, nothing to insert
            if not isinstance(x, Tracer) or x.dtype != first.dtype or x.shape != first.shape:
                break
        else:
            return bind(op, list(xs))
    like = next((x for x in xs if isinstance(x, Tracer)), None)
    xs = [lift(x, like) for x in xs]
    return bind(op, _broadcast_all(_promote(xs, floating or op in P.ELEMENTWISE_FLOAT_ONLY)))


def _axis(a, ndim, shape=None):
    """One axis in [0, ndim), from an int in [-ndim, ndim): numpy's TypeError / AxisError otherwise."""
    try:
        a = operator.index(a)
    except TypeError:
        raise TypeError(f"{describe(user_src())}\n  an axis must be an integer, got {a!r}") from None
    if not -ndim <= a < ndim:
        raise AxisError(f"{describe(user_src())}\n  axis {a} is out of range for "
                        + (f"shape {shape}" if shape is not None else f"{ndim} dimensions"))
    return a % ndim


def _axes(x, axis):
    if axis is None:
        return tuple(range(x.ndim))
    out = [_axis(a, x.ndim, x.shape) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))]
    if len(set(out)) != len(out):
        raise ValueError(f"{describe(user_src())}\n  repeated axis in {axis!r}")
    return tuple(sorted(out))


def _keepdims(x, r, axes, keepdims):
    return reshape(r, tuple(1 if i in axes else s for i, s in enumerate(x.shape))) if keepdims else r


# -- elementwise ------------------------------------------------------------------------------

def add(a, b): return _elementwise("add", a, b)
def subtract(a, b): return _elementwise("sub", a, b)
def multiply(a, b): return _elementwise("mul", a, b)
def divide(a, b): return _elementwise("div", a, b)
def power(a, b): return _elementwise("pow", a, b)
def maximum(a, b): return _elementwise("maximum", a, b)
def minimum(a, b): return _elementwise("minimum", a, b)
def less(a, b): return _elementwise("lt", a, b)
def less_equal(a, b): return _elementwise("le", a, b)
def greater(a, b): return _elementwise("gt", a, b)
def greater_equal(a, b): return _elementwise("ge", a, b)
def equal(a, b): return _elementwise("eq", a, b)
def not_equal(a, b): return _elementwise("ne", a, b)
def logical_and(a, b): return bind("and", _broadcast_all([astype(lift(a), "bool"), astype(lift(b), "bool")]))
def logical_or(a, b): return bind("or", _broadcast_all([astype(lift(a), "bool"), astype(lift(b), "bool")]))
def logical_not(a): return bind("not", [astype(lift(a), "bool")])
def negative(x): return _elementwise("neg", x)
def abs(x): return _elementwise("abs", x)
def sign(x): return _elementwise("sign", x)
def exp(x): return _elementwise("exp", x)
def log(x): return _elementwise("log", x)
def log1p(x): return _elementwise("log1p", x)
def expm1(x): return _elementwise("expm1", x)
def cos(x): return _elementwise("cos", x)
def sin(x): return _elementwise("sin", x)
def tanh(x): return _elementwise("tanh", x)
def sqrt(x): return _elementwise("sqrt", x)
def sigmoid(x): return _elementwise("sigmoid", x)
def square(x): return multiply(x, x)
def stop_gradient(x): return bind("stop_gradient", [lift(x)])
def relu(x): return maximum(x, 0.0)


def gelu(x):
    """GELU, tanh approximation (as GPT-2 uses)."""
    (x,) = _promote([lift(x)], floating=True)
    return 0.5 * x * (1.0 + tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def softplus(x): return _elementwise("softplus", x)


def where(cond, a, b):
    cond = lift(cond)
    if cond.dtype != "bool":
        cond = not_equal(cond, 0)
    a, b = _lift_pair(a, b)
    a, b = _promote([a, b])
    return bind("where", _broadcast_all([cond, a, b]))


def astype(x, dtype):
    x = lift(x)
    if dtype == x.dtype:
        return x
    dtype = check_dtype(np.dtype(dtype), "astype target")
    return x if x.dtype == dtype else bind("convert", [x], dtype=dtype)


def zeros_like(x, dtype=None, shape=None):
    return bind("const", [], value=0, shape=x.shape if shape is None else shape, dtype=dtype or x.dtype)


def ones_like(x, dtype=None):
    return bind("const", [], value=1, shape=x.shape, dtype=dtype or x.dtype)


def arange(start, stop=None, step=None, dtype=None):
    """numpy.arange: start + i * step for i < ceil((stop - start) / step). Bounds are static
    numbers; the dtype follows numpy (int64 for ints, float64 if any bound is a float)."""
    if stop is None:
        start, stop = 0, start
    step = 1 if step is None else step
    for v in (start, stop, step):
        if isinstance(v, Tracer) or not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, bool):
            raise TypeError(f"{describe(user_src())}\n  arange bounds must be Python or numpy numbers "
                            f"(they fix the result's shape), got {type(v).__name__}")
    if step == 0:
        raise ZeroDivisionError(f"{describe(user_src())}\n  arange with step 0")
    n = builtins.max(0, math.ceil((stop - start) / step))
    dtype = check_dtype(np.result_type(start, stop, step) if dtype is None else np.dtype(dtype), "arange")
    exact = all(isinstance(v, (int, np.integer)) for v in (start, step)) or dtype in P.FLOATS
    r = bind("iota", [], shape=(n,), axis=0, dtype=dtype if exact else "float64")
    if step != 1:
        r = r * step
    if start != 0:
        r = r + start
    return astype(r, dtype)


# -- reductions -------------------------------------------------------------------------------

def sum(x, axis=None, keepdims=False):
    x = lift(x)
    if x.dtype == "bool":
        x = astype(x, "int64")
    axes = _axes(x, axis)
    r = bind("reduce_sum", [x], axes=axes) if axes else x
    return _keepdims(x, r, axes, keepdims)


def mean(x, axis=None, keepdims=False):
    (x,) = _promote([lift(x)], floating=True)
    n = int(np.prod([x.shape[a] for a in _axes(x, axis)], dtype=np.int64))
    return sum(x, axis, keepdims) * (1.0 / n if n else math.nan)  # the mean of nothing is NaN, as in numpy


def max(x, axis=None, keepdims=False):
    x = lift(x)
    axes = _axes(x, axis)
    if any(x.shape[a] == 0 for a in axes):
        raise ShapeError(f"{describe(user_src())}\n  max of an empty axis (shape {x.shape})")
    if x.dtype == "bool":  # any(), as numpy's max of bools
        return astype(max(astype(x, "int32"), axis, keepdims), "bool")
    r = bind("reduce_max", [x], axes=axes) if axes else x
    return _keepdims(x, r, axes, keepdims)


def _flip(x):
    """An order-reversing involution: -x for floats, ~x = -x - 1 for ints (-x wraps at the most
    negative int, ~x does not: two's-complement arithmetic wraps to exactly ~x), not for bools."""
    if x.dtype == "bool":
        return logical_not(x)
    return negative(x) if x.dtype in P.FLOATS else negative(x) - 1


def min(x, axis=None, keepdims=False):
    x = lift(x)
    return _flip(max(_flip(x), axis, keepdims))


def argmax(x, axis=None):
    """numpy.argmax (int64): the first index of the max, or of the first NaN. axis=None: of the
    flattened values. Built from max and a min over indices, so it has no gradient (none exists)."""
    x = stop_gradient(lift(x))
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    (axis,) = _axes(x, axis)
    m = max(x, axis, keepdims=True)  # raises for an empty axis, as numpy does
    hit = logical_or(equal(x, m), not_equal(x, x))  # x != x: a NaN, which max propagates
    idx = bind("iota", [], shape=x.shape, axis=axis, dtype="int64")
    return min(where(hit, idx, x.shape[axis]), axis)


def argmin(x, axis=None):
    """numpy.argmin: the argmax of x with its order reversed."""
    return argmax(_flip(lift(x)), axis)


def clip(x, lo=None, hi=None):
    """numpy.clip: minimum(maximum(x, lo), hi); either bound may be None. Where x equals a bound
    the gradient goes to x (maximum's and minimum's rule for ties)."""
    x = lift(x)
    if lo is None and hi is None:
        raise ValueError(f"{describe(user_src())}\n  clip needs lo or hi")
    x = x if lo is None else maximum(x, lo)
    return x if hi is None else minimum(x, hi)


def var(x, axis=None, ddof=0, keepdims=False):
    """numpy.var: the mean squared deviation, divided by n - ddof instead of n (two passes, so no
    cancellation between E[x^2] and E[x]^2)."""
    if not isinstance(ddof, (int, np.integer)) or isinstance(ddof, bool):
        raise TypeError(f"{describe(user_src())}\n  var/std: ddof must be an int, got {ddof!r}")
    (x,) = _promote([lift(x)], floating=True)
    n = int(np.prod([x.shape[a] for a in _axes(x, axis)], dtype=np.int64))
    d = x - mean(x, axis, keepdims=True)
    return sum(d * d, axis, keepdims) * (1.0 / (n - ddof) if n > ddof else math.nan)


def std(x, axis=None, ddof=0, keepdims=False):
    return sqrt(var(x, axis, ddof, keepdims))


def cumsum(x, axis=None):
    """numpy.cumsum by log2(n) doubling steps, y += y shifted by 1, 2, 4, ... along the axis
    (slice + pad, so it vectorises and its gradient is the reversed cumsum). Exact for integers;
    for floats each output adds the same terms as numpy's running sum in another order."""
    x = lift(x)
    if x.dtype == "bool":
        x = astype(x, "int64")
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    (axis,) = _axes(x, axis)
    n, k, zero = x.shape[axis], 1, (0,) * x.ndim
    while k < n:
        kept = tuple(n - k if i == axis else s for i, s in enumerate(x.shape))
        head = bind("slice", [x], starts=zero, steps=(1,) * x.ndim, shape=kept)
        shifted = bind("pad", [head], starts=tuple(k if i == axis else 0 for i in range(x.ndim)),
                       steps=(1,) * x.ndim, shape=x.shape)
        x, k = x + shifted, 2 * k
    return x


def layer_norm(x, g=None, b=None, eps=1e-5, axis=-1):
    """(x - mean) / sqrt(var + eps) over `axis` (the last by default), times g plus b (torch's
    F.layer_norm over one axis, biased variance)."""
    (x,) = _promote([lift(x)], floating=True)
    d = x - mean(x, axis, keepdims=True)
    y = d / sqrt(mean(d * d, axis, keepdims=True) + eps)
    y = y if g is None else y * g
    return y if b is None else y + b


def rms_norm(x, g=None, eps=1e-6, axis=-1):
    """x / sqrt(mean(x^2) + eps) over `axis`, times g (Zhang & Sennrich; LLaMA's norm)."""
    (x,) = _promote([lift(x)], floating=True)
    y = x / sqrt(mean(x * x, axis, keepdims=True) + eps)
    return y if g is None else y * g


def _shift(x, axis):
    """The row max that keeps exp from overflowing, as a constant (the result does not depend on
    it); 0 over an empty axis, which has no max and nothing to shift (an empty or -inf result)."""
    axes = _axes(x, axis)
    if any(x.shape[a] == 0 for a in axes):
        return zeros_like(x, shape=tuple(1 if i in axes else s for i, s in enumerate(x.shape)))
    return stop_gradient(max(x, axis, keepdims=True))


def logsumexp(x, axis=-1, keepdims=False):
    x = lift(x)
    m = _shift(x, axis)
    m = where(abs(m) < math.inf, m, 0.0)  # an all -inf row is -inf, a row holding +inf is inf (not inf - inf)
    r = m + log(sum(exp(x - m), axis, keepdims=True))
    return r if keepdims else reshape(r, tuple(s for i, s in enumerate(x.shape) if i not in _axes(x, axis)))


def log_softmax(x, axis=-1):
    x = lift(x)
    shifted = x - _shift(x, axis)
    return shifted - log(sum(exp(shifted), axis, keepdims=True))


def softmax(x, axis=-1):
    x = lift(x)
    e = exp(x - _shift(x, axis))
    return e / sum(e, axis, keepdims=True)


def one_hot(idx, n, dtype="float32"):
    """Rows of the n x n identity; an index outside [0, n) gives a zero row (as jax.nn.one_hot)."""
    idx = lift(idx)
    cols = bind("iota", [], shape=idx.shape + (n,), axis=idx.ndim, dtype=idx.dtype)
    return astype(equal(broadcast_to(reshape(idx, idx.shape + (1,)), cols.shape), cols), dtype)


def cross_entropy(logits, targets):
    """Mean negative log-likelihood of integer `targets` under softmax(logits) along the last axis."""
    lp = log_softmax(logits, -1)
    targets = lift(targets)
    if targets.shape != lp.shape[:-1]:
        raise ShapeError(f"{describe(user_src())}\n  cross_entropy: targets {targets.shape} do not match "
                         f"logits {lp.shape} without the last axis")
    n = lp.shape[-1]
    # Gathering zeros at the targets adds nothing but makes a target outside [0, n) raise
    # IndexError, where the one-hot product alone would silently score it as 0.
    in_range = take(np.zeros((n,), lp.dtype), targets)
    # where, not a one-hot product: a masked (-inf) logit in another class must not make -inf * 0.
    picked = where(one_hot(targets, n, "bool"), lp, 0.0)
    return -mean(sum(picked, -1) + in_range)


def mse(pred, target):
    d = subtract(pred, target)
    return mean(d * d)


# -- data movement ----------------------------------------------------------------------------

def broadcast_to(x, shape):
    x = lift(x)
    shape = tuple(int(s) for s in shape)
    return x if x.shape == shape else bind("broadcast_to", [x], shape=shape)


def reshape(x, shape):
    x = lift(x)
    try:
        shape = (operator.index(shape),) if not isinstance(shape, (tuple, list)) else tuple(map(operator.index, shape))
    except TypeError:
        raise TypeError(f"{describe(user_src())}\n  a shape must be an int or a sequence of ints, got {shape!r}") from None
    if shape.count(-1) > 1 or any(s < -1 for s in shape):
        raise ShapeError(f"{describe(user_src())}\n  cannot reshape {x.shape} to {shape}: "
                         "dimensions must be >= 0, with at most one -1")
    if shape.count(-1) == 1:
        known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        if known == 0 or x.size % known:
            raise ShapeError(f"{describe(user_src())}\n  cannot reshape {x.shape} to {shape}")
        shape = tuple(x.size // known if s == -1 else s for s in shape)
    return x if x.shape == shape else bind("reshape", [x], shape=shape)


def transpose(x, axes=None):
    x = lift(x)
    perm = tuple(reversed(range(x.ndim))) if axes is None else tuple(_axis(a, x.ndim, x.shape) for a in axes)
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"{describe(user_src())}\n  transpose axes {tuple(axes)} are not a permutation of "
                         f"the {x.ndim} axes of shape {x.shape}")
    return x if perm == tuple(range(x.ndim)) else bind("transpose", [x], perm=perm)


def concatenate(xs, axis=0):
    """numpy.concatenate; axis=None joins the flattened values."""
    if not len(xs):
        raise ShapeError(f"{describe(user_src())}\n  concatenate needs at least one array")
    xs = _promote([lift(x) for x in xs])
    if axis is None:
        xs, axis = [reshape(x, (-1,)) for x in xs], 0
    if not xs[0].shape:
        raise ShapeError(f"{describe(user_src())}\n  cannot concatenate 0-d values")
    axis = _axis(axis, xs[0].ndim, xs[0].shape)
    return xs[0] if len(xs) == 1 else bind("concatenate", xs, axis=axis)


def take(table, idx, axis=0):
    """numpy.take for integer indices in [0, n); an index out of range raises IndexError at run time."""
    table, idx = lift(table), lift(idx)
    if idx.dtype not in ("int32", "int64"):
        raise ShapeError(f"{describe(user_src())}\n  take: indices must be integers, got {idx.dtype}")
    axis = _axes(table, axis)[0]
    if axis == 0:
        return bind("take", [table, idx])
    moved = transpose(table, (axis,) + tuple(i for i in range(table.ndim) if i != axis))
    r = bind("take", [moved, idx])  # idx.shape + others
    k = idx.ndim
    rest = list(range(k, r.ndim))
    return transpose(r, tuple(rest[:axis]) + tuple(range(k)) + tuple(rest[axis:]))


def embedding(table, idx):
    return take(table, idx, 0)


def matmul(a, b):
    """numpy matmul semantics (1-D promotion and batch broadcasting)."""
    a, b = _promote(_lift_pair(a, b), floating=True)
    if not a.shape or not b.shape:
        raise ShapeError(f"{describe(user_src())}\n  matmul of a 0-d value (shapes {a.shape}, {b.shape})")
    a2 = reshape(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = reshape(b, b.shape + (1,)) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ShapeError(f"{describe(user_src())}\n  matmul: shapes {a.shape} and {b.shape} do not fit "
                         f"({a2.shape[-1]} != {b2.shape[-2]})")
    if b2.ndim == 2 and a2.ndim > 2:  # x[..., k] @ W[k, n]: one big matrix product, no copies of W
        out = bind("matmul", [reshape(a2, (-1, a2.shape[-1])), b2])
        out = reshape(out, a2.shape[:-1] + (b2.shape[-1],))
    else:
        try:
            batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        except ValueError:
            raise ShapeError(f"{describe(user_src())}\n  matmul: batch shapes {a.shape} and {b.shape} "
                             "do not broadcast") from None
        a2 = broadcast_to(a2, batch + a2.shape[-2:])
        b2 = broadcast_to(b2, batch + b2.shape[-2:])
        out = bind("matmul", [a2, b2])
    if a.ndim == 1:
        out = reshape(out, out.shape[:-2] + out.shape[-1:])
    if b.ndim == 1:
        out = reshape(out, out.shape[:-1])
    return out


def getitem(x, key):
    """Basic numpy indexing: ints, slices, None, Ellipsis; an integer array on the first axis gathers."""
    if isinstance(key, (Tracer, np.ndarray, list)):
        return take(x, key if not isinstance(key, list) else np.asarray(key), 0)
    key = key if isinstance(key, tuple) else (key,)
    if builtins.sum(k is Ellipsis for k in key) > 1:
        raise ShapeError(f"{describe(user_src())}\n  only one Ellipsis is allowed in an index")
    # numpy: a bool scalar is a new axis of length 1 (True) or 0 (False), like None
    key = tuple(bool(k) if isinstance(k, (bool, np.bool_)) else k for k in key)
    n_real = builtins.sum(k is not None and k is not Ellipsis and not isinstance(k, bool) for k in key)
    dots = [i for i, k in enumerate(key) if k is Ellipsis]
    if dots:
        i = dots[0]
        key = key[:i] + (slice(None),) * (x.ndim - n_real) + key[i + 1:]
    else:
        key = key + (slice(None),) * (x.ndim - n_real)
    if n_real > x.ndim:
        raise ShapeError(f"{describe(user_src())}\n  too many indices ({n_real}) for shape {x.shape}")
    starts, steps, sizes, out_shape, axis = [], [], [], [], 0
    for k in key:
        if k is None or isinstance(k, bool):
            out_shape.append(int(k is not False))
            continue
        n = x.shape[axis]
        if isinstance(k, slice):
            st, stop, sp = k.indices(n)
            cnt = len(range(st, stop, sp))
            starts.append(st if cnt else 0)
            steps.append(sp)
            sizes.append(cnt)
            out_shape.append(cnt)
        elif isinstance(k, (int, np.integer)):
            if not -n <= k < n:
                raise IndexError(f"{describe(user_src())}\n  index {k} is out of range for axis {axis} "
                                 f"of size {n}")
            starts.append(int(k) % n)
            steps.append(1)
            sizes.append(1)
        else:
            raise IndexError(f"{describe(user_src())}\n  unsupported index {k!r}: use ints, slices, None, "
                             "or one integer array on the first axis")
        axis += 1
    if 0 in out_shape and x.size:  # x[False]: nothing of x is read
        return zeros_like(x, shape=tuple(out_shape))
    r = x
    if (tuple(starts), tuple(sizes)) != ((0,) * x.ndim, x.shape) or any(s != 1 for s in steps):
        r = bind("slice", [x], starts=tuple(starts), steps=tuple(steps), shape=tuple(sizes))
    return reshape(r, tuple(out_shape))


from .einsum import einsum  # noqa: E402  (einsum.py and conv.py build on the functions above)
from .conv import conv1d, conv2d, max_pool2d  # noqa: E402
__all__ += ["einsum", "conv1d", "conv2d", "max_pool2d"]
