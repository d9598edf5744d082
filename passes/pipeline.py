"""The ordered list of passes, and the switch to turn any of them off.

    simplify  identities, constant folding, CSE, DCE          (graph only)
    fuse      kernels                                          meta["groups"], meta["copies"]
    schedule  kernel order that lowers the planned arena       meta["schedule"]
    memplan   arena offsets, views, in-place updates           meta["memory"]
Each is Graph -> Graph, pure, and correct without the others. `run(graph, names)` applies
the named passes in pipeline order; BURJIT_DISABLE_PASSES (comma-separated names) turns
passes off for debugging without touching code; `prepare` fills in the plain schedule and
the naive plan that codegen needs when those passes were off. Loop bodies go through the same
passes as the graph their loop is in.
"""

import os

from . import fusion, memplan, schedule, simplify

# name -> Graph -> Graph, in pipeline order
PASSES = {"simplify": simplify.simplify, "fuse": fusion.fuse, "schedule": schedule.schedule,
          "memplan": memplan.plan}
DEFAULT = tuple(PASSES)


def prepare(graph):
    """Fill in what codegen needs when the passes that make it were switched off."""
    if "schedule" not in graph.meta:
        graph = schedule.topological(graph)
    if "memory" not in graph.meta:
        graph = memplan.naive(graph)
    return graph


def run(graph, names=None):
    names = DEFAULT if names is None else tuple(names)
    off = {p.strip() for p in os.environ.get("BURJIT_DISABLE_PASSES", "").split(",") if p.strip()}
    for what, given in (("passes", names), ("$BURJIT_DISABLE_PASSES names passes", off)):
        unknown = set(given) - set(PASSES)
        if unknown:
            raise ValueError(f"unknown {what} {sorted(unknown)}; known: {list(PASSES)}")
    for name, fn in PASSES.items():
        if name in names and name not in off:
            graph = fn(graph)
    if graph.meta.get("loops"):  # a loop body (burjit/control.py) is a graph: the same passes run on it
        for a in graph.nx._node.values():
            if a["op"] == "loop":
                a["attrs"] = {**a["attrs"], "body": a["attrs"]["body"].with_graph(run(a["attrs"]["body"].graph, names))}
    return graph
