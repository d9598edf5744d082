"""Memory plan: where each materialised value lives, written to graph.meta["memory"].

The lowering contract (read by codegen): graph.meta["memory"] is a MemoryPlan whose
`location[node]` is one of
    ("arena", offset)   bytes [offset, offset + nbytes) of the one workspace arena
    ("input", k)        the caller's k-th input buffer (input nodes; donated in-place updates)
    ("output", j)       the caller's j-th output buffer, written in place
    ("view", node)      the same bytes as another node (a reshape of a contiguous value)
Nodes without a location are never materialised: values inside a fused group, and sources
that codegen inlines (const, iota) or emits as globals (literal). After the last kernel,
codegen copies output j from location[graph.outputs[j]] into its destination (the donated
input graph.aliases[j], else output buffer j) unless it already lives there.
Offsets are multiples of ALIGN bytes.
"""

from dataclasses import dataclass, field

from .schedule import SOURCES

ALIGN = 64


@dataclass
class MemoryPlan:
    location: dict = field(default_factory=dict)
    arena_bytes: int = 0
    lower_bound: int = None  # most arena bytes live at once in this schedule (None: not computed)
    naive_bytes: int = 0   # the sum of all arena values, as if none were reused

    def report(self):
        return {"arena_bytes": self.arena_bytes, "lower_bound": self.lower_bound,
                "naive_bytes": self.naive_bytes}


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def materialised(graph):
    """Nodes whose value leaves its group: used by another group, or a graph output."""
    group_of = {n: i for i, g in enumerate(graph.meta["schedule"]) for n in g}
    outs = set(graph.outputs)
    return [n for g in graph.meta["schedule"] for n in g
            if n in outs or any(group_of.get(u) != group_of[n] for u in graph.users(n))]


def naive(graph):
    """Every materialised value in its own arena slot; outputs straight into caller buffers."""
    graph = graph.copy()
    plan = MemoryPlan()
    for k, n in enumerate(graph.inputs):
        plan.location[n] = ("input", k)
    first_output = {}
    for j, n in enumerate(graph.outputs):
        first_output.setdefault(n, j)
    offset = 0
    for n in materialised(graph):
        if n in first_output and graph[n]["op"] not in SOURCES and first_output[n] not in graph.aliases:
            plan.location[n] = ("output", first_output[n])
        else:
            plan.location[n] = ("arena", offset)
            offset += _align(graph.nbytes(n))
    plan.arena_bytes = plan.naive_bytes = offset
    graph.meta["memory"] = plan
    return graph
