"""Scalar regions: a run of 0-d ops recorded as rows of int columns, held by the graph as one node.

Why: a networkx node costs ~1.3 kB and tens of microseconds through tracing and the passes,
and a scalar (micrograd-style) program is nothing but such nodes (fastest_autograd, n = 10,000:
227k nodes, 12 s and 750 MB before this). So `bind` records a 0-d op on floats, and the bools
their comparisons make, into the trace's open Region of that float dtype: a few array appends.
Their format (records.py) is all a backend reads. The values of a region are RegionTracers. Asking one for its graph `node` (an ordinary op
reading it, a step output, grad's bookkeeping) closes the region:
  * small (fewer than REGION_OPS ops) or tier 'straight': its records become ordinary graph
    nodes, the graph tracing built before regions;
  * otherwise it stays compact: one `region` node whose operands are the graph values it
    imports and whose value is the vector of the values read outside it; value v of the region
    is `region[slot]` (slice + reshape), a bool one converted there and back.
grad takes a region's records backwards with each op's VJP rule (`reverse`: by templates,
region_reverse.py, or record by record, `walk`): into the open region itself when the loss is
one of its values, else (the `region` primitive's VJP) into a copy of its records. When the
trace ends, regions are sealed (recording state dropped). The tape tier runs a region node
(codegen/tape.py); the reference backend interprets its records with each primitive's numpy
reference.
"""

from array import array

from . import primitives as P
from .graph import value_key
from .records import CONST, IMPORT, KINDS, Records, evaluate, kind
from .tracer import Tracer

REGION_OPS = 4096     # a region of this many ops or more stays one node (README "How it works")
WALK_BELOW = 256      # grad walks smaller regions record by record (`reverse`)
OPS = frozenset(n for n, p in P.PRIMITIVES.items() if p.kind == "elementwise" and p.scalar and n != "id") | {"const"}


class RegionTracer(Tracer):
    """Value `index` of `region`; its graph `node` exists only once asked for."""

    __slots__ = ("region", "index")

    def __init__(self, trace, region, index, dtype):
        self.trace, self.region, self.index, self.shape, self.dtype = trace, region, index, (), dtype

    @property
    def node(self):
        return self.region.node_of(self.index)

    def __repr__(self):
        return f"Tracer(region value {self.index}, shape=(), dtype={self.dtype})"


class Region(Records):
    """A scalar region while traced: Records, plus `srcs` (each record's user line), the graph
    values it imports, and how its values leave it (expanded nodes, or the region node's slots)."""

    def __init__(self, trace, dtype):
        super().__init__(dtype)
        self.trace, self.srcs = trace, []
        self.imports, self._imported, self._consts = [], {}, {}
        self.is_open, self.nodes = True, None   # nodes: value -> graph node once expanded
        self.node, self.outputs, self.slots, self._read = None, [], {}, {}
        trace.regions[dtype] = self  # an open region it replaces closes when one of its values is read

    # -- recording ------------------------------------------------------------------------------
    def append(self, k, args, src):
        v = len(self.kinds)
        self.kinds.append(k)
        n = len(args)
        self.a.append(args[0] if n else -1)
        self.b.append(args[1] if n > 1 else -1)
        self.c.append(args[2] if n > 2 else -1)
        self.srcs.append(src)
        return v

    def const(self, value, dtype, src):
        """The value of constant `value` (one per constant: x * 2.0 everywhere, the adjoints' ones)."""
        key = (dtype, value_key(value))
        v = self._consts.get(key)
        if v is None:
            v = self._consts[key] = self.append(kind(CONST, None, dtype, ()), (), src)
            self.values[v] = value
        return v

    def operand(self, t):
        """The value standing for Tracer t here: its own, or t's graph node imported."""
        if type(t) is RegionTracer and t.region is self:
            return t.index
        node = t.node
        v = self._imported.get(node)
        if v is None:
            v = self._imported[node] = self.append(kind(IMPORT, None, t.dtype, ()), (len(self.imports),), None)
            self.imports.append(node)
        return v

    def value(self, v):
        return RegionTracer(self.trace, self, v, KINDS[self.kinds[v]][2])

    # -- leaving the region ---------------------------------------------------------------------
    def node_of(self, v):
        if self.srcs is None:
            from .errors import TracingError
            raise TracingError("a traced value from a finished trace was used; do not keep traced values "
                               "in globals between steps")
        if self.is_open:
            self.close()
        if self.nodes is not None:
            return self.nodes[v]
        node = self._read.get(v)
        if node is None:
            node = self._read[v] = self._export(v)
        return node

    def close(self):
        self.is_open = False
        if self.trace.regions.get(self.dtype) is self:
            del self.trace.regions[self.dtype]
        ops = len(self) - len(self.imports) - len(self.values)
        tier = self.trace.tier
        if tier == "straight" or not ops or (tier != "tape" and ops < REGION_OPS):
            self._expand()

    def _expand(self):
        g, nodes = self.trace.graph, []
        for v in range(len(self)):
            op, attrs, dtype, _ = KINDS[self.kinds[v]]
            args = self.args(v)
            nodes.append(self.imports[args[0]] if op == IMPORT else
                         g.add(op, [], (), dtype, {"value": self.values[v], "shape": (), "dtype": dtype}, None)
                         if op == CONST else g.add(op, [nodes[a] for a in args], (), dtype, attrs, self.srcs[v]))
        self.nodes = nodes

    def _export(self, v):
        """Graph node of value v of a compact region: an element of the region node's value."""
        from . import ops as F
        dtype = self.dtype_of(v)
        w = v if dtype == self.dtype else self.append(kind("convert", {"dtype": self.dtype}, self.dtype, (dtype,)),
                                                      (v,), self.srcs[v])
        if self.node is None:  # first export, or the last node was differentiated (its outputs are final)
            self.outputs, self.slots = [], {}
            self.node = self.trace.graph.add("region", list(self.imports), (0,), self.dtype,
                                             {"region": self, "outputs": self.outputs}, self.srcs[-1])
        slot = self.slots.get(w)
        if slot is None:
            slot = self.slots[w] = len(self.outputs)
            self.outputs.append(w)
            self.trace.graph[self.node]["shape"] = (len(self.outputs),)
        vec = Tracer(self.trace, self.node, (len(self.outputs),), self.dtype)
        x = F.reshape(F.bind("slice", [vec], starts=(slot,), steps=(1,), shape=(1,)), ())
        if w == v:
            return x.node
        # not F.astype: a 0-d convert would be recorded into this dtype's open region
        return self.trace.graph.add("convert", [x.node], (), dtype, {"dtype": dtype}, self.srcs[v])

    def seal(self):
        """The trace is over: drop what only recording reads (each record's source line: 18 MB at
        2M records; the import and constant tables). Codegen reads the columns and values alone."""
        self.srcs, self._imported, self._consts, self._read, self.trace = None, None, None, None, None

    def freeze(self, outputs):
        """A VJP read the node with `outputs`: later exports go to a new node (shapes stay put)."""
        if outputs is self.outputs:
            self.node = None


def record(trace, op, operands, attrs, src):
    """RegionTracer of op(*operands) recorded in a region, or None when it is a graph node.
    Called for every scalar op a trace sees, so it reads each operand once and caches what the
    registry says of an (op, operand dtypes) pair."""
    if op == CONST:
        dtype = attrs["dtype"]
        if attrs["shape"] != () or dtype not in P.FLOATS:
            return None
        r = _open(trace, dtype)
        return r.value(r.const(attrs["value"], dtype, src))
    for o in operands:
        if o.shape:
            return None
    key = (op, *[o.dtype for o in operands])
    rule = _RULES.get(key) if not attrs else None
    if rule is None:
        rule = _rule(op, key[1:], attrs)
        if not attrs:
            _RULES[key] = rule
    dtype, home, k = rule
    if not home:
        if home is False:
            return None
        # a bool op on bools: it joins the region of a bool it reads, if that region records
        home = next((o.region.dtype for o in operands if recording(o)), None) if dtype == "bool" else None
        if home is None:
            return None
    r = _open(trace, home)
    v = r.append(k, [o.index if type(o) is RegionTracer and o.region is r else r.operand(o) for o in operands], src)
    return RegionTracer(trace, r, v, dtype)


_RULES = {}  # (op, operand dtypes) -> (result dtype, region float dtype or None, kind), from the registry


def _rule(op, dtypes, attrs):
    """The registry's result dtype (its ShapeError if none), the float dtype whose region the op
    joins (a float result's or operand's, if every other operand has it or is a bool; None for
    bools alone, False for none) and the records' kind."""
    dtype = P.PRIMITIVES[op].infer([((), d) for d in dtypes], attrs)[1]
    home = dtype if dtype in P.FLOATS else next((d for d in dtypes if d in P.FLOATS), None)
    if home is None:
        home = None if dtype == "bool" and all(d == "bool" for d in dtypes) else False
    elif dtype not in (home, "bool") or any(d != home and d != "bool" for d in dtypes):
        home = False
    return dtype, home, kind(op, attrs, dtype, dtypes)


def _open(trace, dtype):
    r = trace.regions.get(dtype)
    return Region(trace, dtype) if r is None else r


def rebind(attrs, operands):
    """A region node's value bound again in the current trace, record by record over `operands`
    (Tracers for its imports): how a loop's body is replayed (loop_reverse.py), the ops landing
    in the current trace's own region or nodes as any traced op does."""
    from . import ops as F
    r, vals = attrs["region"], []
    for v in range(max(attrs["outputs"], default=-1) + 1):
        op, op_attrs, dtype, _ = KINDS[r.kinds[v]]
        args = r.args(v)
        if op == IMPORT:
            vals.append(operands[args[0]])
        elif op == CONST:
            vals.append(F.bind("const", [], value=r.values[v], shape=(), dtype=dtype))
        else:
            vals.append(F.bind(op, [vals[k] for k in args], **op_attrs))
    return F.concatenate([F.reshape(vals[w], (1,)) for w in attrs["outputs"]])


def reverse(r, top, seeds, import_needs):
    """Cotangents of r's imports (a RegionTracer or None each), from records [0, top) of the open
    region r walked back from `seeds` (value -> cotangent, values of r): adjoint records go into r.
    import_needs[i]: whether import i wants a cotangent (it depends on what grad is taken of).
    By templates (region_reverse.py); by `walk` when a VJP rule cannot be a template, or for
    fewer than WALK_BELOW records, where numpy's fixed cost (~1 ms) is more than the walk's."""
    if top >= WALK_BELOW:
        from . import region_reverse
        try:
            return region_reverse.reverse(r, top, seeds, import_needs)
        except region_reverse.NotScalar:
            pass
    return walk(r, top, seeds, import_needs)


def walk(r, top, seeds, import_needs):
    """reverse, one record at a time: each VJP rule runs on r's values, recording into r."""
    from . import ops as F
    kinds, A = r.kinds, r.a
    live = depending(r, top, import_needs)
    ct, out, trace = dict(seeds), [None] * len(r.imports), r.trace
    try:
        for v in range(top - 1, -1, -1):
            g = ct.pop(v, None)
            if g is None or not live[v]:
                continue
            op, attrs, _, _ = KINDS[kinds[v]]
            if op == IMPORT:
                out[A[v]] = g
                continue
            prim = P.PRIMITIVES[op]
            if prim.vjp is None:
                continue
            xs = r.args(v)
            needs = [bool(live[a]) for a in xs]
            trace.src = r.srcs[v]  # an adjoint op is the user's line of the op it differentiates
            cts = prim.vjp(F, g, r.value(v), [r.value(a) for a in xs], needs, attrs)
            for a, c, need in zip(xs, cts, needs):
                if need and c is not None:
                    ct[a] = ct[a] + c if a in ct else c
    finally:
        trace.src = None
    return out


def depending(r, top, import_needs):
    """Which of records [0, top) depend on an import that wants a cotangent (import_needs[i]), as
    a bytearray of top + 1 (the last 0: what 'no operand', -1, reads)."""
    live = bytearray(top + 1)
    kinds, A, B, C = r.kinds, r.a, r.b, r.c
    imp = {k for k, (op, *_) in enumerate(KINDS) if op == IMPORT}
    const = {k for k, (op, *_) in enumerate(KINDS) if op == CONST}
    for v in range(top):
        k = kinds[v]
        if k in imp:
            live[v] = import_needs[A[v]]
        elif k not in const:
            live[v] = live[A[v]] or live[B[v]] or live[C[v]]
    return live


def recording(t):
    """Whether t is a value of the region its dtype records into now (grad can extend it)."""
    return type(t) is RegionTracer and t.trace.regions.get(t.region.dtype) is t.region


def backward(out, import_needs_of):
    """For a loss that is `recording`: {graph node: cotangent} of its region's imports."""
    r = out.region
    from . import ops as F
    cts = reverse(r, out.index + 1, {out.index: F.ones_like(out)}, import_needs_of(r.imports))
    return {n: c for n, c in zip(r.imports, cts) if c is not None}


# -- the `region` primitive -----------------------------------------------------------------------

def _infer(avals, attrs):
    return (len(attrs["outputs"]),), attrs["region"].dtype


def _vjp(F, g, out, xs, needs, attrs):
    """A copy of the records, open, walked back from the cotangent of each output."""
    src, outputs = attrs["region"], attrs["outputs"]
    src.freeze(outputs)
    r = Region(out.trace, src.dtype)
    r.kinds, r.a, r.b, r.c, r.srcs = array("i", src.kinds), array("i", src.a), array("i", src.b), array("i", src.c), list(src.srcs)
    r.values, r.imports, r._imported, r._consts = dict(src.values), list(src.imports), dict(src._imported), dict(src._consts)
    top = len(r)
    seeds = {v: r.value(r.operand(g[j])) for j, v in enumerate(outputs)}
    return reverse(r, top, seeds, needs)


P._register(P.Primitive("region", "region", _infer, evaluate, _vjp))
