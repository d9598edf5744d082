"""Per-element kernels: one loop nest computing fused elementwise code, stores and a reduction.

A Program is built symbolically first (leaf reads with affine offsets, scalar ops, stores),
so that every affine is known before any IR exists; then `collapse` merges loop dimensions
and `emit` writes the loop nest. Values inside the group live in registers; only stores and
the reduction touch memory. A domain of one element emits straight-line code.
"""

import math

from burjit import primitives as P

from . import loops
from .emitter import Emitter
from .types import REG, const, is_float

_REDUCE_FLAGS = ("reassoc", "nsz")  # lets the vectoriser split the accumulation into lanes


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
        self._memo = {}
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

    def refs(self):
        found = [e[1] for e in self.entries if e[0] == "load"] + [s[0] for s in self.stores]
        return found + ([self.reduction[0]] if self.reduction else [])

    # -- emission -----------------------------------------------------------------------------
    def emit(self, b, ptr):
        """Write the loop nest at the builder's position; ptr(ref) gives each buffer's pointer."""
        if 0 in self.domain:  # nothing to compute; a reduction over an empty axis is its identity
            if self.reduction and self.reduction_size:
                self._fill_identity(b, Emitter(b), ptr)
            return
        slots = [(i, e[-1]) for i, e in enumerate(self.entries) if e[0] in ("iota", "load")]
        affines = [a for _, a in slots] + [s[2] for s in self.stores]
        if self.reduction:
            affines.append(self.reduction[2])
        sizes, affines = loops.collapse(list(self.domain), affines)
        leaf_affine = {i: a for (i, _), a in zip(slots, affines)}
        store_affines = affines[len(slots):len(slots) + len(self.stores)]
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
        self._emit_reduction(b, e, ptr, sizes, affines[-1], compute)

    def _emit_reduction(self, b, e, ptr, sizes, out_affine, compute):
        ref, dtype, _, op, entry = self.reduction
        reduced = [d for d in range(len(sizes)) if out_affine[1][d] == 0]
        suffix = len(sizes)
        while suffix and suffix - 1 in reduced:
            suffix -= 1
        init = self._identity()
        combine = _combiner(e, op)
        accumulate = any(d < suffix for d in reduced)  # reduced dims outside the register loop
        out = ptr(ref)
        if accumulate:
            self._fill_identity(b, e, ptr)
        head = (out_affine[0], out_affine[1][:suffix])

        def outer(idx, _):
            def inner(jdx, acc):
                return [combine(acc[0], compute(idx + jdx)[entry])]
            acc = loops.nest(b, sizes[suffix:], inner, [init])[0]
            at = loops.evaluate(b, head, idx)
            if accumulate:
                acc = combine(e.load(out, dtype, at), acc)
            e.store(acc, out, dtype, at)
            return ()
        loops.nest(b, sizes[:suffix], outer)


    def _identity(self):
        ty = REG[self.reduction[1]]
        return const(ty, 0) if self.reduction[3] == "reduce_sum" else _lowest(ty)

    def _fill_identity(self, b, e, ptr):
        ref, dtype = self.reduction[:2]
        init, out = self._identity(), ptr(ref)
        loops.nest(b, [self.reduction_size], lambda idx, _: (e.store(init, out, dtype, idx[0]), ())[1])


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
