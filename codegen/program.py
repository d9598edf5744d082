"""Per-element kernels: one loop nest computing fused elementwise code, stores and a reduction.

A Program is built symbolically first (leaf reads with affine offsets, scalar ops, stores),
so that every affine is known before any IR exists; then `collapse` merges loop dimensions
and `emit` writes the loop nest. Values inside the group live in registers; only stores and
the reduction touch memory. A domain of one element emits straight-line code.
"""

import functools
import math

import numpy as np

from burjit import primitives as P

from . import loops
from .emitter import Emitter
from .types import I64, ITEMSIZE, REG, assume, const, is_float

_REDUCE_FLAGS = ("reassoc", "nsz")  # lets the vectoriser split the accumulation into lanes
# A float sum adds at most BLOCK elements of its register loops in its own dtype (over vector
# lanes) before passing them on to a running total, so rounding error grows with the number of
# blocks rather than of elements; float32 sums keep their totals in float64. A float32 sum that
# updates its output over more than BLOCK outer steps moves the partial totals there into
# float64 ones every STEPS or more steps (running_totals).
BLOCK = 1024
STEPS = 32
WIDE = {"float32": "float64"}
GRAIN = 64  # a multiple of every vector loop's step (lanes x loops.INTERLEAVE): float32 on AVX-512


class Program:
    def __init__(self, ctx, domain, group=()):
        self.ctx, self.g = ctx, ctx.graph
        self.domain = tuple(domain)
        self.group = set(group)
        # ('const', dtype, v) | ('iota', dtype, affine) | ('load', ref, dtype, affine) | ('op', node, args)
        # | ('alias', entry): a shape op inside the group is its operand read at another index
        self.entries = []
        self.stores = []       # (ref, dtype, affine, entry)
        self.reduction = None  # (ref, dtype, out affine, primitive name, entry)
        self.scratch = None    # the arena ref of the reduction's running totals, if they need their own
        self._memo = {}
        self._nest = None  # (what it was built from, _collapse())
        self.identity = loops.identity_forms(self.domain)
        self.rank = len(self.domain)
        for n in group:  # in (topological) group order, so value() recursion stays shallow
            if P.PRIMITIVES[self.g[n]["op"]].kind != "reduce":
                self.value(n)

    # -- building -----------------------------------------------------------------------------
    def _add(self, key, entry):
        self.entries.append(entry)
        self._memo[key] = len(self.entries) - 1
        return self._memo[key]

    def value(self, node, forms=None):
        """Entry index of `node`'s element at node-index `forms` (affines of the loop indices)."""
        forms = self.identity if forms is None else forms
        key = (node, forms)
        if key in self._memo:
            return self._memo[key]
        a = self.g[node]
        op, dtype = a["op"], a["dtype"]
        if node in self.group:
            kind = P.PRIMITIVES[op].kind
            if kind == "elementwise":
                return self._add(key, ("op", node, [self.value(o, forms) for o in self.g.operands(node)]))
            if op != "reshape":
                (o,) = self.g.operands(node)
                return self._add(key, ("alias", self.value(o, _operand_forms(op, a, self.g[o]["shape"], forms))))
        if op == "const":
            return self._add(key, ("const", dtype, a["attrs"]["value"]))
        if op == "iota":
            return self._add(key, ("iota", dtype, forms[a["attrs"]["axis"]]))
        if node in self.group:  # reshape: read its operand's bytes in row-major order
            (o,) = self.g.operands(node)
            if self.g[o]["op"] == "const":
                return self.value(o, ())
            node = o
        return self._add(key, ("load", self.ctx.ref(node), dtype, loops.dot(forms, loops.contiguous_strides(a["shape"]), self.rank)))

    def constant(self, dtype, value):
        return self._add(("const", dtype, value), ("const", dtype, value))

    def store(self, ref, dtype, entry, affine=None):
        self.stores.append((ref, dtype, affine or loops.dot(self.identity, loops.contiguous_strides(self.domain), self.rank), entry))

    def reduce(self, node, entry):
        """Accumulate entry into reduce node `node` (reduce_sum / reduce_max over its axes)."""
        a = self.g[node]
        axes = a["attrs"]["axes"]
        kept = [f for d, f in enumerate(self.identity) if d not in axes]
        self.reduction = (self.ctx.ref(node), a["dtype"], loops.dot(kept, loops.contiguous_strides(a["shape"]), self.rank),
                          a["op"], entry)
        self.reduction_size = math.prod(a["shape"])
        self.accumulates = _updates(self.domain, axes)[0] > 1
        self.wide, self.steps, scratch = running_totals(self.g, node)
        self.scratch = self.ctx.scratch if scratch else None

    def _collapsed(self):
        """(sizes, leaf affines by entry index, store affines, reduction affine or None): the loop
        nest emit() writes, its dimensions merged by loops.collapse (a fresh sizes list)."""
        key = (len(self.entries), len(self.stores), self.reduction is not None)  # what building adds
        if self._nest is None or self._nest[0] != key:
            self._nest = key, self._collapse()
        sizes, *rest = self._nest[1]
        return (list(sizes), *rest)

    def _collapse(self):
        slots = [(i, e[-1]) for i, e in enumerate(self.entries) if e[0] in ("iota", "load")]
        affines = [a for _, a in slots] + [s[2] for s in self.stores] + ([self.reduction[2]] if self.reduction else [])
        sizes, affines = loops.collapse(list(self.domain), affines, keep_first=math.prod(self.domain) > 1)
        n = len(slots)
        return (sizes, {i: a for (i, _), a in zip(slots, affines)}, affines[n:n + len(self.stores)],
                affines[-1] if self.reduction else None)

    def count(self):
        """(trip count, grain) when the kernel takes its outer loop's trip count at run time (a
        multiple of the grain, which it tells LLVM), else None.

        Row-major strides never hold the leading size, so all else emit() reads is then the same
        at every batch size and one function serves them all. The grain is the constant size of
        the dimensions merged into the first; for a single loop, the largest power of two up to
        GRAIN dividing its trip count, so that LLVM vectorises it without a remainder loop where
        a constant count would have. A reduction qualifies unless its outer loop is a register
        loop (all dimensions reduced: their blocking depends on the count) or it moves running
        totals (their steps do)."""
        if 0 in self.domain or math.prod(self.domain) == 1:
            return None
        sizes, _, _, out = self._collapsed()
        if self.reduction and (self.scratch or not any(out[1])):
            return None
        grain = math.gcd(sizes[0], GRAIN) if len(sizes) == 1 else sizes[0] // self.domain[0]
        return sizes[0], grain

    def signature(self, slot):
        """Everything emit() reads, with each buffer as slot(ref), its kernel parameter position,
        and a trip count passed at run time (count()) as its grain alone: programs with equal
        signatures emit equal code (lowering.py shares one function)."""
        g = self.g
        sizes, leaf, stored, out = self._collapsed()
        count = self.count()

        def entry(i, ent):
            if ent[0] == "load":
                return ("load", slot(ent[1]), ent[2], leaf[i])
            if ent[0] == "iota":
                return ("iota", ent[1], leaf[i])
            if ent[0] == "op":
                a = g[ent[1]]
                return ("op", a["op"], repr(sorted(a["attrs"].items())), tuple(ent[2]))
            if ent[0] == "const":
                return ("const", ent[1], const_bits(ent[1], ent[2]))
            return ent
        reduction = None
        if self.reduction:
            ref, dtype, _, op, at = self.reduction
            reduction = (slot(ref), dtype, out, op, at, None if count else self.reduction_size, self.accumulates,
                         self.wide, self.steps, self.scratch and slot(self.scratch))
        outer = ("times", count[1]) if count else sizes[0] if sizes else None
        return ((outer, *sizes[1:]), 0 in self.domain, math.prod(self.domain) == 1,
                tuple(entry(i, e) for i, e in enumerate(self.entries)),
                tuple((slot(s[0]), s[1], a, s[3]) for s, a in zip(self.stores, stored)), reduction)

    def refs(self):
        found = [e[1] for e in self.entries if e[0] == "load"] + [s[0] for s in self.stores]
        return found + ([self.reduction[0]] if self.reduction else []) + ([self.scratch] if self.scratch else [])

    # -- emission -----------------------------------------------------------------------------
    def emit(self, b, ptr, count=None):
        """Write the loop nest at the builder's position; ptr(ref) gives each buffer's pointer,
        and `count`, if given, count()'s trip count as an i64 value."""
        if 0 in self.domain:  # nothing to compute; a reduction over an empty axis is its identity
            if self.reduction and self.reduction_size:
                ref, dtype, _, op, _ = self.reduction
                self._fill(b, Emitter(b), ptr(ref), dtype, _identity(op, dtype))
            return
        sizes, leaf_affine, store_affines, out_affine = self._collapsed()
        if count is not None:
            sizes[0] = count
            grain = self.count()[1]
            if grain & (grain - 1) == 0 and grain > 1:  # the low bits of count are 0
                assume(b, b.icmp_unsigned("==", b.and_(count, I64(grain - 1)), I64(0)))
        e = Emitter(b, outline=math.prod(self.domain) == 1)

        def compute(idx):
            vals = []
            for i, ent in enumerate(self.entries):
                tag = ent[0]
                if tag == "const":
                    vals.append(const(REG[ent[1]], ent[2]))
                elif tag == "iota":
                    vals.append(e.cast(loops.evaluate(b, leaf_affine[i], idx), ent[1]))
                elif tag == "load":
                    vals.append(e.load(ptr(ent[1]), ent[2], loops.evaluate(b, leaf_affine[i], idx)))
                elif tag == "alias":
                    vals.append(vals[ent[1]])
                else:
                    a = self.g[ent[1]]
                    vals.append(P.PRIMITIVES[a["op"]].scalar(e, *[vals[k] for k in ent[2]], **a["attrs"]))
            for (ref, dtype, _, entry), aff in zip(self.stores, store_affines):
                e.store(vals[entry], ptr(ref), dtype, loops.evaluate(b, aff, idx))
            return vals

        if not self.reduction:
            loops.nest(b, sizes, lambda idx, _: (compute(idx), ())[1], interleave=True)
            return
        self._emit_reduction(b, e, ptr, sizes, out_affine, compute)

    def _emit_reduction(self, b, e, ptr, sizes, out_affine, compute):
        ref, dtype, _, op, entry = self.reduction
        reduced = [d for d in range(len(sizes)) if out_affine[1][d] == 0]
        suffix = len(sizes)  # the innermost reduced dimensions are register loops
        while suffix and suffix - 1 in reduced:
            suffix -= 1
        combine, identity, out = _combiner(e, op), _identity(op, dtype), ptr(ref)
        head = (out_affine[0], out_affine[1][:suffix])
        if self.accumulates:
            self._fill(b, e, out, dtype, identity)

        def step(idx, _=None):
            acc = self._register_total(b, e, sizes[suffix:], lambda jdx: compute(idx + jdx)[entry], combine)
            at = loops.evaluate(b, head, idx)
            acc = e.cast(acc, dtype)
            e.store(combine(e.load(out, dtype, at), acc) if self.accumulates else acc, out, dtype, at)
            return ()
        if not self.scratch:
            loops.nest(b, sizes[:suffix], step, across=self.accumulates)
            return
        # Every self.steps steps of the innermost outer reduced loop, move the output's partial
        # totals into the float64 ones: the first move starts them, the last one writes the result.
        wide, totals = self.wide, ptr(self.scratch)
        last = max(d for d in reduced if d < suffix)
        inner, n = sizes[last + 1:suffix], sizes[last]
        ends = [d for d in reduced if d < last]

        def moves(idx, _):
            def block(start, count, _):
                loops.nest(b, [count] + inner, lambda jdx, _: step(idx + [b.add(start, jdx[0])] + jdx[1:]), across=True)
                def where(pairs):  # every index i is at v
                    return functools.reduce(b.and_, [b.icmp_unsigned("==", i, I64(v)) for i, v in pairs])
                first = where([(idx[d], 0) for d in ends] + [(start, 0)])
                final = where([(idx[d], sizes[d] - 1) for d in ends] + [(start, (n - 1) // self.steps * self.steps)])

                def move(jdx, _):
                    at = loops.evaluate(b, head, idx + [I64(0)] + jdx)
                    before = e.select(first, _identity(op, wide), e.load(totals, wide, at))
                    total = combine(before, e.cast(e.load(out, dtype, at), wide))
                    e.store(total, totals, wide, at)
                    e.store(e.select(final, e.cast(total, dtype), identity), out, dtype, at)
                    return ()
                loops.nest(b, inner, move)
                return ()
            return _in_blocks(b, n, self.steps, block, ())
        loops.nest(b, sizes[:last], moves)

    def _register_total(self, b, e, sizes, element, combine):
        """element(idx) reduced over the register loops `sizes`, in the wide dtype.

        A float sum goes in blocks of at most BLOCK elements (whole inner loops and a slice of the
        loop around them): each block sums afresh in the element dtype, over vector lanes at full
        vector speed, and then joins the running total."""
        op, dtype = self.reduction[3], self.reduction[1]
        if not sizes:
            return e.cast(element([]), self.wide)
        if not (op == "reduce_sum" and is_float(REG[dtype]) and math.prod(sizes) > BLOCK):
            part = loops.nest(b, sizes, lambda k, p: [combine(p[0], element(k))], [_identity(op, dtype)], across=True)[0]
            return e.cast(part, self.wide)
        t = max(d for d in range(len(sizes)) if math.prod(sizes[d:]) > BLOCK)

        def total(lead, acc):
            def block(start, count, acc):
                part = loops.nest(b, [count] + sizes[t + 1:], lambda k, p: [
                    combine(p[0], element(lead + [b.add(start, k[0])] + k[1:]))], [_identity(op, dtype)], across=True)[0]
                return [combine(acc[0], e.cast(part, self.wide))]
            return _in_blocks(b, sizes[t], BLOCK // math.prod(sizes[t + 1:]), block, acc)
        return loops.nest(b, sizes[:t], total, [_identity(op, self.wide)], across=True)[0]

    def _fill(self, b, e, ptr, dtype, value):
        loops.nest(b, [self.reduction_size], lambda idx, _: (e.store(value, ptr, dtype, idx[0]), ())[1])


def running_totals(graph, node):
    """(dtype, steps, arena bytes) of reduce node `node`'s running totals.

    float32 sums total in float64. One whose output is updated in place over more than BLOCK
    outer steps moves the output's partial totals into float64 ones every `steps` steps; those
    need bytes of their own. The steps between moves read at least BLOCK elements, so that
    moves cost little and the vectoriser gets long loops. Shorter sums accumulate in the output
    alone, as numpy's do along an axis that is not contiguous: for them the moves cost more
    build time than they save error (GPT's bias gradients over 128 rows built ~15% slower)."""
    a = graph[node]
    (x,) = graph.operands(node)
    wide = WIDE.get(a["dtype"], a["dtype"]) if a["op"] == "reduce_sum" else a["dtype"]
    updates, width = _updates(graph[x]["shape"], a["attrs"]["axes"])
    own = wide != a["dtype"] and updates > BLOCK
    return wide, max(STEPS, BLOCK // width), ITEMSIZE[wide] * math.prod(a["shape"]) if own else 0


def _updates(shape, axes):
    """(updates, width): how often each output element is updated in place (the product of the
    reduced dimensions outside a kept one) and how many elements one such step reads (the
    dimensions inside the last of those)."""
    dims = [(d in axes, s) for d, s in enumerate(shape) if s != 1]
    kept = [k for k, (r, _) in enumerate(dims) if not r]
    outer = [k for k, (r, _) in enumerate(dims) if r and kept and k < kept[-1]]
    width = math.prod(s for _, s in dims[outer[-1] + 1:]) if outer else 1
    return math.prod(dims[k][1] for k in outer), width


def _in_blocks(b, n, size, body, carried):
    """A loop over n in blocks of `size`: body(start, count, carried) -> carried for each block,
    whole blocks in a loop and then the rest, so that every trip count is a constant."""
    full, rest = divmod(n, size)
    if full:
        carried = loops.nest(b, [full], lambda j, c: body(b.mul(j[0], I64(size)), size, c), carried)
    return body(I64(full * size), rest, carried) if rest else carried


def const_bits(dtype, value):
    """A constant as the bytes it has in its dtype (so -0.0 and 0.0, or NaN payloads, differ)."""
    return np.asarray(value, dtype=dtype).tobytes()


def _identity(op, dtype):
    ty = REG[dtype]
    return const(ty, 0) if op == "reduce_sum" else _lowest(ty)


def _operand_forms(op, a, operand_shape, forms):
    """Node-index affines of the operand element that a shape op's element at `forms` reads."""
    zero = (0, tuple(0 for _ in forms[0][1])) if forms else (0, ())
    if op == "broadcast_to":
        lead = len(a["shape"]) - len(operand_shape)
        return tuple(zero if s == 1 and a["shape"][lead + k] != 1 else forms[lead + k]
                     for k, s in enumerate(operand_shape))
    if op == "transpose":
        out = [None] * len(forms)
        for d, p in enumerate(a["attrs"]["perm"]):
            out[p] = forms[d]
        return tuple(out)
    if op == "slice":
        return tuple((st + sp * c, tuple(sp * k for k in ks))
                     for (c, ks), st, sp in zip(forms, a["attrs"]["starts"], a["attrs"]["steps"]))
    raise NotImplementedError(op)


def _lowest(ty):
    if is_float(ty):
        return const(ty, float("-inf"))
    return const(ty, -(1 << (ty.width - 1)))


def _combiner(e, op):
    if op == "reduce_max":
        return e.max

    def add(x, y):
        return e.b.fadd(x, y, flags=_REDUCE_FLAGS) if is_float(x.type) else e.b.add(x, y)
    return add
