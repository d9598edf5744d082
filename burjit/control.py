"""Loops traced once: `scan`, `fori_loop` and `while_loop` (JAX's semantics), each one `loop` node whose body is a graph.

The body is traced once, in a Trace of its own nested in the step's (tracer.Trace.own). Its
graph's inputs are the carry leaves, the iteration index (int64, 0-d: `lower + i` for
fori_loop), one row of each `xs` leaf, then each outer value the body reads (captured as it is
read); its outputs are the new carry leaves (aliased to the carry inputs, so the body updates
the carry in place) and then each `y` leaf. The loop node's operands are the initial carry, the
xs leaves and the captures; its value is one vector holding the final carry leaves and then
each stacked y (`length` rows): of their dtype if they share one, unpacked with slice +
reshape, else int64 words holding each leaf's bytes (PACKED), unpacked with `bitcast`. A while loop has
no length and no xs: its one y is cond(new carry) in the carry's dtype (float64 if mixed), and its node reads
cond(init) (an operand after the carry) to know whether to run at all. Backends run the body
over that vector: the reference evaluates the body graph per iteration, native compiles it as a
step of its own and calls it from a loop in the driver (codegen/bodies.py).
"""

import math

import numpy as np

from . import primitives as P
from . import pytree
from .errors import TracingError
from . import ops as F
from .tracer import Trace, Tracer, bind, current_trace, describe, lift, user_src


PACKED = "int64"  # the vector's dtype when the leaves' dtypes differ: each leaf's bytes in 8-byte words


def elements(shape, dtype, vector_dtype):
    """How many elements of the vector a leaf of this shape and dtype takes."""
    n = math.prod(shape)
    return n if vector_dtype != PACKED else -(-n * P.ITEMSIZE[dtype] // 8)


def layout(shapes, dtypes, vector_dtype, at=0):
    """[(offset, shape, dtype)] of leaves placed one after another from element `at` on (64-byte
    alignment of each was measured: a loop of BurTorch GPT steps ran no faster)."""
    out = []
    for shape, d in zip(shapes, dtypes):
        out.append((at, tuple(shape), d))
        at += elements(shape, d, vector_dtype)
    return out


class Body:
    """A loop body: its graph and how the loop node's operands and value map onto it."""

    def __init__(self, graph, length, start, reverse, n_carry, n_xs, dtype, leaves, src, role="loop"):
        self.graph, self.length, self.start, self.reverse = graph, length, start, reverse
        self.n_carry, self.n_xs, self.dtype, self.src = n_carry, n_xs, dtype, src
        self.role = role  # "loop", or "adjoint": reverse mode's (loop_reverse.py)
        self.stored = None  # where reverse mode made it store its carries: their first leaf's index
        self.rules = {}  # the body trace's custom_vjp rules (custom.py), which reverse mode's replay rebinds
        self.leaves = leaves  # per output leaf (carry, then ys): (offset, shape, dtype) in the loop's vector
        last = leaves[-1] if leaves else (0, (0,), dtype)
        self.size = last[0] + elements(last[1], last[2], dtype)
        self.key = (graph.fingerprint(), length, start, reverse, n_carry, n_xs, dtype, tuple(leaves))

    def __repr__(self):  # what graph.fingerprint hashes: the body's content, not its identity
        return f"Body{self.key!r}"

    def __str__(self):  # step.graph() prints the body's graph below the loop
        if self.length is None:
            return "body(while)"
        return f"body(length={self.length}, start={self.start}, reverse={self.reverse})"

    def __eq__(self, other):
        return type(other) is Body and other.key == self.key

    def __hash__(self):
        return hash(self.key)

    def with_graph(self, graph):
        """This body with its graph replaced (by the passes' result: same values, same key)."""
        other = object.__new__(Body)
        other.__dict__.update(self.__dict__, graph=graph)
        return other

    def iteration(self, k):
        """The row of xs and ys that step k (0, 1, ...) of the loop reads and writes."""
        return self.length - 1 - k if self.reverse else k


def scan(f, init, xs=None, length=None, reverse=False):
    """Like jax.lax.scan: `f(carry, x) -> (carry, y)` over the rows of `xs` (a pytree of arrays
    sharing their leading axis), returning (final carry, ys stacked along a new axis 0). With
    xs=None, `length` steps with x = None. The carry keeps its structure, shapes and dtypes."""
    return _loop(lambda i, c, x: f(c, x), init, xs, length, reverse, 0, user_src(), "scan")


def fori_loop(lower, upper, body_fun, init_val):
    """Like jax.lax.fori_loop: `body_fun(i, val) -> val` for i in range(lower, upper). With Python
    int bounds the trip count is fixed when the step compiles (and `grad` goes through it); a
    traced integer bound makes it a while_loop over (i, val), compiled once for every count."""
    src = user_src()
    traced = False
    for name, v in (("lower", lower), ("upper", upper)):
        if isinstance(v, Tracer) and v.shape == () and v.dtype in ("int32", "int64"):
            traced = True
        elif isinstance(v, Tracer) or not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TracingError(f"{describe(src)}\n  fori_loop: {name} must be a Python int or a traced integer "
                               f"scalar, got {f'a traced {v.dtype}{list(v.shape)}' if isinstance(v, Tracer) else type(v).__name__}")
    if traced:
        upper = F.astype(upper, "int64")
        i, val = while_loop(lambda c: c[0] < upper, lambda c: (c[0] + 1, body_fun(c[0], c[1])),
                            (F.astype(lift(lower), "int64"), init_val))
        return val
    carry, _ = _loop(lambda i, c, x: (body_fun(i, c), None), init_val, None, max(int(upper) - int(lower), 0),
                     False, int(lower), src, "fori_loop")
    return carry


def while_loop(cond_fun, body_fun, init_val):
    """Like jax.lax.while_loop: `val = body_fun(val)` while `cond_fun(val)` (a bool scalar) holds.

    cond_fun runs once on init_val in the step, then once after each iteration inside the
    body, so a loop whose condition is false at once never runs its body."""
    src = user_src()
    _outer(src, "while_loop")
    go = _condition(cond_fun, init_val, src)
    carry, _ = _loop(lambda i, c, x: (body_fun(c), None), init_val, None, None, False, 0, src, "while_loop",
                     cond=lambda c: _condition(cond_fun, c, src), go=go)
    return carry


def _condition(cond_fun, val, src):
    c = lift(cond_fun(val))
    if c.shape != () or c.dtype != "bool":
        raise TracingError(f"{describe(src)}\n  while_loop: cond_fun must return a bool scalar, got "
                           f"{c.dtype}{list(c.shape)}")
    return c


def _outer(src, name):
    outer = current_trace()
    if outer is None:
        raise TracingError(f"{describe(src)}\n  {name}: needs an active burjit trace (use it inside burjit.compile)")
    return outer


def _loop(f, init, xs, length, reverse, start, src, name, cond=None, go=None, role="loop"):
    """The loop node of `f(index, carry, x) -> (carry, y)`. A while loop (cond given) has no
    length: its body also computes cond(new carry), as the vector's last element, and its
    node reads `go`, cond(init), to know whether to run at all (both as the flag's dtype:
    the carry's if it has one, else float64)."""
    outer = _outer(src, name)
    init_leaves, init_td = pytree.flatten(init)
    carry0 = [lift(x) for x in init_leaves]
    xs_leaves, xs_td = pytree.flatten(xs)
    xs0 = [lift(x) for x in xs_leaves]
    length = None if cond else _length(xs0, length, src, name)
    if cond:
        kinds = {t.dtype for t in carry0}
        proceed = F.astype(go, kinds.pop() if len(kinds) == 1 else "float64")
    with Trace(outer.tier, parent=outer) as body:
        carry = [body.input(t.shape, t.dtype) for t in carry0]
        index = body.input((), "int64")
        rows = [body.input(x.shape[1:], x.dtype) for x in xs0]
        out = f(index, pytree.unflatten(init_td, carry), None if xs is None else pytree.unflatten(xs_td, rows))
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TracingError(f"{describe(src)}\n  {name}: the body must return (carry, y), got a {type(out).__name__}")
        new_leaves, new_td = pytree.flatten(out[0])
        y_leaves, y_td = pytree.flatten(out[1])
        new = [body.own(lift(x)) for x in new_leaves]
        ys = [body.own(lift(y)) for y in y_leaves]
        _check_carry(init_td, carry0, new_td, new, src, name)
        if cond:  # ys is the flag alone: cond of the new carry, in the carry's dtype
            ys = [body.own(F.astype(cond(pytree.unflatten(new_td, new)), proceed.dtype))]
        body.graph.outputs = [t.node for t in new + ys]
    body.graph.aliases = {j: j for j in range(len(carry))}
    body.graph.meta.update(donated=list(range(len(carry))), tier=outer.tier)
    captures = list(body.captured)
    shapes = [t.shape for t in carry0] + [y.shape if cond else (length,) + y.shape for y in ys]
    dtypes = [t.dtype for t in carry0 + ys]
    dtype = dtypes[0] if len(set(dtypes)) == 1 else PACKED
    spec = Body(body.graph, length, start, reverse, len(carry0), len(xs0), dtype,
                layout(shapes, dtypes, dtype), src, role)
    spec.rules = body.custom_vjps
    operands = [t.node for t in carry0 + xs0 + ([proceed] if cond else [])] + captures
    graph = outer.graph
    node = graph.add("loop", operands, (spec.size,), dtype, {"body": spec}, src)
    vec = Tracer(outer, node, (spec.size,), dtype)
    leaves = [_unpack(vec, off, shape, d) for off, shape, d in spec.leaves]
    carry_out = pytree.unflatten(init_td, leaves[:len(carry0)])
    return carry_out, None if cond else pytree.unflatten(y_td, leaves[len(carry0):])


def _length(xs0, length, src, name):
    lengths = sorted({x.shape[0] for x in xs0 if x.ndim})
    if any(x.ndim == 0 for x in xs0):
        raise TracingError(f"{describe(src)}\n  {name}: every leaf of xs needs a leading axis to scan over; one is 0-d")
    if len(lengths) > 1 or (lengths and length is not None and int(length) != lengths[0]):
        got = ", ".join(map(str, lengths + ([int(length)] if length is not None else [])))
        raise TracingError(f"{describe(src)}\n  {name}: the leaves of xs (and length) disagree on the number of "
                           f"iterations: {got}")
    if length is None and not lengths:
        raise TracingError(f"{describe(src)}\n  {name}: with no xs, give length")
    n = lengths[0] if lengths else int(length)
    if n < 0:
        raise TracingError(f"{describe(src)}\n  {name}: length must be >= 0, got {n}")
    return n


def _check_carry(init_td, carry0, new_td, new, src, name):
    if new_td != init_td:
        raise TracingError(f"{describe(src)}\n  {name}: the body returned a carry of another structure than it "
                           f"was given: {new_td} vs {init_td}")
    for k, (a, b) in enumerate(zip(carry0, new)):
        if (a.shape, a.dtype) != (b.shape, b.dtype):
            raise TracingError(f"{describe(src)}\n  {name}: carry leaf {k} enters the body as {a.dtype}{list(a.shape)} "
                               f"and leaves it as {b.dtype}{list(b.shape)}; a carry keeps its shape and dtype")


def _unpack(vec, off, shape, dtype):
    if vec.dtype == PACKED and dtype != PACKED:
        return bind("bitcast", [vec], start=off, shape=tuple(shape), dtype=dtype)
    size = math.prod(shape)
    return F.reshape(bind("slice", [vec], starts=(off,), steps=(1,), shape=(size,)), shape)


# -- the `loop` primitive -------------------------------------------------------------------------

def _infer(avals, attrs):
    body = attrs["body"]
    return (body.size,), body.dtype


def evaluate(*operands, body):
    """The reference: the body graph evaluated once per iteration with numpy."""
    from .reference import evaluate as run
    nc, nx = body.n_carry, body.n_xs
    carry, xs, captures = list(operands[:nc]), operands[nc:nc + nx], list(operands[nc + nx:])
    if body.length is None:  # while: operand nc is cond(init); the body's last output cond(new carry)
        go, k, captures = operands[nc], 0, captures[1:]
        while go:
            *carry, go = run(body.graph, carry + [np.int64(k)] + captures)
            k += 1
        return _pack(body, carry + [go])
    ys = [np.empty(shape, d) for _, shape, d in body.leaves[nc:]]
    for k in range(body.length):
        i = body.iteration(k)
        outs = run(body.graph, carry + [np.int64(body.start + i)] + [x[i] for x in xs] + captures)
        carry = outs[:nc]
        for y, row in zip(ys, outs[nc:]):
            y[i] = row
    return _pack(body, carry + ys)


def _pack(body, arrays):
    """The loop's vector holding `arrays` (its leaves, at their offsets; zeros between)."""
    vec = np.zeros(body.size, body.dtype)
    raw = vec.view(np.uint8)
    for a, (off, shape, d) in zip(arrays, body.leaves):
        data = np.ascontiguousarray(a, d if body.dtype == PACKED else body.dtype).view(np.uint8).ravel()
        at = off * P.ITEMSIZE[body.dtype]
        raw[at:at + data.size] = data
    return vec


# -- the `bitcast` primitive: a packed leaf read back from the loop's vector ---------------------

def _bitcast_infer(avals, attrs):
    return attrs["shape"], attrs["dtype"]


def _bitcast(vec, start, shape, dtype):
    n = math.prod(shape) * P.ITEMSIZE[dtype]
    return np.frombuffer(np.ascontiguousarray(vec).tobytes()[8 * start:8 * start + n], dtype).reshape(shape).copy()


def _vjp(*args):
    from .loop_reverse import vjp  # it traces loops itself
    return vjp(*args)


def _bitcast_vjp(*args):
    from .loop_reverse import bitcast_vjp
    return bitcast_vjp(*args)


P._register(P.Primitive("loop", "loop", _infer, evaluate, _vjp))
P._register(P.Primitive("bitcast", "bitcast", _bitcast_infer, _bitcast, _bitcast_vjp))
