"""Memory plan: where each materialised value lives, written to graph.meta["memory"].

The lowering contract (read by codegen): graph.meta["memory"] is a MemoryPlan whose
`location[node]` is one of
    ("arena", offset)   bytes [offset, offset + nbytes) of the one workspace arena
    ("input", k)        the caller's k-th input buffer (input nodes; donated in-place updates)
    ("output", j)       the caller's j-th output buffer, written in place
    ("view", node, off) the bytes of `node` from byte `off` on: a reshape of a contiguous value
                        (off 0), or a slice that picks one contiguous block of it (x[i] of a
                        row-major array); `node` is never itself a view and has an arena,
                        input or output location. A reader through a view at off != 0 reads
                        element i of the view at element i + off / itemsize of `node`, so it
                        never counts as reading `node` at its own index (in-place updates, liveness)
Nodes without a location are never materialised: values inside a fused group, and sources
that codegen inlines (const, iota) or emits as globals (literal). After the last kernel,
codegen copies output j from location[graph.outputs[j]] (a source output: from its value)
into its destination (the donated input graph.aliases[j], else output buffer j) unless it
already lives there. Offsets are multiples of ALIGN bytes.

An in-place update: a node at ("input", k) is written into the donated input k while the
old value of input k may still be read by the writing kernel itself, elementwise at the same
index (loads before stores in one iteration, see fusion). Every other reader of the old value
runs earlier. So that a failing step (a gather index out of range) still leaves the caller's
buffers untouched, codegen checks what it can before the first kernel and restores the
donated buffers placed here when a later check fails.

`plan` reuses memory: liveness intervals over the schedule, then greedy-by-size placement
(largest first, each at the best-fitting gap among the buffers live at the same time, as in
TFLite's arena planner). `naive` gives every value its own slot: the switched-off version.
"""

import bisect
import heapq
from dataclasses import dataclass, field

import numpy as np

from burjit import primitives as P

from . import schedule as S

ALIGN = 64


@dataclass
class MemoryPlan:
    location: dict = field(default_factory=dict)
    arena_bytes: int = 0
    lower_bound: int = None  # most arena bytes (aligned) live at once in this schedule
    naive_bytes: int = 0   # every intermediate in its own buffer: an executor without fusion or reuse

    def report(self):
        return {"arena_bytes": self.arena_bytes, "lower_bound": self.lower_bound,
                "naive_bytes": self.naive_bytes}


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def materialised(graph):
    """Nodes whose value is stored: read by another group, a graph output, or a kernel's
    result that is not computed per index (a matmul, reduction, shape op...) even if unused."""
    group_of = {n: i for i, g in enumerate(graph.meta["schedule"]) for n in g}
    outs = set(graph.outputs)
    out = []
    for g in graph.meta["schedule"]:
        for n in g:
            inside = [group_of.get(u) == group_of[n] for u in graph.users(n)]
            if n in outs or not all(inside) or (not inside and P.PRIMITIVES[graph[n]["op"]].kind != "elementwise"):
                out.append(n)
    return out


def naive(graph):
    """Every materialised value in its own arena slot; outputs straight into caller buffers."""
    graph = _scheduled(graph)
    plan, outs = _start(graph), _undonated_outputs(graph)
    offset = 0
    for n in materialised(graph):
        if not _to_output(graph, plan, outs, n):
            plan.location[n] = ("arena", offset)
            offset += _align(graph.nbytes(n))
    graph.meta["memory"] = _finish(graph, plan, offset)
    return graph


def plan(graph):
    """Views for reshapes, in-place donated updates, outputs into caller buffers, and a reused arena."""
    graph = _scheduled(graph)
    graph.meta["memory"] = reuse(graph)
    return graph


def reuse(graph):
    """The reusing MemoryPlan for graph.meta["schedule"]; reads the graph, changes nothing."""
    plan, outs = _start(graph), _undonated_outputs(graph)
    values = materialised(graph)
    for n in values:
        root = _root(graph, plan, n)
        if root is not None:
            plan.location[n] = ("view",) + root
    _place_in_place(graph, plan)
    arena = [n for n in values if n not in plan.location and not _to_output(graph, plan, outs, n)]
    return _finish(graph, plan, _place(plan, _live(graph, plan, arena)))


# -- shared steps ------------------------------------------------------------------------------

def _scheduled(graph):
    graph = graph if "schedule" in graph.meta else S.topological(graph)
    return graph.annotated()


def _start(graph):
    plan = MemoryPlan()
    for k, n in enumerate(graph.inputs):
        plan.location[n] = ("input", k)
    return plan


def _undonated_outputs(graph):
    """node -> the first output position that returns it into a caller's output buffer."""
    first = {}
    for j, n in enumerate(graph.outputs):
        if j not in graph.aliases and graph[n]["op"] not in S.SOURCES:
            first.setdefault(n, j)
    return first


def _to_output(graph, plan, outs, n):
    """Put n into its output buffer, if it has one."""
    if n in outs:
        plan.location[n] = ("output", outs[n])
    return n in outs


def _finish(graph, plan, arena_bytes):
    plan.arena_bytes = arena_bytes
    plan.lower_bound = lower_bound(_live(graph, plan, [n for n, loc in plan.location.items() if loc[0] == "arena"]))
    plan.naive_bytes = _naive_bytes(graph)
    return plan


def _naive_bytes(graph):
    """Every intermediate in its own buffer, once (fusion's recomputing copies do not count)."""
    copies = graph.meta.get("copies", {})
    return sum(_align(graph.nbytes(n)) for n, a in graph.nx.nodes(data=True)
               if a["op"] not in S.SOURCES and n not in copies)


def _readers(graph, plan, n):
    """Nodes reading n's bytes, directly or through views of n."""
    return S.value_readers(graph, n, lambda u: plan.location.get(u, ("",))[0] == "view")


def _same_index_readers(graph, plan, n):
    """The readers of n's bytes that read n elementwise at the index they compute: elementwise
    nodes reading n itself or a view of it at offset 0."""
    return {u for u in _readers(graph, plan, n) if P.PRIMITIVES[graph[u]["op"]].kind == "elementwise"
            and not any(plan.location.get(o, ("",))[0] == "view" and plan.location[o][2]
                        for o in graph.operands(u) if o != n)}


# -- views and in-place updates ------------------------------------------------------------------

def _root(graph, plan, n):
    """(node, byte offset) whose bytes n can share (a reshape, or a slice of one contiguous
    block), or None."""
    a = graph[n]
    if a["op"] == "reshape":
        off = 0
    elif a["op"] == "slice":
        off = _block_offset(graph[graph.operands(n)[0]]["shape"], a["attrs"])
        if off is None:
            return None
        off *= np.dtype(a["dtype"]).itemsize
    else:
        return None
    o = graph.operands(n)[0]
    loc = plan.location.get(o)
    if loc is not None and loc[0] == "view":
        return loc[1], loc[2] + off
    return (o, off) if graph[o]["op"] not in S.SOURCES or graph[o]["op"] == "input" else None


def _block_offset(shape, attrs):
    """The element offset of a slice that picks one contiguous block of a row-major array of
    `shape` (axes of extent 1, then one axis cut to a range, then whole axes), else None."""
    out, starts, steps = attrs["shape"], attrs["starts"], attrs["steps"]
    cut = max((d for d in range(len(shape)) if out[d] != shape[d]), default=0)  # the last axis cut
    if any(out[d] != 1 for d in range(cut)) or any(o > 1 and sp != 1 for o, sp in zip(out, steps)):
        return None
    strides = np.cumprod((1,) + tuple(shape[:0:-1]))[::-1]
    return int(sum(st * sd for st, sd in zip(starts, strides)))


def _place_in_place(graph, plan):
    """Write donated outputs straight into their input's buffer where no later kernel needs the old value."""
    time = {n: t for t, g in enumerate(graph.meta["schedule"]) for n in g}
    outs = set(graph.outputs)
    returned = outs | {loc[1] for v, loc in plan.location.items() if loc[0] == "view" and v in outs}
    for j, k in sorted(graph.aliases.items()):
        n, old = graph.outputs[j], graph.inputs[k]
        if n not in time or n in plan.location or old in returned:
            continue  # a source, a view, placed already, or the old value is itself returned
        w, same = time[n], _same_index_readers(graph, plan, old)
        if all(time[u] < w or (time[u] == w and u in same) for u in _readers(graph, plan, old)):
            plan.location[n] = ("input", k)


# -- liveness and placement ----------------------------------------------------------------------

def _live(graph, plan, values):
    """(first, last, bytes, node) per value, inclusive, in thirds of a schedule step: a kernel at
    step t reads same-index (elementwise) operands until 3t+1 and writes elementwise results from
    3t+1; any other read lasts to 3t+2 and any other write starts at 3t (a broadcast, reduction or
    matmul reading a value its own kernel overwrites would read clobbered bytes). Spans that touch
    conflict, so no value shares bytes with another value its kernel reads or writes."""
    time = {n: t for t, g in enumerate(graph.meta["schedule"]) for n in g}
    end = 3 * len(graph.meta["schedule"])  # outputs are copied out after the last kernel
    outs = set(graph.outputs)
    returned = outs | {loc[1] for v, loc in plan.location.items() if loc[0] == "view" and v in outs}

    def same_index(u):
        return P.PRIMITIVES[graph[u]["op"]].kind == "elementwise"

    spans = []
    for n in values:
        first = 3 * time[n] + same_index(n)
        same = _same_index_readers(graph, plan, n)
        reads = [3 * time[u] + 2 - (u in same) for u in _readers(graph, plan, n)]
        # Written throughout its kernel's loop (to 3t+1) even if nothing reads it later.
        last = end if n in returned else max(reads + [3 * time[n] + 1])
        spans.append((first, last, _align(graph.nbytes(n)), n))
    return spans


def lower_bound(spans):
    """Most bytes live at one schedule step: no arena for this schedule can be smaller."""
    if not spans:
        return 0
    delta = np.zeros(max(e for _, e, _, _ in spans) + 2, dtype=np.int64)
    for s, e, b, _ in spans:
        delta[s] += b
        delta[e + 1] -= b
    return int(np.cumsum(delta).max())


def _place(plan, spans):
    """Greedy by size: largest first, into the tightest gap among time-overlapping buffers
    (the first such gap from the bottom on a tie, else on top of them all). It scans every
    buffer placed so far, as arrays: past GREEDY_LIMIT values (unfused scalar programs) the
    allocation is replayed in time order instead."""
    if len(spans) > GREEDY_LIMIT:
        return _replay(plan, spans)
    lo, hi, first, last = (np.empty(len(spans), dtype=np.int64) for _ in range(4))  # the placed buffers
    top = 0
    for k, (s, e, b, n) in enumerate(sorted(spans, key=lambda x: (-x[2], x[0], x[3]))):
        busy = (first[:k] <= e) & (s <= last[:k])
        blo, bhi = lo[:k][busy], hi[:k][busy]
        offset = 0
        if blo.size:
            order = np.lexsort((bhi, blo))
            blo, bhi = blo[order], bhi[order]
            cursor = np.maximum.accumulate(np.concatenate(([0], bhi)))  # the top of the buffers below each
            gaps = blo - cursor[:-1]
            fits = np.flatnonzero(gaps >= b)
            offset = int(cursor[fits[np.argmin(gaps[fits])]]) if fits.size else int(cursor[-1])
        lo[k], hi[k], first[k], last[k] = offset, offset + b, s, e
        plan.location[n] = ("arena", offset)
        top = max(top, offset + b)
    return top


GREEDY_LIMIT = 4000


def _replay(plan, spans):
    """A heap simulation: values in order of first use take the first free gap that fits, and
    give their bytes back after their last use (O(n log n) plus the free-list scans)."""
    free, ending, top = [], [], 0  # free: sorted [offset, size] gaps below top
    for s, e, b, n in sorted(spans, key=lambda x: (x[0], x[3])):
        while ending and ending[0][0] < s:
            _, off, size = heapq.heappop(ending)
            _release(free, off, size)
        i = next((i for i, (_, size) in enumerate(free) if size >= b), None)
        if i is None and free and sum(free[-1]) == top:  # grow the arena from the last gap
            i, top = len(free) - 1, free[-1][0] + b
            free[-1][1] = b
        if i is None:
            offset, top = top, top + b
        else:
            offset = free[i][0]
            free[i] = [offset + b, free[i][1] - b]
            if not free[i][1]:
                del free[i]
        heapq.heappush(ending, (e, offset, b))
        plan.location[n] = ("arena", offset)
    return top


def _release(free, off, size):
    """Return [off, off + size) to the sorted free list, merging with the gaps it touches."""
    i = bisect.bisect(free, [off, size])
    if i < len(free) and off + size == free[i][0]:
        size += free.pop(i)[1]
    if i and sum(free[i - 1]) == off:
        free[i - 1][1] += size
    else:
        free.insert(i, [off, size])
