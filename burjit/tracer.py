"""Tracer values: running the user's step on these records every op into a Graph.

`bind` is the one way a node is created: it infers shape and dtype from the op registry and
stamps the user's file:line on the node, so every later error can point at user code. A 0-d op
on floats is recorded into the trace's open scalar region instead (region.py), and becomes a
node (or part of one region node) only when something reads it as a graph value.
"""

import linecache
import os
import sys
import threading

import numpy as np

from . import primitives as P
from .errors import ShapeError, TracingError
from .graph import Graph, Literal

# burjit's own folders and numpy's install folder: frames there are not the user's line.
_OWN_DIRS = tuple(os.path.dirname(os.path.abspath(p)) + os.sep for p in (
    __file__, os.path.join(os.path.dirname(__file__), "..", "passes", "x"),
    os.path.join(os.path.dirname(__file__), "..", "codegen", "x"), np.__file__))
_state = threading.local()


_own_ids, _user_ids = set(), set()  # ids of code objects in burjit or numpy / elsewhere
_known_code = []  # those code objects, kept so that their ids stay theirs
_sites = {}      # (id(code object), instruction offset) -> 'file:line'
_lines = {}      # (file, line) -> 'file:line': one string per line, not one per node


def user_src():
    """'file:line' of the innermost frame outside burjit (and outside numpy). Code objects are
    told apart by id, in two sets (a code object hashes its whole contents each time; a call
    per frame would cost more than the walk); the call site by its code and instruction offset
    (a frame's f_lineno is computed from the line table on each read)."""
    f = sys._getframe(1)
    while f is not None:
        code = f.f_code
        k = id(code)
        if k not in _user_ids:
            if k in _own_ids:
                f = f.f_back
                continue
            _known_code.append(code)
            if os.path.abspath(code.co_filename).startswith(_OWN_DIRS):
                _own_ids.add(k)
                f = f.f_back
                continue
            _user_ids.add(k)
        site = (k, f.f_lasti)
        src = _sites.get(site)
        if src is None:
            line = (code.co_filename, f.f_lineno)
            src = _sites[site] = _lines.setdefault(line, f"{line[0]}:{line[1]}")
        return src
    return "<unknown>"


def describe(src):
    """'file:line: <source text>' for messages."""
    if not src or ":" not in src:
        return src or "<unknown>"
    path, _, line = src.rpartition(":")
    text = linecache.getline(path, int(line)).strip() if line.isdigit() else ""
    return f"{src}: {text}" if text else src


class Trace:
    """One active recording. Traces nest (a step that calls grad traces into the same graph).
    `regions`: the open scalar region of each float dtype (region.py); `tier` as compile() got it;
    `src`, when set, the file:line new nodes get (grad sets it to the line of the op it differentiates)."""

    def __init__(self, tier="auto", parent=None):
        self.graph = Graph()
        self.regions, self.tier, self.src = {}, tier, None
        self.parent = parent  # a loop body's trace: the trace its loop is in (control.py)
        self.captured = {}    # outer node -> this trace's input for it, in the order read
        self.custom_vjps = {}  # an output node of a custom_vjp call -> its rule (custom.py)

    def own(self, t):
        """t as a value of this trace: itself, or, in a loop body, the body's input standing for a
        value of an enclosing trace (captured once, becoming an operand of the loop node)."""
        if t.trace is self:
            return t
        if self.parent is None:  # t is of no enclosing trace
            raise TracingError(f"{describe(user_src())}\n  a traced value from another (finished) trace was used; "
                               "do not keep traced values in globals between steps")
        outer = self.parent.own(t)
        inner = self.captured.get(outer.node)
        if inner is None:
            inner = self.captured[outer.node] = self.input(outer.shape, outer.dtype)
        return inner

    def input(self, shape, dtype):
        """A new input of this trace's graph, the next in order."""
        g = self.graph
        node = g.add("input", [], shape, dtype, {"index": len(g.inputs), "shape": tuple(shape), "dtype": dtype})
        g.inputs.append(node)
        return Tracer(self, node, tuple(shape), dtype)

    def __enter__(self):
        _stack().append(self)
        return self

    def __exit__(self, *exc):
        _stack().pop()
        for n, a in self.graph.nx.nodes(data=True):  # region nodes: their recording state goes
            if a["op"] == "region":
                a["attrs"]["region"].seal()


def _stack():
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


def current_trace():
    st = getattr(_state, "stack", None)
    return st[-1] if st else None


def bind(op, operands, **attrs):
    """Add node `op(*operands)` to the current trace and return its Tracer."""
    trace = current_trace()
    if trace is None:
        raise TracingError(f"{op}: traced ops need an active burjit trace (use burjit.compile)")
    for o in operands:
        if o.trace is not trace:
            operands = [trace.own(o) for o in operands]
            break
    # a scalar constant recorded in a region never fails: it skips the frame walk (a third of a
    # scalar op's cost); a constant that becomes a node takes its line below
    src = trace.src or (None if op == "const" else user_src())
    try:
        if op in _R.OPS and trace.tier != "straight":
            t = _R.record(trace, op, operands, attrs, src)
            if t is not None:
                return t
        src = src or user_src()
        shape, dtype = P.PRIMITIVES[op].infer([(o.shape, o.dtype) for o in operands], attrs)
    except ShapeError as e:
        raise ShapeError(f"{describe(src or user_src())}\n  {e}") from None
    node = trace.graph.add(op, [o.node for o in operands], shape, dtype, attrs, src)
    return Tracer(trace, node, tuple(shape), dtype)


def lift(x, like=None):
    """Make x a Tracer: Python scalars take the dtype of `like` (weak typing), arrays become literals."""
    if isinstance(x, Tracer):
        return x
    if not isinstance(x, (bool, int, float, np.ndarray, np.generic, list, tuple)):
        raise TracingError(f"{describe(user_src())}\n  a {type(x).__name__} cannot be used as an array "
                           "in a traced step")
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        natural = "bool" if isinstance(x, bool) else "int64" if isinstance(x, int) else "float64"
        dtype = natural
        if like is not None and like.dtype != "bool" and not (natural == "float64" and like.dtype not in P.FLOATS):
            dtype = like.dtype
        return bind("const", [], value=x, shape=(), dtype=dtype)
    arr = np.asarray(x)
    check_dtype(arr.dtype, "a captured array")
    if arr.ndim == 0:
        return bind("const", [], value=arr.item(), shape=(), dtype=str(arr.dtype))
    return bind("literal", [], value=Literal(arr))


def check_dtype(dtype, what):
    if str(dtype) not in P.DTYPES:
        raise TracingError(f"{describe(user_src())}\n  {what} has dtype {dtype}; burjit supports "
                           + ", ".join(P.DTYPES))
    return str(dtype)


class Tracer:
    """A traced array. Supports numpy's operators; see burjit.ops for the functions."""

    __slots__ = ("trace", "node", "shape", "dtype")
    __hash__ = object.__hash__

    # numpy functions called on tracers (np.exp(x), np_array * x, np.sum(x)) trace like burjit.ops.
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        fn = getattr(_F, _UFUNCS.get(ufunc.__name__, ""), None)
        if method != "__call__" or kwargs or fn is None:
            raise TracingError(f"{describe(user_src())}\n  numpy.{ufunc.__name__}.{method} is not supported "
                               "on traced values; use burjit.ops")
        return fn(*inputs)

    def __array_function__(self, func, types, args, kwargs):
        fn = getattr(_F, _FUNCTIONS.get(func.__name__, ""), None)
        if fn is None:
            raise TracingError(f"{describe(user_src())}\n  numpy.{func.__name__} is not supported on traced "
                               "values; use burjit.ops")
        return fn(*args, **kwargs)

    def __init__(self, trace, node, shape, dtype):
        self.trace, self.node, self.shape, self.dtype = trace, node, shape, dtype

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def __repr__(self):
        return f"Tracer(%{self.node}, shape={self.shape}, dtype={self.dtype})"

    def _refuse(self, what):
        raise TracingError(
            f"{describe(user_src())}\n  {what} of a traced value: its value is not known while tracing. "
            "Use burjit.ops.where / maximum / minimum instead of Python control flow on traced values, "
            "and burjit.fori_loop / scan (fixed trip counts) instead of Python loops over them.")

    def __bool__(self):
        self._refuse("bool()")

    def __float__(self):
        self._refuse("float()")

    def __int__(self):
        self._refuse("int()")

    def __index__(self):
        self._refuse("using as an index")

    def __complex__(self):
        self._refuse("complex()")

    def __array__(self, dtype=None, copy=None):
        self._refuse("numpy.asarray()")

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d traced value")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d traced value")
        return (self[i] for i in range(self.shape[0]))

    # Arithmetic: ops.py holds the numpy-broadcasting implementations.
    def __add__(self, o): return _F.add(self, o)
    def __radd__(self, o): return _F.add(o, self)
    def __sub__(self, o): return _F.subtract(self, o)
    def __rsub__(self, o): return _F.subtract(o, self)
    def __mul__(self, o): return _F.multiply(self, o)
    def __rmul__(self, o): return _F.multiply(o, self)
    def __truediv__(self, o): return _F.divide(self, o)
    def __rtruediv__(self, o): return _F.divide(o, self)
    def __pow__(self, o): return _F.power(self, o)
    def __rpow__(self, o): return _F.power(o, self)
    def __matmul__(self, o): return _F.matmul(self, o)
    def __rmatmul__(self, o): return _F.matmul(o, self)
    def __neg__(self): return _F.negative(self)
    def __pos__(self): return self
    def __abs__(self): return _F.abs(self)
    def __lt__(self, o): return _F.less(self, o)
    def __le__(self, o): return _F.less_equal(self, o)
    def __gt__(self, o): return _F.greater(self, o)
    def __ge__(self, o): return _F.greater_equal(self, o)
    def __eq__(self, o): return _F.equal(self, o)
    def __ne__(self, o): return _F.not_equal(self, o)
    def __and__(self, o): return _F.logical_and(self, o)
    def __or__(self, o): return _F.logical_or(self, o)
    def __invert__(self): return _F.logical_not(self)
    def __getitem__(self, key): return _F.getitem(self, key)

    @property
    def T(self): return _F.transpose(self)
    def transpose(self, *axes): return _F.transpose(self, axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else (axes or None))
    def reshape(self, *shape): return _F.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)
    def sum(self, axis=None, keepdims=False): return _F.sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return _F.mean(self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return _F.max(self, axis, keepdims)
    def min(self, axis=None, keepdims=False): return _F.min(self, axis, keepdims)
    def astype(self, dtype): return _F.astype(self, dtype)
    def exp(self): return _F.exp(self)
    def log(self): return _F.log(self)
    def tanh(self): return _F.tanh(self)
    def relu(self): return _F.relu(self)
    def sigmoid(self): return _F.sigmoid(self)


_UFUNCS = {n: n for n in ("add", "subtract", "multiply", "divide", "power", "negative", "exp", "log", "log1p",
                           "tanh", "sqrt", "square", "sign", "maximum", "minimum", "less", "less_equal",
                           "greater", "greater_equal", "equal", "not_equal", "logical_and", "logical_or",
                           "logical_not", "matmul", "expm1", "cos", "sin")}
_UFUNCS.update(true_divide="divide", absolute="abs", float_power="power")
_FUNCTIONS = {n: n for n in ("sum", "mean", "max", "min", "where", "concatenate", "transpose", "reshape",
                             "broadcast_to", "take", "matmul", "exp", "log", "log1p", "tanh", "sqrt", "abs",
                             "argmax", "argmin", "clip", "var", "std", "cumsum", "einsum")}
_FUNCTIONS.update(amax="max", amin="min")

from . import ops as _F  # noqa: E402  (ops builds on Tracer; Tracer's operators call into ops)
from . import region as _R  # noqa: E402  (regions are Tracers too)
