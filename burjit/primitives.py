"""The op registry: every primitive, defined once.

A primitive has
  kind    'elementwise' (operands share the output shape; lowered per element), 'reduce',
          'shape' (data movement), 'matmul', 'gather', 'scatter', 'source' (no operands),
          'region' (a scalar region's records, registered by region.py), 'loop' (a loop
          whose body is a graph, registered by control.py, with 'bitcast', its leaves' bytes)
          or 'collective' (an MPI collective over the ranks: burjit/distributed.py)
  infer   (avals, attrs) -> (shape, dtype); avals are (shape, dtype) pairs. Raises ShapeError.
  ref     numpy reference: (*arrays, **attrs) -> array. The test oracle.
  vjp     (F, g, out, xs, needs, attrs) -> cotangent per operand (None = zero), written with
          traced ops from F (burjit.ops), so adjoints are ordinary graph nodes. `needs[i]` says
          whether operand i wants a cotangent; None for non-differentiable primitives.
  scalar  for elementwise primitives, the per-element lowering (e, *values, **attrs), written
          against a scalar emitter `e` that a backend supplies (see codegen). Emitter methods:
          add sub mul div neg exp log log1p sqrt tanh cos sin abs pow max min (numeric, same type operands),
          cmp(pred, a, b) with pred in < <= > >= == !=, select(c, a, b), and_ or_ not_ (bool),
          xor shl lshr (ints; a shift's amount a constant),
          cast(a, dtype), const(value, like) (a constant of the type of `like`).

Elementwise primitives take operands of one shape: the tracer inserts explicit broadcast_to
and convert nodes, so every later stage sees the exact data movement.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .errors import ShapeError

FLOATS = ("float32", "float64")
DTYPES = ("float32", "float64", "int32", "int64", "bool")
ITEMSIZE = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1}


@dataclass(frozen=True)
class Primitive:
    name: str
    kind: str
    infer: Callable
    ref: Callable
    vjp: Optional[Callable] = None
    scalar: Optional[Callable] = None


PRIMITIVES = {}


def _register(p):
    PRIMITIVES[p.name] = p
    return p


# -- elementwise ------------------------------------------------------------------------------

def _same_shape(avals, name):
    shapes = {s for s, _ in avals}
    if len(shapes) > 1:
        raise ShapeError(f"{name}: operand shapes differ: " + " vs ".join(str(s) for s, _ in avals))
    return avals[0][0]


def _ew_infer(name, dtype_rule):
    def infer(avals, attrs):
        return _same_shape(avals, name), dtype_rule(name, [d for _, d in avals], attrs)
    return infer


def _same_float(name, dts, attrs):
    if len(set(dts)) > 1 or dts[0] not in FLOATS:
        raise ShapeError(f"{name}: needs float operands of one dtype, got {', '.join(dts)}")
    return dts[0]


def _same_numeric(name, dts, attrs):
    if len(set(dts)) > 1 or dts[0] == "bool":
        raise ShapeError(f"{name}: needs numeric operands of one dtype, got {', '.join(dts)}")
    return dts[0]


def _same_int(name, dts, attrs):
    if len(set(dts)) > 1 or dts[0] not in ("int32", "int64"):
        raise ShapeError(f"{name}: needs int32 or int64 operands of one dtype, got {', '.join(dts)}")
    bits = attrs.get("bits", 0)
    if not 0 <= bits < 8 * np.dtype(dts[0]).itemsize:
        raise ShapeError(f"{name}: a shift of {bits} bits of {dts[0]}")
    return dts[0]


def _unsigned(x):
    """x's bits as the unsigned type of its width: numpy's >> of a signed int copies the sign bit."""
    return np.asarray(x).view(np.uint32 if np.asarray(x).dtype == np.int32 else np.uint64)


def _compare(name, dts, attrs):
    if len(set(dts)) > 1:
        raise ShapeError(f"{name}: operand dtypes differ: {', '.join(dts)}")
    return "bool"


def _logical(name, dts, attrs):
    if any(d != "bool" for d in dts):
        raise ShapeError(f"{name}: needs bool operands, got {', '.join(dts)}")
    return "bool"


def _select(name, dts, attrs):
    if dts[0] != "bool" or dts[1] != dts[2]:
        raise ShapeError(f"where: needs (bool, x, x) operands, got {', '.join(dts)}")
    return dts[1]


def _convert(name, dts, attrs):
    return attrs["dtype"]


def _identity_dtype(name, dts, attrs):
    return dts[0]


def elementwise(name, ref, scalar, vjp=None, dtype_rule=_same_float):
    return _register(Primitive(name, "elementwise", _ew_infer(name, dtype_rule), ref, vjp, scalar))


elementwise("neg", np.negative, lambda e, x: e.neg(x),
            lambda F, g, out, xs, needs, a: [-g], _same_numeric)
elementwise("exp", np.exp, lambda e, x: e.exp(x),
            lambda F, g, out, xs, needs, a: [g * out])
elementwise("log", np.log, lambda e, x: e.log(x),
            lambda F, g, out, xs, needs, a: [g / xs[0]])
elementwise("log1p", np.log1p, lambda e, x: e.log1p(x),
            lambda F, g, out, xs, needs, a: [g / (1.0 + xs[0])])
# expm1 by Kahan's identity, (u - 1) * x / log(u) with u = exp(x): the rounding errors of u - 1 and
# log(u) cancel, so it keeps its few-ulp accuracy near 0 from exp and log alone (no third polynomial).
elementwise("expm1", np.expm1, lambda e, x: _expm1(e, x),
            lambda F, g, out, xs, needs, a: [g * (out + 1.0)])
elementwise("cos", np.cos, lambda e, x: e.cos(x),
            lambda F, g, out, xs, needs, a: [-g * F.sin(xs[0])])
elementwise("sin", np.sin, lambda e, x: e.sin(x),
            lambda F, g, out, xs, needs, a: [g * F.cos(xs[0])])
elementwise("tanh", np.tanh, lambda e, x: e.tanh(x),
            lambda F, g, out, xs, needs, a: [g * (1.0 - out * out)])
elementwise("sqrt", np.sqrt, lambda e, x: e.sqrt(x),
            lambda F, g, out, xs, needs, a: [g * 0.5 / out])
elementwise("abs", np.abs, lambda e, x: e.abs(x),
            lambda F, g, out, xs, needs, a: [g * F.sign(xs[0])], _same_numeric)
# sign(nan) is nan: x != x is true only for nan, and selects x itself.
elementwise("sign", np.sign,
            lambda e, x: e.select(e.cmp(">", x, e.const(0, x)), e.const(1, x),
                                  e.select(e.cmp("<", x, e.const(0, x)), e.const(-1, x),
                                           e.select(e.cmp("!=", x, x), x, e.const(0, x)))),
            lambda F, g, out, xs, needs, a: [None], _same_numeric)
# sigmoid is primitive (not 1/(1+exp(-x))) so its adjoint, out*(1-out), stays finite for large |x|.
elementwise("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)),
            lambda e, x: e.div(e.const(1, x), e.add(e.const(1, x), e.exp(e.neg(x)))),
            lambda F, g, out, xs, needs, a: [g * out * (1.0 - out)])
# softplus is primitive so its slope is exactly sigmoid(x), also at 0 where a max/abs form has kinks.
elementwise("softplus", lambda x: np.logaddexp(0, x),
            lambda e, x: e.add(e.max(x, e.const(0, x)), e.log1p(e.exp(e.neg(e.abs(x))))),
            lambda F, g, out, xs, needs, a: [g * F.sigmoid(xs[0])])
elementwise("add", np.add, lambda e, x, y: e.add(x, y),
            lambda F, g, out, xs, needs, a: [g, g], _same_numeric)
elementwise("sub", np.subtract, lambda e, x, y: e.sub(x, y),
            lambda F, g, out, xs, needs, a: [g, -g], _same_numeric)
elementwise("mul", np.multiply, lambda e, x, y: e.mul(x, y),
            lambda F, g, out, xs, needs, a: [g * xs[1] if needs[0] else None,
                                             g * xs[0] if needs[1] else None], _same_numeric)
elementwise("div", np.divide, lambda e, x, y: e.div(x, y),
            lambda F, g, out, xs, needs, a: [g / xs[1] if needs[0] else None,
                                             -g * out / xs[1] if needs[1] else None])
elementwise("pow", np.power, lambda e, x, y: e.pow(x, y),
            lambda F, g, out, xs, needs, a: [_pow_base(F, g, *xs) if needs[0] else None,
                                             _pow_exponent(F, g, out, xs[0]) if needs[1] else None])
# Ties send the whole cotangent to the second operand: relu(x) = maximum(x, 0) has slope 0 at 0.
elementwise("maximum", np.maximum, lambda e, x, y: e.max(x, y),
            lambda F, g, out, xs, needs, a: _minmax(F, g, xs[0] > xs[1]), _same_numeric)
elementwise("minimum", np.minimum, lambda e, x, y: e.min(x, y),
            lambda F, g, out, xs, needs, a: _minmax(F, g, xs[0] < xs[1]), _same_numeric)


def _expm1(e, x):
    """u == 1: x itself (|x| below half an ulp of 1); u - 1 == -1: -1; u infinite: u."""
    u = e.exp(x)
    um1 = e.sub(u, e.const(1, x))
    kahan = e.mul(um1, e.div(x, e.log(u)))  # x / log(u) ~ 1 first: (u - 1) * x overflows near the top
    inner = e.select(e.cmp("==", um1, e.const(-1, x)), um1, e.select(e.cmp("==", u, e.const(np.inf, x)), u, kahan))
    return e.select(e.cmp("==", u, e.const(1, x)), x, inner)


def _pow_base(F, g, x, y):
    """y x^(y-1), but 0 where y == 0 (as jax and torch): x^0 is constant even at x = 0."""
    return g * F.where(y == 0.0, F.zeros_like(y), y * x ** (y - 1.0))


def _pow_exponent(F, g, out, x):
    """x^y log x, with log 1 in place of log 0 (as jax): at x = 0 the slope in y is 0, not 0 * -inf."""
    return g * out * F.log(F.where(x == 0.0, F.ones_like(x), x))


def _minmax(F, g, first):
    zero = F.zeros_like(g)
    return [F.where(first, g, zero), F.where(first, zero, g)]


for _name, _pred, _fn in [("lt", "<", np.less), ("le", "<=", np.less_equal), ("gt", ">", np.greater),
                          ("ge", ">=", np.greater_equal), ("eq", "==", np.equal), ("ne", "!=", np.not_equal)]:
    elementwise(_name, _fn, (lambda p: lambda e, x, y: e.cmp(p, x, y))(_pred), None, _compare)
# Bit operations on int32/int64, for counter-based random numbers (random.py): the shift is a
# static attribute in [0, bits of the dtype), so no backend meets an undefined shift.
elementwise("xor", np.bitwise_xor, lambda e, x, y: e.xor(x, y), None, _same_int)
elementwise("shl", lambda x, bits: np.left_shift(x, bits), lambda e, x, bits: e.shl(x, e.const(bits, x)),
            None, _same_int)
elementwise("lshr", lambda x, bits: (_unsigned(x) >> bits).view(np.asarray(x).dtype),
            lambda e, x, bits: e.lshr(x, e.const(bits, x)), None, _same_int)
elementwise("and", np.logical_and, lambda e, x, y: e.and_(x, y), None, _logical)
elementwise("or", np.logical_or, lambda e, x, y: e.or_(x, y), None, _logical)
elementwise("not", np.logical_not, lambda e, x: e.not_(x), None, _logical)
elementwise("where", np.where, lambda e, c, x, y: e.select(c, x, y),
            lambda F, g, out, xs, needs, a: [None, F.where(xs[0], g, F.zeros_like(g)) if needs[1] else None,
                                             F.where(xs[0], F.zeros_like(g), g) if needs[2] else None],
            _select)
elementwise("convert", lambda x, dtype: x.astype(dtype), lambda e, x, dtype: e.cast(x, dtype),
            lambda F, g, out, xs, needs, a: [F.astype(g, xs[0].dtype)
                                             if xs[0].dtype in FLOATS and a["dtype"] in FLOATS else None],
            _convert)
# `id` marks a fresh use of a value (grad differentiates w.r.t. it); simplify removes it.
elementwise("id", np.copy, lambda e, x: x, lambda F, g, out, xs, needs, a: [g], _identity_dtype)
elementwise("stop_gradient", np.copy, lambda e, x: x, lambda F, g, out, xs, needs, a: [None],
            _identity_dtype)

ELEMENTWISE_FLOAT_ONLY = {"exp", "expm1", "log", "log1p", "cos", "sin", "tanh", "sqrt", "sigmoid", "softplus", "div", "pow"}


# -- sources ----------------------------------------------------------------------------------

def _source(name, infer, ref):
    return _register(Primitive(name, "source", infer, ref))


_source("input", lambda avals, a: (a["shape"], a["dtype"]), None)
_source("const", lambda avals, a: (a["shape"], a["dtype"]),
        lambda value, shape, dtype: np.full(shape, value, dtype=dtype))
_source("literal", lambda avals, a: (a["value"].array.shape, str(a["value"].array.dtype)),
        lambda value: value.array)


def _iota_ref(shape, axis, dtype):
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(np.arange(shape[axis], dtype=dtype).reshape(view), shape)


_source("iota", lambda avals, a: (a["shape"], a["dtype"]), _iota_ref)


# -- reductions -------------------------------------------------------------------------------

def _reduce_infer(name):
    def infer(avals, a):
        (shape, dtype), = avals
        axes = a["axes"]
        if any(not 0 <= ax < len(shape) for ax in axes) or len(set(axes)) != len(axes):
            raise ShapeError(f"{name}: bad axes {axes} for shape {shape}")
        if dtype == "bool":
            raise ShapeError(f"{name}: cannot reduce bool; convert it first")
        return tuple(s for i, s in enumerate(shape) if i not in axes), dtype
    return infer


def _keep(shape, axes):
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _sum_vjp(F, g, out, xs, needs, a):
    x = xs[0]
    return [F.broadcast_to(F.reshape(g, _keep(x.shape, a["axes"])), x.shape)]


def _max_vjp(F, g, out, xs, needs, a):
    x, keep = xs[0], _keep(xs[0].shape, a["axes"])
    mask = F.astype(x == F.broadcast_to(F.reshape(out, keep), x.shape), x.dtype)
    share = F.reshape(g / F.bind("reduce_sum", [mask], axes=a["axes"]), keep)
    return [mask * F.broadcast_to(share, x.shape)]


_register(Primitive("reduce_sum", "reduce", _reduce_infer("sum"),
                    lambda x, axes: np.sum(x, axis=axes, dtype=x.dtype), _sum_vjp))
_register(Primitive("reduce_max", "reduce", _reduce_infer("max"),
                    lambda x, axes: np.max(x, axis=axes), _max_vjp))


# -- data movement ----------------------------------------------------------------------------

def _broadcast_infer(avals, a):
    (shape, dtype), = avals
    target = a["shape"]
    lead = len(target) - len(shape)
    if lead < 0 or any(s not in (1, t) for s, t in zip(shape, target[lead:])):
        raise ShapeError(f"cannot broadcast shape {shape} to {target}")
    return target, dtype


def _broadcast_vjp(F, g, out, xs, needs, a):
    shape, target = xs[0].shape, a["shape"]
    lead = len(target) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and target[lead + i] != 1)
    return [F.reshape(F.bind("reduce_sum", [g], axes=axes), shape) if axes else F.reshape(g, shape)]


def _reshape_infer(avals, a):
    (shape, dtype), = avals
    if int(np.prod(shape)) != int(np.prod(a["shape"])):
        raise ShapeError(f"cannot reshape {shape} to {a['shape']}")
    return a["shape"], dtype


def _transpose_infer(avals, a):
    (shape, dtype), = avals
    if sorted(a["perm"]) != list(range(len(shape))):
        raise ShapeError(f"transpose: bad permutation {a['perm']} for shape {shape}")
    return tuple(shape[p] for p in a["perm"]), dtype


def _slices(starts, steps, shape):
    """numpy slices picking out[i] = x[start + i * step] along each axis."""
    out = []
    for st, sp, n in zip(starts, steps, shape):
        stop = st + n * sp
        out.append(slice(st, stop if stop >= 0 else None, sp))
    return tuple(out)


def _slice_infer(avals, a):
    (shape, dtype), = avals
    for st, sp, n, size in zip(a["starts"], a["steps"], a["shape"], shape):
        last = st + (n - 1) * sp
        if n and not (0 <= st < size and 0 <= last < size):
            raise ShapeError(f"slice out of range for shape {shape}")
    return a["shape"], dtype


def _slice_ref(x, starts, steps, shape):
    return x[_slices(starts, steps, shape)]


def _pad_infer(avals, a):
    (shape, dtype), = avals
    _slice_infer([(a["shape"], dtype)], dict(a, shape=shape))
    return a["shape"], dtype


def _pad_ref(x, starts, steps, shape):
    out = np.zeros(shape, dtype=x.dtype)
    out[_slices(starts, steps, x.shape)] = x
    return out


def _concat_infer(avals, a):
    ax, (s0, d0) = a["axis"], avals[0]
    for s, d in avals:
        if d != d0 or len(s) != len(s0) or any(x != y for i, (x, y) in enumerate(zip(s, s0)) if i != ax):
            raise ShapeError("concatenate: shapes " + ", ".join(str(s) for s, _ in avals) + f" differ off axis {ax}")
    return tuple(sum(s[ax] for s, _ in avals) if i == ax else n for i, n in enumerate(s0)), d0


def _concat_vjp(F, g, out, xs, needs, a):
    ax, off, cts = a["axis"], 0, []
    for x, need in zip(xs, needs):
        starts = tuple(off if i == ax else 0 for i in range(len(x.shape)))
        cts.append(F.bind("slice", [g], starts=starts, steps=(1,) * len(x.shape), shape=x.shape) if need else None)
        off += x.shape[ax]
    return cts


_register(Primitive("broadcast_to", "shape", _broadcast_infer,
                    lambda x, shape: np.broadcast_to(x, shape), _broadcast_vjp))
_register(Primitive("reshape", "shape", _reshape_infer, lambda x, shape: x.reshape(shape),
                    lambda F, g, out, xs, needs, a: [F.reshape(g, xs[0].shape)]))
_register(Primitive("transpose", "shape", _transpose_infer, lambda x, perm: np.transpose(x, perm),
                    lambda F, g, out, xs, needs, a: [F.transpose(g, tuple(np.argsort(a["perm"]).tolist()))]))
_register(Primitive("slice", "shape", _slice_infer, _slice_ref,
                    lambda F, g, out, xs, needs, a: [F.bind("pad", [g], starts=a["starts"], steps=a["steps"],
                                                            shape=xs[0].shape)]))
# pad is the adjoint of slice: zeros of `shape` with the operand written at the sliced positions.
_register(Primitive("pad", "shape", _pad_infer, _pad_ref,
                    lambda F, g, out, xs, needs, a: [F.bind("slice", [g], starts=a["starts"], steps=a["steps"],
                                                            shape=xs[0].shape)]))
_register(Primitive("concatenate", "shape", _concat_infer,
                    lambda *xs, axis: np.concatenate(xs, axis=axis), _concat_vjp))


# -- gather / scatter -------------------------------------------------------------------------

def _check_index(idx, n):
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        bad = idx[(idx < 0) | (idx >= n)].flat[0]
        raise IndexError(f"index {bad} is out of range for an axis of size {n}")


def _take_infer(avals, a):
    (ts, td), (is_, idt) = avals
    if idt not in ("int32", "int64") or not ts:
        raise ShapeError(f"take: needs a table of rank >= 1 and integer indices, got {td}{ts} and {idt}")
    return tuple(is_) + tuple(ts[1:]), td


def _take_ref(table, idx):
    _check_index(idx, table.shape[0])
    return table[idx]


def _scatter_infer(avals, a):
    (us, ud), (is_, idt) = avals
    if idt not in ("int32", "int64") or tuple(us[:len(is_)]) != tuple(is_):
        raise ShapeError(f"scatter_add: updates {us} do not start with index shape {is_}")
    return (a["n"],) + tuple(us[len(is_):]), ud


def _scatter_ref(updates, idx, n):
    _check_index(idx, n)
    out = np.zeros((n,) + updates.shape[idx.ndim:], dtype=updates.dtype)
    np.add.at(out, idx, updates)
    return out


_register(Primitive("take", "gather", _take_infer, _take_ref,
                    lambda F, g, out, xs, needs, a: [F.bind("scatter_add", [g, xs[1]], n=xs[0].shape[0]), None]))
_register(Primitive("scatter_add", "scatter", _scatter_infer, _scatter_ref,
                    lambda F, g, out, xs, needs, a: [F.bind("take", [g, xs[1]]), None]))


# -- matmul -----------------------------------------------------------------------------------

def _matmul_infer(avals, a):
    (sa, da), (sb, db) = avals
    if (da != db or da not in FLOATS or len(sa) < 2 or len(sa) != len(sb) or sa[:-2] != sb[:-2]
            or sa[-1] != sb[-2]):
        raise ShapeError(f"matmul: shapes {sa} and {sb} (dtypes {da}, {db}) do not fit")
    return tuple(sa[:-1]) + (sb[-1],), da


def _swap(F, x):
    perm = tuple(range(len(x.shape) - 2)) + (len(x.shape) - 1, len(x.shape) - 2)
    return F.transpose(x, perm)


_register(Primitive("matmul", "matmul", _matmul_infer, np.matmul,
                    lambda F, g, out, xs, needs, a: [F.bind("matmul", [g, _swap(F, xs[1])]) if needs[0] else None,
                                                     F.bind("matmul", [_swap(F, xs[0]), g]) if needs[1] else None]))


# -- collectives ------------------------------------------------------------------------------
# allreduce: the elementwise sum of its operand over `ranks` MPI processes, every rank given the
# result. burjit.distributed's psum/pmean pack a tree's leaves into one operand per dtype. Its
# value depends on the other ranks, so passes never fold it, and it has no gradient rule: the
# cotangent of a replicated sum is not a local quantity (differentiate the local loss instead).

def _allreduce_infer(avals, a):
    ((shape, dtype),) = avals
    if dtype == "bool":
        raise ShapeError("allreduce: needs numbers, got bool")
    return shape, dtype


def _allreduce_ref(x, ranks):
    from . import distributed
    return distributed.allreduce_array(x, ranks)


def _allreduce_vjp(F, g, out, xs, needs, a):
    from .errors import TracingError
    raise TracingError("psum/pmean has no gradient here: take the gradient of this rank's own loss and "
                       "pmean the gradients (burjit.distributed.train_step does)")


_register(Primitive("allreduce", "collective", _allreduce_infer, _allreduce_ref, _allreduce_vjp))
