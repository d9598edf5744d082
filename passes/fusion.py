"""Fusion: partition the compute nodes into kernels, written to graph.meta["groups"].

The lowering contract (read by schedule, memplan and codegen): meta["groups"] is a list of
tuples of node ids, each in topological order; every non-source node is in exactly one
group, sources (input, const, iota, literal) in none, and the groups form a DAG. A group is
one of
  (a) elementwise: elementwise nodes of one shape (the group's shape) and broadcast_to nodes
      producing that shape from an operand outside the group (or a const/iota);
  (b) a single non-elementwise node (matmul, reshape, transpose, take, ...);
  (c) a reduction (reduce_sum / reduce_max) with nodes of form (a) of its input shape: its
      prologue (e.g. sum(exp(x - m))), and other per-index work of that shape that reads the
      prologue and rides along in the same loop (e.g. the adjoint exp(x) * c next to sum(exp(x))).
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

import networkx as nx

from burjit import primitives as P

from .schedule import SOURCES

REDUCTIONS = ("reduce_sum", "reduce_max")


def fuse(graph):
    graph = graph.copy()
    for key in ("schedule", "memory"):
        graph.meta.pop(key, None)
    program = graph.topo()
    copies = _one_broadcast_per_kernel(graph)
    order = [m for n in program if graph[n]["op"] not in SOURCES for m in copies.get(n, []) + [n]]
    pos = {n: i for i, n in enumerate(order)}
    klass = _classes(graph, order)
    owner, rest = _owners(graph, order, klass, pos), len(order)
    groups = {}
    for n in order:
        groups.setdefault((klass[n], owner[n]) if n in klass else n, []).append(n)
    pieces = []
    for nodes in groups.values():
        if nodes[0] in klass and owner[nodes[0]] == rest and klass[nodes[0]][1] != ():
            # Unrelated elementwise work stays apart, free to run when its operands are
            # ready; 0-d work becomes one straight-line block.
            pieces.extend(sorted(c, key=pos.get) for c in nx.weakly_connected_components(graph.nx.subgraph(nodes)))
        else:
            pieces.append(nodes)
    graph.meta["groups"] = _in_program_order(graph, pieces, pos)
    return graph


def _classes(g, order):
    """(level, loop shape) of every node that may share a loop; reductions take their input's shape."""
    level = _levels(g, order)
    klass = {}
    for n in order:
        if _loop_node(g, n):
            klass[n] = (level[n], g[n]["shape"])
        elif g[n]["op"] in REDUCTIONS:
            klass[n] = (level[n], g[g.operands(n)[0]]["shape"])
    return klass


def _owners(g, order, klass, pos):
    """Which reduction's kernel each classed node joins (len(order): none, the plain rest).

    A node goes with the first reduction it feeds: along an edge the set of reductions fed
    only shrinks, so owners never decrease along an edge and the kernels stay acyclic. A node
    feeding none rides along with the last owner among its operands (owners still never
    decrease), or, reading none of them, stays with the class's plain elementwise rest.
    """
    owner, rest = {}, len(order)
    for n in reversed(order):
        if n in klass:
            fed = [owner[v] for v in g.users(n) if klass.get(v) == klass[n]]
            owner[n] = pos[n] if g[n]["op"] in REDUCTIONS else min(fed, default=rest)
    for n in order:
        if n in klass and owner[n] == rest:
            owner[n] = max((owner[o] for o in g.operands(n) if klass.get(o) == klass[n]), default=rest)
    return owner


def _in_program_order(g, pieces, pos):
    """The kernels topologically sorted, ties broken by where their first node was traced."""
    group_of = {n: i for i, p in enumerate(pieces) for n in p}
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(pieces)))
    dag.add_edges_from((group_of[u], group_of[v]) for u, v in g.nx.edges() if u in group_of and group_of[u] != group_of[v])
    order = nx.lexicographical_topological_sort(dag, key=lambda i: pos[pieces[i][0]])
    return [tuple(pieces[i]) for i in order]


def _one_broadcast_per_kernel(g):
    """Give every elementwise user of a broadcast_to its own copy: re-reading the small operand
    in each kernel is free, while a shared broadcast would be stored at full size between
    kernels. Users that cannot fuse it share the original. Returns {user: [its copies]}, to
    keep each copy next to its user in program order."""
    copies = {}
    for n in [n for n in g.nx.nodes if g[n]["op"] == "broadcast_to"]:
        a, (x,) = g[n], g.operands(n)
        users = g.users(n)
        loop_users = [u for u in users if fusible(g, n, u)]
        for user in loop_users[1:] if len(loop_users) == len(users) else loop_users:
            c = g.add("broadcast_to", [x], a["shape"], a["dtype"], a["attrs"], a["src"])
            for _, _, key in [e for e in g.nx.out_edges(n, keys=True) if e[1] == user]:
                g.set_operand(user, key, c)
            copies.setdefault(user, []).append(c)
    return copies


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
