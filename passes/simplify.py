"""Simplify: algebraic identities, constant folding, CSE, then DCE, in one topological sweep.

Why one sweep: operands are final before their users are visited, so each rewrite sees
already-simplified operands and the whole pass stays near-linear (100k-node scalar graphs).
Rewrites change the copied node in place (same id, new op/attrs/operands) or forward its
uses to an existing node; no node is ever created, so ids stay stable for debugging.

Kept intact: graph.inputs (even unused ones) and the positions of graph.outputs. A collective
(allreduce) of constants is never folded: its value is the other ranks' too, known only at run time.
"""

import numpy as np

from burjit import primitives as P
from burjit.graph import Literal, value_key

from .schedule import SOURCES

# Foldable results bigger than this stay computed (a literal is memory the step must read).
FOLD_LIMIT_BYTES = 1 << 16
_IDENTITY_OPS = ("id", "stop_gradient")  # after autodiff these are plain copies
_MOVES = ("broadcast_to", "reshape", "transpose", "slice")  # a uniform operand stays uniform
_CONST_SOURCES = ("const", "literal", "iota")


def simplify(graph):
    graph = graph.copy()
    for key in ("groups", "schedule", "memory"):
        graph.meta.pop(key, None)
    seen, moved = {}, {}
    for n in graph.topo():
        if graph[n]["op"] == "input":
            continue
        target = _rewrite(graph, n)
        if target is None:
            key = _cse_key(graph, n)
            target = seen.setdefault(key, n) if key is not None else n
        if target != n:  # targets are final: their own uses were redirected when they were visited
            for user, k in graph.uses(n):
                graph.set_operand(user, k, target)
            moved[n] = target
    graph.outputs = [moved.get(o, o) for o in graph.outputs]
    return _drop_dead(graph)


def dce(graph):
    """Drop every node no output depends on; inputs stay (their positions are the signature)."""
    return _drop_dead(graph.copy())


def _drop_dead(graph):
    live, stack = set(graph.inputs), list(graph.outputs)
    while stack:
        n = stack.pop()
        if n not in live:
            live.add(n)
            stack.extend(graph.operands(n))
    graph.nx.remove_nodes_from([n for n in list(graph.nx.nodes) if n not in live])
    return graph


# -- rewrites: return the node that replaces n, or None to keep n (possibly changed in place) --

def _rewrite(g, n):
    a = g[n]
    op, xs = a["op"], g.operands(n)
    if op in _IDENTITY_OPS or (op == "convert" and g[xs[0]]["dtype"] == a["dtype"]):
        return xs[0]
    if op in _MOVES and g[xs[0]]["shape"] == a["shape"] and _is_noop_move(a):
        return xs[0]
    if xs and all(g[x]["op"] in _CONST_SOURCES for x in xs) and P.PRIMITIVES[op].kind != "collective":
        _fold(g, n)
        return None
    if op == "where" and g[xs[0]]["op"] == "const":  # e.g. pow's `y == 0` guard for a literal y
        return xs[1] if g[xs[0]]["attrs"]["value"] else xs[2]
    if op == "neg" and g[xs[0]]["op"] == "neg":
        return g.operands(xs[0])[0]
    if op == "add" and all(g[x]["op"] == "pad" for x in xs):
        _pads_to_concatenate(g, n, xs)
        return None
    if op in ("add", "sub", "mul", "div"):
        return _neutral(g, op, xs)
    if op in ("broadcast_to", "reshape") and g[xs[0]]["op"] == op:
        g.set_operand(n, 0, g.operands(xs[0])[0])
        return _rewrite(g, n)
    if op == "transpose" and g[xs[0]]["op"] == "transpose":
        inner = g[xs[0]]["attrs"]["perm"]
        a["attrs"]["perm"] = tuple(inner[p] for p in a["attrs"]["perm"])
        g.set_operand(n, 0, g.operands(xs[0])[0])
        return _rewrite(g, n)
    if op == "transpose" and _keeps_element_order(g[xs[0]]["shape"], a["attrs"]["perm"]):
        a["op"], a["attrs"] = "reshape", {"shape": a["shape"]}  # a view instead of a copy
        return _rewrite(g, n)
    return None


def _pads_to_concatenate(g, n, pads):
    """add(pad(a), pad(b)) -> concatenate(a, b) when a and b tile the result along one axis,
    in place: the adjoint of x[0] and x[1] of a two-row x is one copy per row, not two zero
    fills and an add over the whole result."""
    parts = []
    for x in pads:
        at, (o,) = g[x]["attrs"], g.operands(x)
        inner, outer = g[o]["shape"], g[x]["shape"]
        cut = [d for d in range(len(outer)) if inner[d] != outer[d]]
        if len(cut) != 1 or any(st for d, st in enumerate(at["starts"]) if d != cut[0]) \
                or any(k > 1 and sp != 1 for k, sp in zip(inner, at["steps"])):
            return
        parts.append((cut[0], at["starts"][cut[0]], inner[cut[0]], o))
    (axis, lo, size, first), (axis2, lo2, size2, second) = sorted(parts, key=lambda p: p[1])
    if axis != axis2 or lo != 0 or lo2 != size or lo2 + size2 != g[n]["shape"][axis]:
        return
    g.set_operand(n, 0, first)
    g.set_operand(n, 1, second)
    g[n]["op"], g[n]["attrs"] = "concatenate", {"axis": axis}


def _keeps_element_order(shape, perm):
    """True when only axes of size 1 move (e.g. (16, 1) -> (1, 16)): the bytes stay as they are."""
    moved = [p for p in perm if shape[p] != 1]
    return moved == sorted(moved)


def _is_noop_move(a):
    """True for a same-shape move that keeps every element in place."""
    at = a["attrs"]
    if a["op"] == "transpose":
        return tuple(at["perm"]) == tuple(range(len(at["perm"])))
    if a["op"] == "slice":
        return all(s == 0 for s in at["starts"]) and all(s == 1 for s in at["steps"])
    return True


def _neutral(g, op, xs):
    """x * 1, 1 * x, x / 1, x - 0, x + (-0.0), (-0.0) + x  ->  x. Not x + 0.0: at x = -0.0 that is +0.0."""
    signed_zero = g[xs[0]]["dtype"] in P.FLOATS

    def unit(v):
        if v is None:
            return False
        if op in ("mul", "div"):
            return v == 1
        return v == 0 and (not signed_zero or bool(np.signbit(v)) == (op == "add"))

    if unit(_const_value(g, xs[1])):
        return xs[0]
    if op in ("add", "mul") and unit(_const_value(g, xs[0])):
        return xs[1]
    return None


def _const_value(g, n):
    a = g[n]
    return a["attrs"]["value"] if a["op"] == "const" and not isinstance(a["attrs"]["value"], bool) else None


def _fold(g, n):
    """Evaluate n from constant operands; a uniform result becomes `const`, else a small `literal`."""
    a = g[n]
    xs = g.operands(n)
    prim = P.PRIMITIVES[a["op"]]
    if all(g[x]["op"] == "const" for x in xs) and (prim.kind == "elementwise" or a["op"] in _MOVES):
        scalars = [np.asarray(g[x]["attrs"]["value"], dtype=g[x]["dtype"]) for x in xs]
        with np.errstate(all="ignore"):
            value = prim.ref(*scalars, **a["attrs"]) if prim.kind == "elementwise" else scalars[0]
        return _become(g, n, "const", value=np.asarray(value, dtype=a["dtype"]).item(), shape=a["shape"],
                       dtype=a["dtype"])
    if max(g.nbytes(m) for m in xs + [n]) > FOLD_LIMIT_BYTES or a["op"] in ("broadcast_to", "pad"):
        return None  # folding would only turn cheap index arithmetic into stored bytes
    vals = [P.PRIMITIVES[g[x]["op"]].ref(**g[x]["attrs"]) for x in xs]
    try:
        with np.errstate(all="ignore"):
            value = np.asarray(prim.ref(*vals, **a["attrs"]), dtype=a["dtype"])
    except IndexError:
        return None  # an out-of-range gather raises at run time, not at compile time
    if value.size and value.tobytes() == np.full_like(value, value.flat[0]).tobytes():
        return _become(g, n, "const", value=value.flat[0].item(), shape=a["shape"], dtype=a["dtype"])
    return _become(g, n, "literal", value=Literal(value))


def _become(g, n, op, **attrs):
    for k, x in enumerate(g.operands(n)):
        g.nx.remove_edge(x, n, key=k)
    g[n]["op"], g[n]["attrs"] = op, attrs


def _cse_key(g, n):
    a = g[n]
    try:  # by bit pattern: constants 0.0 and -0.0 must stay apart
        attrs = tuple((k, value_key(v)) for k, v in sorted(a["attrs"].items()))
    except TypeError:
        return None
    return a["op"], a["dtype"], a["shape"], attrs, tuple(g.operands(n))
