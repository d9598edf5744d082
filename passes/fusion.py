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
in-place update may write the buffer it reads, see memplan). meta["copies"] maps each node
fusion added to the node whose value it recomputes (cheap producers are recomputed in the
kernels that read them rather than stored between kernels).

How: every compute node gets a level such that along each edge u -> v the level grows by 0
when u may stay inside v's kernel ("fusible") and by at least 1 otherwise; nodes are raised
as late as their users allow, so producers join their consumers. All fusible nodes of one
(level, shape) become one kernel. Edges between kernels then strictly raise the level, so
the kernel graph is acyclic by construction, and the pass is linear in the graph's size.
A 0-d (scalar) program without barriers is a single kernel (straight-line code or a tape, codegen).
"""

import networkx as nx

from burjit import primitives as P

from .schedule import SOURCES

REDUCTIONS = ("reduce_sum", "reduce_max")


def fuse(graph):
    graph = graph.copy()
    for key in ("schedule", "memory"):
        graph.meta.pop(key, None)
    order = [n for n in graph.topo() if graph[n]["op"] not in SOURCES]
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
    graph.meta["groups"] = _recompute_cheap_producers(graph, _in_program_order(graph, pieces, pos))
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
    dag.add_edges_from((group_of[u], group_of[v]) for u, vs in g.nx._succ.items() for v in vs if u in group_of and group_of[u] != group_of[v])
    order = nx.lexicographical_topological_sort(dag, key=lambda i: pos[pieces[i][0]])
    return [tuple(pieces[i]) for i in order]


def _recompute_cheap_producers(g, pieces):
    """Recompute, inside each later kernel of the same loop shape that reads it, a value whose
    computation in its own kernel takes at most CONE nodes: re-reading its (few) operands
    there costs less than storing it between the kernels, which for training is mostly from
    the forward pass to the backward pass (GELU and layer-norm intermediates, broadcasts).
    The copies are recorded in meta["copies"] (copy -> original). Kernel order stays valid:
    the copies read only values the original's kernel read, all computed earlier."""
    group_of = {n: i for i, p in enumerate(pieces) for n in p}
    shape = [_loop_shape(g, p) for p in pieces]
    copies = g.meta["copies"] = dict(g.meta.get("copies", {}))  # not the input graph's dict
    outs, replaced = set(g.outputs), []
    for i in range(len(pieces)):
        for n in [n for n in pieces[i] if _loop_node(g, n) and n not in outs]:
            far = {}
            for u in g.users(n):
                if group_of[u] != i and shape[group_of[u]] == g[n]["shape"]:
                    far.setdefault(group_of[u], []).append(u)
            cone = _cone(g, n, group_of) if far else None
            if cone is None:
                continue
            for h, users in far.items():
                copy = {}
                for m in cone:
                    a = g[m]
                    copy[m] = g.add(a["op"], [copy.get(o, o) for o in g.operands(m)], a["shape"], a["dtype"],
                                    a["attrs"], a["src"])
                    copies[copy[m]] = copies.get(m, m)
                    group_of[copy[m]] = h
                pieces[h] = tuple(copy[m] for m in cone) + pieces[h]  # read only outside values: go first
                for u in users:
                    for key in list(g.nx._succ[n][u]):
                        g.set_operand(u, key, copy[n])
            replaced.append(n)
    dead = set()
    for n in reversed(replaced):  # originals nobody reads any more, and what only they read
        stack = [n]
        while stack:
            m = stack.pop()
            if m not in dead and m not in outs and m in group_of and not g.nx._succ[m] and _loop_node(g, m):
                dead.add(m)
                stack.extend(g.operands(m))
                g.nx.remove_node(m)
    return [tuple(n for n in p if n not in dead) for p in pieces]


# Nodes a value may take to be recomputed. On the benchmark GPT, 4 gave the fastest step
# (arena 1.11 MB, 0.48 ms; no recomputing: 1.82 MB, 0.65 ms); 16 a 25% smaller arena, 10% slower.
CONE = 4


def _cone(g, n, group_of):
    """n and the nodes of its kernel it depends on, operands first (ids are no order once
    earlier copies take part); None when there are more than CONE."""
    inside = [n]
    for m in inside:  # breadth-first, stopping as soon as the cone is too big
        inside.extend(o for o in g.operands(m) if group_of.get(o) == group_of[n] and o not in inside)
        if len(inside) > CONE:
            return None
    order = []
    while len(order) < len(inside):
        for m in inside:
            if m not in order and all(o in order or o not in inside for o in g.operands(m)):
                order.append(m)
    return order


def _loop_shape(g, piece):
    """The shape a kernel loops over, or None for a single non-loop node."""
    for n in piece:
        if g[n]["op"] in REDUCTIONS:
            return g[g.operands(n)[0]]["shape"]
    return g[piece[0]]["shape"] if _loop_node(g, piece[0]) else None


def _loop_node(g, n):
    """Nodes that form (a): computed per index of their own shape."""
    return P.PRIMITIVES[g[n]["op"]].kind == "elementwise" or g[n]["op"] == "broadcast_to"


def _fusible(g, nodes):
    """fusible(u, v): may operand u stay inside v's kernel? What it reads of each node is read
    once here: the levels ask it ~4 times per node (0.78 s of fuse's 2.5 s at 81k nodes)."""
    loop = {n: _loop_node(g, n) for n in nodes}
    op = {n: g[n]["op"] for n in nodes}
    shape = {n: g[n]["shape"] for n in nodes}

    def fusible(u, v):
        if not loop[u] or op[v] == "broadcast_to":
            return False
        return op[v] in REDUCTIONS or (loop[v] and shape[u] == shape[v])
    return fusible


def _levels(g, order):
    level, fusible = {}, _fusible(g, order)
    for n in order:
        level[n] = max((level[o] + (not fusible(o, n)) for o in g.operands(n) if o in level), default=0)
    for n in reversed(order):  # as late as every user allows, when that brings n into a user's kernel
        users = g.users(n)
        if any(fusible(n, v) for v in users):
            level[n] = max(level[n], min(level[v] - (not fusible(n, v)) for v in users))
    return level
