"""Schedule: the execution order of kernels, written to graph.meta["schedule"].

The lowering contract (read by memplan and codegen):
    graph.meta["schedule"] = [group, ...]   in execution order
    group = tuple of node ids in topological order; one group = one kernel (loop nest).
Every node except 'input', 'const', 'iota' and 'literal' sits in exactly one group; those
source nodes are never scheduled: codegen inlines const/iota at each use and emits literals
as global constants. Groups come from the fusion pass (graph.meta["groups"]) or, without
it, are one node each.
"""

SOURCES = ("input", "const", "iota", "literal")


def unfused_groups(graph):
    """One group per compute node, in plain topological order."""
    return [(n,) for n in graph.topo() if graph[n]["op"] not in SOURCES]


def schedule(graph):
    graph = graph.copy()
    groups = graph.meta.get("groups") or unfused_groups(graph)
    graph.meta["schedule"] = [tuple(g) for g in groups]
    return graph
