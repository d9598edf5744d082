"""Reverse mode over a scalar region's columns: each VJP rule runs once, numpy stamps it out.

A region of 10^6 records walked back one record at a time calls its VJP rule 10^6 times through
traced ops (~3 us each). But a rule's records depend only on the record's kind and on which
operands want cotangents, so `template` runs the rule from the op registry once per such pair,
on placeholder values (its cotangent g, its result, its operands), and `reverse` lays out one
copy of that template per record with array operations. The layout, from the last value down:
each value's block is first the adds summing the cotangents sent to it (the seed first, then
its users from the last, each user's operands in order: the order region.walk adds them in),
then its own template copy. A block reads only earlier blocks and values before `top`, so ids
stay topological, and the records are the ones the walk writes, bit for bit: same ops, same
operands, same order of additions. Only two loops visit every record: which values depend on
what grad is taken of, and which receive a cotangent.
"""

import numpy as np

from . import primitives as P
from . import region as R
from .records import distinct

I = np.int32  # ids: a region stays under 2^31 values
_TEMPLATES = {}  # (kind, needs, region dtype) -> (records, outs), or None: the rule left the region


class NotScalar(Exception):
    """A VJP rule read one of its values as a graph node (or made another dtype's region)."""


class _Scratch(R.Region):
    def close(self):
        raise NotScalar


def template(trace, k, needs, dtype):
    """(records, outs) of the VJP of kind k when operand i wants a cotangent iff needs[i]: records
    are (kind, refs) in order; outs a ref per operand (None: no cotangent). A ref is ('local', j),
    ('in', i) (0: the cotangent g, 1: the result, 2 + i: operand i), ('const', value, dtype) or None."""
    key = (k, needs, dtype)
    if key not in _TEMPLATES:
        _TEMPLATES[key] = _record(trace, k, needs, dtype)
    found = _TEMPLATES[key]
    if found is None:
        raise NotScalar
    return found


def _record(trace, k, needs, dtype):
    from . import ops as F
    op, attrs, out_dtype, in_dtypes = R.KINDS[k]
    saved, src = trace.regions, trace.src
    trace.regions, trace.src = {}, None
    try:
        t = _Scratch(trace, dtype)
        for i, d in enumerate((out_dtype, out_dtype) + in_dtypes):
            t.append(R.kind(R.IMPORT, None, d, ()), (i,), None)
            t.imports.append(None)
        held = len(t)
        cts = P.PRIMITIVES[op].vjp(F, t.value(0), t.value(1), [t.value(2 + i) for i in range(len(in_dtypes))],
                                   list(needs), attrs)
        if set(trace.regions.values()) - {t}:
            return None
    except NotScalar:
        return None
    finally:
        trace.regions, trace.src = saved, src
    local, records = {}, []

    def ref(x):
        if x < 0:
            return None
        if x < held:
            return ("in", x)
        if x in t.values:
            return ("const", t.values[x], t.dtype_of(x))
        return ("local", local[x])
    for x in range(held, len(t)):
        if x not in t.values:
            local[x] = len(records)
            records.append((t.kinds[x], [ref(t.a[x]), ref(t.b[x]), ref(t.c[x])]))
    outs = []
    for c, need in zip(cts, needs):
        if c is None or not need:
            outs.append(None)
        elif type(c) is R.RegionTracer and c.region is t:
            outs.append(ref(c.index))
        else:
            return None
    return records, outs


def reverse(r, top, seeds, import_needs):
    """region.reverse, by templates (NotScalar when a rule cannot be one)."""
    trace = r.trace
    K = np.frombuffer(r.kinds, dtype=I, count=top).copy()  # a copy: r grows below
    args = np.stack([np.frombuffer(col, dtype=I, count=top) for col in (r.a, r.b, r.c)], axis=1)
    live = np.frombuffer(bytes(R.depending(r, top, import_needs)), dtype=np.uint8).astype(I)  # [top]: 0
    # which template each record of a kind with a VJP takes: (kind, needs) as kind * 8 + bits
    vjp = np.array([op not in (R.IMPORT, R.CONST) and P.PRIMITIVES[op].vjp is not None for op, *_ in R.KINDS])
    bits = live[args[:, 0]] | live[args[:, 1]] << 1 | live[args[:, 2]] << 2
    cand = live[:top].astype(bool) & vjp[K]
    tkey = np.where(cand, K * 8 + bits, -1)
    del bits
    keys = distinct(tkey[cand])
    arity = [len(R.KINDS[k][3]) for k in (keys // 8).tolist()]
    temps = [template(trace, k, tuple(bool(b >> i & 1) for i in range(n)), r.dtype)
             for k, b, n in zip((keys // 8).tolist(), (keys % 8).tolist(), arity)]
    for recs, outs in temps:  # the constants the copies read exist before the copies' ids are counted
        for o in outs + [ref for _, refs in recs for ref in refs]:
            if o is not None and o[0] == "const":
                r.const(o[1], o[2], None)
    base = len(r)
    tid = np.full(top, -1, dtype=I)
    tid[cand] = np.searchsorted(keys, tkey[cand])
    del tkey, cand
    emit_of = np.array([sum(1 << i for i, o in enumerate(outs) if o is not None) for _, outs in temps] + [0])
    emit = emit_of[tid]  # tid -1: the last entry, 0
    has = _receiving(r, emit, seeds, top)
    inst = has[:top].astype(bool) & (tid >= 0)
    del has, live

    # contributions (target, source, operand position); a seed's source is `top`: it comes first
    V = np.nonzero(inst)[0].astype(I)
    parts = [(args[V, p][m], V[m], np.full(m.sum(), p, dtype=I)) for p in range(3) for m in [(emit[V] >> p & 1).astype(bool)]]
    del V, emit
    seed_at = np.array(sorted(seeds), dtype=I)
    tgt = np.concatenate([seed_at] + [p[0] for p in parts])
    srcv = np.concatenate([np.full(len(seed_at), top, dtype=I)] + [p[1] for p in parts])
    pos = np.concatenate([np.zeros(len(seed_at), I)] + [p[2] for p in parts])
    del parts
    order = np.lexsort((pos, -srcv, tgt))
    tgt, srcv, pos = tgt[order], srcv[order], pos[order]
    del order
    m = np.bincount(tgt, minlength=top).astype(I)
    adds = np.maximum(m - 1, 0)
    size = adds + np.where(inst, np.array([len(recs) for recs, _ in temps] + [0], dtype=I)[tid], 0)
    off = (base + np.concatenate([[0], np.cumsum(size[::-1], dtype=np.int64)])[:-1][::-1]).astype(I)  # from the last value down
    inst_off = off + adds
    total = int(size.sum())
    del adds, size

    # each contribution's value id; ('in', 0) is the sender's own cotangent: resolved below
    cid = np.full(len(tgt), -1, dtype=I)
    via = np.full(len(tgt), -1, dtype=I)  # contribution = the cotangent of value via
    seeded = srcv == top
    cid[seeded] = [seeds[t].index for t in tgt[seeded].tolist()]
    group = np.where(seeded, -1, tid[np.minimum(srcv, top - 1)] * 3 + pos)  # (template, position)
    by = np.argsort(group, kind="stable")
    edges = np.searchsorted(group[by], np.arange(3 * len(temps) + 1))
    for j, (_, outs) in enumerate(temps):
        for p, o in enumerate(outs):
            sel = by[edges[3 * j + p]:edges[3 * j + p + 1]]
            if o is not None and len(sel):
                cid[sel], via[sel] = _ids(r, o, srcv[sel], inst_off, args, None)
    del group, by, seeded
    first = np.searchsorted(tgt, np.arange(top, dtype=I)).astype(I)  # each target's first contribution
    ct = np.full(top + 1, -1, dtype=I)
    one = m == 1
    ct[:top][m >= 2] = (off + m - 2)[m >= 2]
    ct[:top][one] = cid[first[one]]
    pending = np.full(top + 1, -1, dtype=I)
    pending[:top][one] = via[first[one]]
    while (pending >= 0).any():  # pointer jumping along chains of passed-on cotangents (adds)
        at = np.nonzero(pending >= 0)[0]
        nxt = pending[at]
        after = pending[nxt]  # read before any write of this round
        done = after < 0
        ct[at[done]] = ct[nxt[done]]
        pending[at] = np.where(done, -1, after)
    known = via >= 0
    cid[known] = ct[via[known]]
    del pending, known, via, one

    kinds = np.zeros(total, dtype=I)
    cols = np.full((total, 3), -1, dtype=I)
    srcs = np.empty(total, dtype=object)
    old_src = np.empty(top + 1, dtype=object)
    old_src[:top] = r.srcs[:top]
    # the adds: for a target with contributions c0..c(m-1), add q = (add q-1 or c0, cq)
    q = np.arange(len(tgt), dtype=I) - first[tgt]
    del first, m
    sel = np.nonzero(q >= 1)[0]
    at = off[tgt[sel]] + q[sel] - 1 - base
    kinds[at] = R.kind("add", None, r.dtype, (r.dtype, r.dtype))  # cotangents are of the region's dtype
    cols[at, 0] = np.where(q[sel] == 1, cid[sel - 1], at + base - 1)
    cols[at, 1] = cid[sel]
    srcs[at] = old_src[srcv[sel]]
    del q, sel, at, tgt, srcv, pos, cid
    # the template copies
    for j, (recs, _) in enumerate(temps):
        Vj = np.nonzero(inst & (tid == j))[0]
        for i, (k, refs) in enumerate(recs):
            at = inst_off[Vj] + i - base
            kinds[at] = k
            for s, o in enumerate(refs):
                if o is not None:
                    cols[at, s] = _ids(r, o, Vj, inst_off, args, ct)[0]
            srcs[at] = old_src[Vj]
    r.kinds.frombytes(kinds.tobytes())
    for s, col in enumerate((r.a, r.b, r.c)):
        col.frombytes(cols[:, s].tobytes())
    del cols, kinds, old_src
    r.srcs.extend(srcs.tolist())
    out = [None] * len(r.imports)
    for v in np.nonzero(np.isin(K, [k for k, (op, *_) in enumerate(R.KINDS) if op == R.IMPORT]) & (ct[:top] >= 0))[0]:
        out[r.a[v]] = r.value(int(ct[v]))
    return out


def _ids(r, o, V, inst_off, args, ct):
    """Value ids ref o stands for in the copies for records V, and (with ct None) which
    cotangent each stands for instead (('in', 0), resolved later), else -1."""
    kind = o[0]
    none = np.full(len(V), -1, dtype=I)
    if kind == "local":
        return inst_off[V] + o[1], none
    if kind == "const":
        return np.full(len(V), r.const(o[1], o[2], None), dtype=I), none
    if o[1] == 0:
        return (none, V) if ct is None else (ct[V], none)
    return (V if o[1] == 1 else args[V, o[1] - 2]), none


def _receiving(r, emit, seeds, top):
    """Which values receive a cotangent: a seed, or an operand its (receiving) user sends one to
    (-1, 'no operand', lands on [top])."""
    has = bytearray(top + 1)
    for s in seeds:
        has[s] = 1
    a, b, c = r.a, r.b, r.c
    e = emit.astype(np.uint8).tobytes()
    for v in range(top - 1, -1, -1):
        if has[v] and e[v]:
            if e[v] & 1:
                has[a[v]] = 1
            if e[v] & 2:
                has[b[v]] = 1
            if e[v] & 4:
                has[c[v]] = 1
    return np.frombuffer(bytes(has), dtype=np.uint8)
