"""The IR: one traced step as a networkx.MultiDiGraph.

Nodes are ints. Each node has the attributes
    op     primitive name (see primitives.py)
    shape  tuple of ints
    dtype  numpy dtype name: 'float32', 'float64', 'int32', 'int64' or 'bool'
    attrs  dict of the primitive's static parameters (hashable values)
    src    'file:line' of the user code that created it, for error messages
An edge u -> v with key i says "u is operand i of v", so `x * x` has two parallel edges.

`Graph.inputs` lists the 'input' nodes in flattened-argument order and `Graph.outputs` the
output nodes in flattened-result order; an output may repeat or be an input. `Graph.aliases`
maps an output position to the input position whose (donated) buffer receives it in place.
Passes may add annotations in `Graph.meta` (fusion groups, schedule, memory plan); those are
plain data, documented by the pass that writes them. The front door may set meta["tier"], one
of TIERS: how a backend should run scalar programs (`compile(tier=...)`; codegen/tape.py).
"""

import contextlib
import gc
import hashlib
import heapq
import math
import os

import networkx as nx
import numpy as np

from .primitives import ITEMSIZE

TIERS = ("auto", "straight", "tape")


def tier(requested=None):
    """The tier a step asked for (compile(tier=...)), else $BURJIT_TIER, else 'auto'."""
    t = requested or os.environ.get("BURJIT_TIER", "auto") or "auto"
    if t not in TIERS:
        raise ValueError(f"BURJIT_TIER={t!r}; known: {', '.join(TIERS)}")
    return t


_SHORT = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64", "bool": "b1"}


class Graph:
    def __init__(self):
        self.nx = nx.MultiDiGraph()
        self.inputs = []
        self.outputs = []
        self.aliases = {}
        self.meta = {}
        self._next = 0

    # -- building -----------------------------------------------------------------------------
    def add(self, op, operands, shape, dtype, attrs=None, src=None):
        n = self._next
        self._next += 1
        self.nx.add_node(n, op=op, shape=tuple(shape), dtype=str(dtype), attrs=dict(attrs or {}), src=src)
        succ, pred = self.nx._succ, self.nx._pred
        for i, o in enumerate(operands):
            _link(succ, pred, o, n, i)
        if op == "loop":  # passes and codegen visit loop bodies only in graphs that have one
            self.meta["loops"] = True
        return n

    def set_operand(self, n, i, new):
        """Make `new` operand i of node n."""
        old = self.operands(n)[i]
        self.nx.remove_edge(old, n, key=i)
        _link(self.nx._succ, self.nx._pred, new, n, i)

    def replace_all_uses(self, old, new):
        """Point every use of `old` (operands and outputs) at `new`."""
        for user, key in self.uses(old):
            self.nx.remove_edge(old, user, key=key)
            _link(self.nx._succ, self.nx._pred, new, user, key)
        self.outputs = [new if o == old else o for o in self.outputs]

    def copy(self):
        """An independent graph (attrs dicts too), built straight into networkx's adjacency
        dicts: `MultiDiGraph.copy` re-adds edge by edge (0.43 s against 0.06 s for 23k nodes, one run)."""
        g = Graph()
        g.nx.graph.update(self.nx.graph)
        g.nx._node.update((n, {**a, "attrs": dict(a["attrs"])}) for n, a in self.nx._node.items())
        succ, pred = g.nx._succ, g.nx._pred
        pred.update((n, {}) for n in self.nx._node)
        for u, users in self.nx._succ.items():
            succ[u] = out = {v: dict(keys) for v, keys in users.items()}
            for v, keys in out.items():
                pred[v][u] = keys  # one edge-data dict seen from both ends, as networkx keeps it
        g.inputs, g.outputs, g.aliases = list(self.inputs), list(self.outputs), dict(self.aliases)
        g.meta = dict(self.meta)
        g._next = self._next
        return g

    def annotated(self):
        """A graph sharing this one's nodes and edges, with its own inputs, outputs, aliases and
        meta: for passes that only annotate (schedule, memplan). A copy of a 10^5-node graph
        costs ~0.1 s and its memory; these passes change no node, and nothing mutates a graph a
        pass returned (a pass that rewrites takes copy() first)."""
        g = Graph()
        g.nx, g._next = self.nx, self._next
        g.inputs, g.outputs, g.aliases, g.meta = list(self.inputs), list(self.outputs), dict(self.aliases), dict(self.meta)
        return g

    # -- reading ------------------------------------------------------------------------------
    # The readers below go to networkx's adjacency dicts (_node, _pred, _succ) directly: every
    # pass and codegen call them per node, and the public views cost several times more.
    def __getitem__(self, n):
        return self.nx._node[n]

    def __len__(self):
        return self.nx.number_of_nodes()

    def operands(self, n):
        # edge keys are exactly the operand positions 0..k-1 (add and set_operand keep them so)
        pred = self.nx._pred[n]
        if len(pred) == 1:
            for u, keys in pred.items():
                return [u] * len(keys)
        out = [None] * sum(map(len, pred.values()))
        for u, keys in pred.items():
            for k in keys:
                out[k] = u
        return out

    def uses(self, n):
        """(user, operand position) of each use of n, as a list (safe to rewire while walking it).
        Passes read these, not networkx's edge views: a view caches itself on the graph and
        points back at it, a cycle that kept every pass's discarded graph alive until the
        cyclic collector ran (jit.py pauses it while tracing and passes run)."""
        return [(v, k) for v, keys in self.nx._succ[n].items() for k in keys]

    def users(self, n):
        return sorted(self.nx._succ[n])

    def topo(self):
        """Deterministic topological order (ties broken by node id), as networkx's
        lexicographical_topological_sort gives it, at a fifth of its cost."""
        pred, succ = self.nx._pred, self.nx._succ
        waiting = {n: sum(map(len, ps.values())) for n, ps in pred.items()}
        ready = [n for n, k in waiting.items() if not k]
        heapq.heapify(ready)
        order = []
        while ready:
            n = heapq.heappop(ready)
            order.append(n)
            for v, keys in succ[n].items():
                waiting[v] -= len(keys)
                if not waiting[v]:
                    heapq.heappush(ready, v)
        if len(order) != len(waiting):
            raise nx.NetworkXUnfeasible("graph contains a cycle")
        return order

    def nbytes(self, n):
        a = self.nx._node[n]
        return math.prod(a["shape"]) * ITEMSIZE[a["dtype"]]

    def type_str(self, n):
        a = self.nx.nodes[n]
        return f"{_SHORT[a['dtype']]}[{','.join(map(str, a['shape']))}]"

    def __str__(self):
        lines = ["{ lambda " + ", ".join(f"%{n}:{self.type_str(n)}" for n in self.inputs) + " ."]
        group = {n: i for i, g in enumerate(self.meta.get("schedule") or self.meta.get("groups") or ())
                 for n in g if len(g) > 1}
        for n in self.topo():
            a = self.nx.nodes[n]
            if a["op"] == "input":
                continue
            attrs = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(a["attrs"].items()))
            ops = " ".join(f"%{o}" for o in self.operands(n))
            head = f"  %{n}:{self.type_str(n)} = {a['op']}" + (f"[{attrs}]" if attrs else "")
            tail = f"  # group {group[n]}" if n in group else ""
            lines.append(f"{head} {ops}".rstrip() + tail)
            for v in a["attrs"].values():  # a loop's body (burjit/control.py), indented below it
                if isinstance(getattr(v, "graph", None), Graph):
                    lines += ["      " + line for line in str(v.graph).splitlines()]
        lines.append("  in (" + ", ".join(f"%{o}" for o in self.outputs) + ") }")
        return "\n".join(lines)

    def fingerprint(self):
        """A hash of everything that determines the compiled code (not of source locations)."""
        h = hashlib.sha256()
        preds = self.nx.pred
        for n, a in sorted(self.nx.nodes(data=True)):  # id order: deterministic, no topological sort needed
            operands = sorted((k, u) for u, keys in preds[n].items() for k in keys)
            h.update(repr((n, a["op"], a["shape"], a["dtype"], sorted(a["attrs"].items(), key=str),
                           operands)).encode())
        h.update(repr((self.inputs, self.outputs, sorted(self.aliases.items()))).encode())
        return h.hexdigest()


@contextlib.contextmanager
def collector_paused():
    """Tracing, passes and the planning before codegen build and read graphs of plain dicts,
    without reference cycles, at a few hundred thousand objects a second: Python's cyclic
    collector kept re-scanning the growing graph and took half the front end's time
    (fastest_autograd n = 4,000: passes 4.95 s -> 2.62 s without it). IR emission runs with it
    on: llvmlite's IR objects are cycles."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


_NO_DATA = {}  # every edge's data dict: edges carry none (the key is the operand position)


def _link(succ, pred, u, v, key):
    """Edge u -> v with `key`, one dict seen from both ends as networkx keeps it; the data dict
    is shared, not one per edge (a 10^5-node scalar graph has 2 x 10^5 edges)."""
    keys = succ[u].get(v)
    if keys is None:
        keys = succ[u][v] = pred[v][u] = {}
    keys[key] = _NO_DATA


def _fmt(v):
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)}"
    if isinstance(v, Literal):
        return f"array{list(v.array.shape)}"
    if isinstance(getattr(v, "graph", None), Graph):
        return str(v)
    return repr(v)


def value_key(v):
    """The identity of a static value (an attr, a static argument), by type and bit pattern: 1, 1.0
    and True differ, 0.0 and -0.0 differ, and NaN equals itself, where == and hash would merge or
    split them. Raises TypeError for unhashable values."""
    t = type(v)
    if isinstance(v, (float, np.floating)):
        return (t, float(v).hex())
    if t is tuple or t is list:
        return (t, tuple(value_key(x) for x in v))
    hash(v)
    return (t, v)


class Literal:
    """A captured numpy array as a hashable node attribute (hashed and compared by content)."""

    def __init__(self, array):
        self.array = np.array(array, copy=True)
        self.array.setflags(write=False)
        self._key = (self.array.dtype.str, self.array.shape, self.array.tobytes())

    def __eq__(self, other):
        return isinstance(other, Literal) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return f"Literal(sha={hashlib.sha256(self._key[2]).hexdigest()[:12]}, shape={self.array.shape})"
