"""Schedule: the execution order of kernels, written to graph.meta["schedule"].

The lowering contract (read by memplan and codegen):
    graph.meta["schedule"] = [group, ...]   in execution order
    group = tuple of node ids in topological order; one group = one kernel (loop nest).
Every node except 'input', 'const', 'iota' and 'literal' sits in exactly one group; those
source nodes are never scheduled: codegen inlines const/iota at each use and emits literals
as global constants. Groups come from the fusion pass (graph.meta["groups"]) or, without
it, are one node each.

`schedule` orders the groups greedily by memory: among the kernels whose operands are
ready it runs the one that frees the most bytes net of what it allocates, and when none
frees anything, the first in program order (so work that only allocates, like a weight
transpose for the backward pass, waits until it is needed). An in-place parameter update
(see memplan) needs every other reader of the old value to run first; those orders are added
as extra dependencies when they do not contradict the data flow. The result is kept only if
its memory plan beats plain program order's: the greedy rule is a heuristic, the arena
size is the objective. `topological` is the plain order, used when this pass is off.
"""

import heapq

import networkx as nx

SOURCES = ("input", "const", "iota", "literal")


def unfused_groups(graph):
    """One group per compute node, in plain topological order."""
    return [(n,) for n in graph.topo() if graph[n]["op"] not in SOURCES]


def value_readers(graph, n, is_view):
    """Nodes that read n's bytes: its users, where a view of n stands for the view's own readers."""
    out = []
    for u in graph.users(n):
        out.extend(value_readers(graph, u, is_view) if is_view(u) else [u])
    return out


def topological(graph):
    graph = graph.annotated()
    groups = graph.meta.get("groups") or unfused_groups(graph)
    graph.meta["schedule"] = [tuple(g) for g in groups]
    graph.meta.pop("memory", None)
    return graph


def schedule(graph):
    from .memplan import reuse  # the planner judges the orders; it only reads the schedule
    graph = topological(graph)
    plain = graph.meta["schedule"]
    group_of = {n: i for i, grp in enumerate(plain) for n in grp}
    greedy = [plain[i] for i in _greedy(graph, plain, group_of, _dependencies(graph, plain, group_of))]
    cost = []
    for order in (greedy, plain) if greedy != plain else (greedy,):
        graph.meta["schedule"] = order
        cost.append((reuse(graph).arena_bytes, len(cost), order))
    graph.meta["schedule"] = min(cost)[2]
    return graph


def _dependencies(graph, groups, group_of):
    """Group DAG: data edges, plus 'old value read before in-place write' edges where acyclic."""
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(groups)))
    for i, grp in enumerate(groups):
        for n in grp:
            dag.add_edges_from((group_of[o], i) for o in graph.operands(n) if o in group_of and group_of[o] != i)
    extra = []
    for j, k in sorted(graph.aliases.items()):
        writer = group_of.get(graph.outputs[j])
        if writer is not None:
            extra.append([(group_of[u], writer) for u in value_readers(graph, graph.inputs[k], _is_reshape(graph))
                          if group_of[u] != writer])
    trial = dag.copy()
    trial.add_edges_from(e for edges in extra for e in edges)
    if nx.is_directed_acyclic_graph(trial):
        return trial
    for edges in extra:  # some update feeds a reader of its own old value: add what fits, one update at a time
        if not any(nx.has_path(dag, w, u) for u, w in edges):
            dag.add_edges_from(edges)
    return dag


def _is_reshape(graph):
    return lambda u: graph[u]["op"] == "reshape"


def _greedy(graph, groups, group_of, dag):
    outputs = set(graph.outputs)
    # Arena bytes a group allocates (values read by other groups; outputs go to the caller's
    # buffers and reshapes are views), and per such value the groups reading it.
    readers = {}
    alloc = [0] * len(groups)
    for i, grp in enumerate(groups):
        for n in grp:
            rs = {group_of[u] for u in graph.users(n)} - {i}
            if rs and n not in outputs:
                readers[n] = rs
                alloc[i] += 0 if graph[n]["op"] == "reshape" else graph.nbytes(n)
    reads = [set() for _ in groups]
    for n, rs in readers.items():
        for r in rs:
            reads[r].add(n)
    left = {n: len(rs) for n, rs in readers.items()}

    def gain(i):  # only net freeing counts; the rest goes in program order
        return max(0, sum(graph.nbytes(n) for n in reads[i] if left[n] == 1) - alloc[i])

    waiting = {i: dag.in_degree(i) for i in dag}
    heap = [(-gain(i), i) for i, d in waiting.items() if d == 0]
    heapq.heapify(heap)
    ready, done, order = {i for _, i in heap}, set(), []
    while heap:
        score, i = heapq.heappop(heap)
        if i in done or -score != gain(i):
            continue  # stale entry; a fresh one was pushed when its gain changed
        done.add(i)
        order.append(i)
        for n in reads[i]:
            left[n] -= 1
            if left[n] == 1:
                last = next(r for r in readers[n] if r not in done)
                if last in ready:
                    heapq.heappush(heap, (-gain(last), last))
        for s in dag.successors(i):
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.add(s)
                heapq.heappush(heap, (-gain(s), s))
    assert len(order) == len(groups), "group graph has a cycle"
    return order
