"""Fusion: partition the compute nodes into kernels, written to graph.meta["groups"].

The lowering contract (read by schedule, memplan and codegen): meta["groups"] is a list of
tuples of node ids, each in topological order; every non-source node is in exactly one
group, sources (input, const, iota, literal) in none, and the groups form a DAG. A group is
one of
  (a) elementwise: elementwise nodes of one shape (the group's shape) and broadcast_to nodes
      producing that shape from an operand outside the group (or a const/iota);
  (b) a single non-elementwise node (matmul, reshape, transpose, take, ...);
  (c) a reduction (reduce_sum / reduce_max) with nodes of form (a) of its input shape, each
      of which feeds the reduction (its prologue), e.g. sum(exp(x - m)).
One kernel loops once over the group's shape (for (c): the reduction's input shape) and
evaluates its nodes per index. Any node of a group may be materialised (used by another
group or a graph output): it is stored at its index in that same loop. Within one
iteration every load of a value from outside the group happens before any store (an
in-place update may write the buffer it reads, see memplan).

How: every compute node gets a level such that along each edge u -> v the level grows by 0
when u may stay inside v's kernel ("fusible") and by at least 1 otherwise; nodes are raised
as late as their users allow, so producers join their consumers. All fusible nodes of one
(level, shape) become one kernel. Edges between kernels then strictly raise the level, so
the kernel graph is acyclic by construction, and the pass is linear in the graph's size.
A 0-d (scalar) program without barriers is a single straight-line kernel.
"""

from burjit import primitives as P

from .schedule import SOURCES

REDUCTIONS = ("reduce_sum", "reduce_max")


def fuse(graph):
    graph = graph.copy()
    for key in ("schedule", "memory"):
        graph.meta.pop(key, None)
    order = [n for n in graph.topo() if graph[n]["op"] not in SOURCES]
    level = _levels(graph, order)
    klass = {}
    for n in order:
        loop = n if _loop_node(graph, n) else None
        if loop is not None:
            klass[n] = (level[n], graph[n]["shape"])
        elif graph[n]["op"] in REDUCTIONS:
            klass[n] = (level[n], graph[graph.operands(n)[0]]["shape"])
    pos = {n: i for i, n in enumerate(order)}
    # Within a class, each node goes with the first reduction it feeds (or with the rest):
    # along an edge the set of reductions fed only shrinks, so these groups stay acyclic.
    owner = {}
    for n in reversed(order):
        if n not in klass:
            continue
        if graph[n]["op"] in REDUCTIONS:
            owner[n] = pos[n]
            continue
        fed = [owner[v] for v in graph.users(n) if klass.get(v) == klass[n]]
        owner[n] = min(fed, default=len(order))
    groups = {}
    for n in order:
        key = (klass[n], owner[n]) if n in klass else n
        groups.setdefault(key, []).append(n)
    graph.meta["groups"] = sorted((tuple(g) for g in groups.values()), key=lambda g: pos[g[0]])
    return graph


def _loop_node(g, n):
    """Nodes that form (a): computed per index of their own shape."""
    return P.PRIMITIVES[g[n]["op"]].kind == "elementwise" or g[n]["op"] == "broadcast_to"


def fusible(g, u, v):
    """May operand u stay inside v's kernel?"""
    if not _loop_node(g, u) or g[v]["op"] == "broadcast_to":
        return False
    if g[v]["op"] in REDUCTIONS:
        return True
    return _loop_node(g, v) and g[u]["shape"] == g[v]["shape"]


def _levels(g, order):
    level = {}
    for n in order:
        level[n] = max((level[o] + (not fusible(g, o, n)) for o in g.operands(n) if o in level), default=0)
    for n in reversed(order):  # as late as every user allows, when that brings n into a user's kernel
        users = g.users(n)
        if any(fusible(g, n, v) for v in users):
            level[n] = max(level[n], min(level[v] - (not fusible(g, n, v)) for v in users))
    return level
