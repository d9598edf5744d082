"""The tape tier: a large scalar program run by a native interpreter loop, not as straight-line code.

LLVM's time on one straight-line function grows faster than the function (fastest_autograd,
n = 1,000: one 20k-node function took ~1 s of the first call's 2.7 s), and an interpreter is
compiled once for every step that uses the same ops. So a scalar region node (burjit/region.py:
the large scalar programs) and a 0-d group whose Program has more than TAPE_ENTRIES entries (or
any, with BURJIT_TIER=tape) become tapes: records of four int32 (out, a, b, c) in an array the
executable keeps (the step reads its address from the arena, beside that of the opcodes), run by
`interpreter`:

    load   out <- *(argv[a] + b)           one opcode per dtype
    set    out <- the bits (a, b)          one opcode per dtype (constants of a region, unbaked)
    store  *(argv[b] + c) <- out's value   (a names the register stored)
    op     out <- op(a, b, c)              one opcode per (primitive, attrs, operand dtypes,
                                           constant operands); its case is the primitive's
                                           `scalar` lowering, the code straight-line code runs;
                                           a, b, c are its register operands, in order
    pair   out <- outer(inner(..), ..)     an op fused into its value's one reader (_fuse)
    end    (opcode 0)

Constant operands are baked into their opcode, as straight-line code folds them, so both tiers
give the same bits. Registers are 8-byte slots in the arena (one region for every tape of a
step, as they run one after another), reused as soon as their value's last reader has run.
Records are ordered by (depth, opcode): a node's depth is one more than its deepest operand's,
so the order is still topological, and a depth's records of one opcode are one run. Where runs
are long (RUN records or more on average), the opcodes are (opcode, count) per run and the
interpreter dispatches once per run, then loops over the run with that opcode's case alone;
else it dispatches per record, over one opcode per record. Dispatch per run took micrograd's
MLP as scalars (~190 records a depth) from 81.8 to 75.7 us a step; pairs then to 35 us,
0.53 ns a node (python -m benchmarks --only scalar_values_mlp, 2026-12-04): sums of products
become half the records, and a sixth of the registers, which then fit the L1 cache.
The interpreter is a kernel like the others (lowering.py): its identity is its opcode table and
dispatch, so it is built once per op set, compiled in the compile servers and cached on disk.
"""


import functools
from array import array

import numpy as np
from llvmlite import ir

from burjit import primitives as P
from burjit import records as R
from burjit.graph import tier as graph_tier

from .emitter import Emitter
from .program import const_bits
from .types import I8, I32, I64, ITEMSIZE, REG, const

TAPE_ENTRIES = 4096  # auto tier: larger 0-d Programs run on the tape (README "Compile cost")
MAX_OPCODES = 1024   # a program needing more distinct opcodes stays straight-line code
RUN = 4              # records a run on average, at least, for the interpreter to dispatch per run
PAIRS = 32           # pair opcodes at most (_fuse)
PAIR_MIN = 256       # records of a pair, at least, to give it an opcode
REGISTER = 8         # bytes per register: every dtype fits
PTR = ir.PointerType()


def tier(graph):
    """The graph's meta["tier"] (compile(tier=...)), else BURJIT_TIER: 'auto' (default),
    'straight' or 'tape' (every 0-d program with an op)."""
    return graph_tier(graph.meta.get("tier"))


def wanted(program, which):
    """Whether `program` (a 0-d Program) runs on the tape under tier `which`."""
    if which == "straight":
        return False
    ops = sum(e[0] == "op" for e in program.entries)
    return ops > 0 and (which == "tape" or len(program.entries) > TAPE_ENTRIES)


class Tape:
    """Records run by the interpreter; `table` (its identity) is None if they need more than
    MAX_OPCODES opcodes or a byte offset past int32: the program stays straight-line code.
    Built from a 0-d Program (`of_program`) or a region node (`of_region`)."""

    def __init__(self, cols, keys):
        """cols: Columns of every record, in any order; keys: each opcode key -> the attrs its
        primitive's lowering takes (None for loads, stores and sets)."""
        self.table = None
        if len(keys) > MAX_OPCODES or not cols.fits:
            return
        self.fused = _fuse(cols, keys, MAX_OPCODES - len(keys))
        self._attrs = keys
        used = np.flatnonzero(np.bincount(cols.op, minlength=len(cols.keys)))
        self.table = tuple(sorted((cols.keys[k] for k in used.tolist()), key=repr))
        rank = {k: c + 1 for c, k in enumerate(self.table)}
        cols.op = np.array([rank.get(k, 0) for k in cols.keys], dtype=np.int32)[cols.op]  # keys -> opcodes
        order = np.lexsort((cols.rec[:, 0], cols.op, cols.depth))  # (ties: by value; stores as listed)
        cols.depth = None  # the order is all it was for
        cols.take(order)
        del order
        op = cols.op
        start = np.flatnonzero(np.diff(op, prepend=np.int32(-1)))  # where each run of one opcode starts
        self.per_run = len(start) * RUN <= len(op)
        if self.per_run:
            self.runs = np.zeros((len(start) + 1, 2), dtype=np.int32)  # (opcode, count); (0, 0) ends
            self.runs[:-1, 0], self.runs[:-1, 1] = op[start], np.diff(start, append=len(op))
        else:  # each record's opcode, then 0
            self.runs = np.append(op, np.int32(0))
        cols.op = None
        del op, start
        self.records, self.registers = _allocate(cols)

    @classmethod
    def of_program(cls, program, constant):
        """constant(node, element) -> a constant node's element (a load from a 'global' ref)."""
        g, entries = program.g, program.entries
        value, dtype_of, depth, keys, ops = {}, {}, {}, {}, []
        for i, ent in enumerate(entries):  # what each entry is: ("const", dtype, v) or a register
            tag = ent[0]
            if tag == "alias":
                value[i], depth[i], dtype_of[i] = value[ent[1]], depth[ent[1]], dtype_of[ent[1]]
                continue
            dtype_of[i] = g[ent[1]]["dtype"] if tag == "op" else ent[2] if tag == "load" else ent[1]
            if tag in ("const", "iota"):
                value[i], depth[i] = _baked(ent[1], ent[2] if tag == "const" else ent[2][0]), 0
            elif tag == "load" and ent[1][0] == "global":
                value[i], depth[i] = _baked(ent[2], constant(ent[1][1], ent[3][0])), 0
            elif tag == "load":
                value[i], depth[i] = ("reg", i), 0
                ops.append((0, i, ("load", ent[2]), (ent[1][1], ent[1][2] + ent[3][0] * ITEMSIZE[ent[2]])))
            else:
                a = g[ent[1]]
                args = [value[k] for k in ent[2]]
                spec = tuple(("reg", dtype_of[k]) if v[0] == "reg" else v for k, v in zip(ent[2], args))
                key = _op_key(a["op"], a["attrs"], spec, a["dtype"])
                keys.setdefault(key, a["attrs"])
                value[i] = ("reg", i)
                regs = [v[1] for v in args if v[0] == "reg"]  # the register operands, in order
                depth[i] = 1 + max((depth[k] for k in regs if k >= 0), default=-1)
                ops.append((depth[i], i, key, regs))
        _stores(ops, keys, program.stores, value.__getitem__, max(depth.values(), default=0) + 1, len(entries))
        return cls(Columns.of(ops), _with_memory_keys(keys, ops))

    @classmethod
    def of_region(cls, ctx, node, constant, bake=True):
        """A region node (burjit/region.py): loads of its imports, the records its outputs need, a
        store of each output; ctx.ref(node) says where a graph value's bytes are. With bake=False
        (a region whose baked constants would need too many opcodes) each constant is a `set`
        record instead, its bits in the record's fields. Built with numpy over the region's
        columns: only liveness, depth and register allocation walk the records one by one."""
        g = ctx.graph
        r, outputs = g[node]["attrs"]["region"], g[node]["attrs"]["outputs"]
        imports, n = g.operands(node), max(outputs, default=-1) + 1
        K = np.frombuffer(r.kinds, dtype=np.int32, count=n)
        args = np.full((n + 1, 3), -1, dtype=np.int32)  # row n: a sentinel for 'no operand'
        for j, col in enumerate((r.a, r.b, r.c)):
            args[:n, j] = np.frombuffer(col, dtype=np.int32, count=n)
        kinds = {k: R.KINDS[k] for k in R.distinct(K).tolist()}
        tag = np.zeros(n + 1, dtype=np.int8)  # 0 op, 1 import, 2 constant (sentinel: 2, not a register)
        tag[n] = 2
        for k, (op, *_) in kinds.items():
            if op in (R.IMPORT, R.CONST):
                tag[:n][K == k] = 1 if op == R.IMPORT else 2
        value = {v: x for v, x in r.values.items() if v < n}  # constants, and imports of graph constants
        where = {}
        for v in np.nonzero(tag[:n] == 1)[0].tolist():
            ref = ctx.ref(imports[args[v, 0]])
            if ref[0] == "global":
                tag[v], value[v] = 2, constant(ref[1], 0)
            else:
                where[v] = ref[1:]
        need = _needed(r, tag, outputs, n)
        baked = tag == 2 if bake else np.zeros(n + 1, dtype=bool)
        baked[n] = True
        depth = _depths(r, tag, baked, n)
        dtype = r.dtype_of

        ops = np.nonzero(need & (tag[:n] == 0))[0].astype(np.int32)
        operand = args[ops]
        del args
        const = baked[operand] & (operand >= 0)  # -1 ('no operand') reads the sentinel, baked too
        uniq, inv = _distinct_rows(K[ops], np.where(const, operand, -1), np.nonzero(baked[:n])[0], n)
        keylist, keys = [], {}
        for row in uniq.tolist():
            op, attrs, out_dtype, in_dtypes = kinds[row[0]]
            spec = tuple(_baked(d, value[c]) if c >= 0 else ("reg", d) for d, c in zip(in_dtypes, row[1:]))
            key = _op_key(op, attrs, spec, out_dtype)
            keylist.append(key)
            keys.setdefault(key, attrs)
        reads = _packed(np.where(const, -1, operand))  # the register operands, in order
        del operand, const
        small = []  # loads, sets and stores: one per import, unbaked constant and output
        for v, (slot, off) in where.items():
            if need[v]:
                small.append((0, v, ("load", dtype(v)), (slot, off)))
        if not bake:
            for v in np.nonzero(need & (tag[:n] == 2))[0].tolist():
                bits = const_bits(dtype(v), value[v]).ljust(8, b"\0")
                small.append((0, v, ("set", dtype(v)), tuple(int.from_bytes(bits[k:k + 4], "little", signed=True)
                                                           for k in (0, 4))))
        stores = [(ctx.ref(node), r.dtype, (j,), v) for j, v in enumerate(outputs)]
        _stores(small, keys, stores, lambda v: _baked(dtype(v), value[v]) if baked[v] else ("reg", v),
                int(depth.max(initial=0)) + 1, n)
        cols = Columns.joined(depth[ops], inv, ops, reads, keylist, Columns.of(small))
        del depth, need, reads, ops, inv
        return cls(cols, _with_memory_keys(keys, small))

    def interpreter(self, b, argv, records, runs, regs):
        """The loop over runs, each an inner loop over its records with the opcode's case alone
        (at b's position; a kernel's body: lowering returns 0 after it)."""
        fn = b.function
        e = Emitter(b)
        start = b.block
        outer, following, done = (fn.append_basic_block(name) for name in ("run", "next", "done"))
        b.branch(outer)
        b.position_at_end(outer)
        r, first = b.phi(I64), b.phi(I64)  # the run, its first record
        r.add_incoming(I64(0), start)
        first.add_incoming(I64(0), start)
        run = b.gep(runs, [b.mul(r, I64(2 if self.per_run else 1))], inbounds=True, source_etype=I32)
        opcode = b.load(run, typ=I32)
        count = b.load(b.gep(run, [I64(1)], inbounds=True, source_etype=I32), typ=I32) if self.per_run else I32(1)
        end = b.add(first, b.zext(count, I64))
        switch = b.switch(opcode, done)

        def reg(k):
            return b.gep(regs, [b.mul(b.zext(k, I64), I64(REGISTER))], inbounds=True, source_etype=I8)

        def memory(slot, offset):
            base = b.load(b.gep(argv, [b.zext(slot, I64)], inbounds=True, source_etype=PTR), typ=PTR)
            return b.gep(base, [b.sext(offset, I64)], inbounds=True, source_etype=I8)

        for c, key in enumerate(self.table, start=1):
            block = fn.append_basic_block(f"op{c}")
            switch.add_case(I32(c), block)
            b.position_at_end(block)
            i = b.phi(I64)
            i.add_incoming(first, outer)
            rec = b.gep(records, [b.mul(i, I64(4))], inbounds=True, source_etype=I32)
            out, x, y, z = [b.load(b.gep(rec, [I64(k)], inbounds=True, source_etype=I32), typ=I32)
                            for k in range(4)]
            if key[0] == "load":
                e.store(e.load(memory(x, y), key[1], I64(0)), reg(out), key[1], I64(0))
            elif key[0] == "set":  # the value's bits: a the low 32, b the high 32 (if 8 bytes)
                if ITEMSIZE[key[1]] == 8:
                    b.store(b.or_(b.zext(x, I64), b.shl(b.zext(y, I64), I64(32))), reg(out))
                else:
                    b.store(x, reg(out))
            elif key[0] == "store":
                e.store(e.load(reg(x), key[1], I64(0)), memory(y, z), key[1], I64(0))
            else:  # an op or a pair: its register operands are the fields, in order
                fields = iter((x, y, z))

                def apply(key, given=None):
                    _, op, _, spec, _ = key
                    args = [given[1] if given and given[0] == i else e.load(reg(next(fields)), s[1], I64(0))
                            if s[0] == "reg" else const(REG[s[1]], np.frombuffer(s[2], dtype=s[1])[0].item())
                            for i, s in enumerate(spec)]
                    return P.PRIMITIVES[op].scalar(e, *args, **self._attrs[key])
                last = key if key[0] == "op" else key[2]
                value = apply(key) if key[0] == "op" else apply(last, (key[3], apply(key[1])))
                e.store(value, reg(out), last[4], I64(0))
            step = b.add(i, I64(1))
            i.add_incoming(step, b.block)
            b.cbranch(b.icmp_unsigned("<", step, end), block, following)
        b.position_at_end(following)
        r.add_incoming(b.add(r, I64(1)), following)
        first.add_incoming(end, following)
        b.branch(outer)
        b.position_at_end(done)


def _op_key(op, attrs, spec, dtype):
    """The opcode of `op` with `attrs` over operands `spec` (('reg', dtype) or a baked constant)."""
    return ("op", op, repr(sorted(attrs.items())) if attrs else "[]", spec, dtype)


def _baked(dtype, value):
    """A constant operand as its opcode holds it: dtype and bytes (so -0.0 and 0.0 differ)."""
    return ("const", dtype, const_bits(dtype, value))


def _stores(ops, keys, stores, spec, depth, fresh):
    """Add the records storing each (ref, dtype, affine, value) of `stores` at `depth`; spec(value)
    is ('reg', id) or its baked constant; a constant stored is an `id` of it first (ids from fresh)."""
    for j, (ref, dtype, affine, entry) in enumerate(stores):
        where = (ref[1], ref[2] + affine[0] * ITEMSIZE[dtype])
        v = spec(entry)
        if v[0] == "reg":
            ops.append((depth, -1 - j, ("store", dtype), (v[1],) + where))
        else:
            key = _op_key("id", {}, (v,), dtype)
            keys.setdefault(key, {})
            ops.append((depth, fresh + j, key, []))
            ops.append((depth + 1, -1 - j, ("store", dtype), (fresh + j,) + where))


class Columns:
    """Records as arrays: `rec`, one int32 row per record holding (value written or -1 for a
    store, three values read or -1) — turned in place into the interpreter's (out, a, b, c) —
    beside `op` (an index into `keys`), depth, form (0 op, 1 load or set, 2 store) and,
    for the rows `field_rows` alone (loads, sets, stores), f0/f1: a load's or store's slot and
    byte offset, a set's bits; `fits` says whether those fit int32. One matrix, rewritten in
    place, is what keeps a 2M-record tape at ~40 MB of records plus a few columns while built."""

    def __init__(self, depth, key, out, reads, keys, form=None, fields=None):
        i32 = functools.partial(np.asarray, dtype=np.int32)
        self.depth, self.keys = i32(depth), keys
        self.op = i32(key)
        self.rec = np.empty((len(self.depth), 4), dtype=np.int32)
        self.rec[:, 0], self.rec[:, 1:] = out, reads
        self.form = np.zeros(len(self.depth), dtype=np.int8) if form is None else form
        rows, f0, f1 = fields if fields is not None else ((), (), ())
        self.fits = all(np.asarray(f, dtype=np.int64).max(initial=0) < 2 ** 31 for f in (f0, f1))
        self.field_rows, self.f0, self.f1 = i32(rows), i32(f0), i32(f1)

    @classmethod
    def of(cls, ops):
        """From (depth, value id, key, fields) tuples: fields are an op's registers read, a load's or
        set's (a, b), a store's (value, slot, offset)."""
        keylist, index, rows, fields = [], {}, [], []
        for d, i, key, f in ops:
            k = index.get(key)
            if k is None:
                k = index[key] = len(keylist)
                keylist.append(key)
            tag = key[0]
            if tag == "store":
                fields.append((len(rows), f[1], f[2]))
                rows.append((d, k, -1, f[0], -1, -1, 2))
            elif tag in ("load", "set"):
                fields.append((len(rows), f[0], f[1]))
                rows.append((d, k, i, -1, -1, -1, 1))
            else:
                rows.append((d, k, i, *(list(f) + [-1] * (3 - len(f))), 0))
        a = np.array(rows, dtype=np.int64).reshape(-1, 7)
        fa = np.array(fields, dtype=np.int64).reshape(-1, 3)
        return cls(a[:, 0], a[:, 1], a[:, 2], a[:, 3:6], keylist, a[:, 6].astype(np.int8), (fa[:, 0], fa[:, 1], fa[:, 2]))

    @classmethod
    def joined(cls, depth, key, out, reads, keys, more):
        """The records of arrays (depth, key, out, reads; keys) followed by those of Columns
        `more`, written once into one matrix (two copies of 10^6 records would be 40 MB more)."""
        n, m = len(depth), len(more.depth)
        cols = cls.__new__(cls)
        cols.rec = np.empty((n + m, 4), dtype=np.int32)
        cols.rec[:n, 0], cols.rec[:n, 1:] = out, reads
        cols.rec[n:] = more.rec
        cols.op = np.concatenate([np.asarray(key, dtype=np.int32), more.op + len(keys)])
        cols.keys, cols.fits, cols.field_rows = list(keys) + more.keys, more.fits, more.field_rows + n
        cols.depth = np.concatenate([np.asarray(depth, dtype=np.int32), more.depth])
        cols.form = np.concatenate([np.zeros(n, dtype=np.int8), more.form])
        cols.f0, cols.f1 = more.f0, more.f1
        return cols

    def take(self, rows):
        """Keep the records `rows` (a subset or a reordering of them; every load, set and store
        among them), in that order, in place: one column copied at a time."""
        at = np.full(len(self.rec), -1, dtype=np.int32)  # field index of each old row
        at[self.field_rows] = np.arange(len(self.field_rows), dtype=np.int32)
        moved = at[rows]
        self.field_rows = np.nonzero(moved >= 0)[0].astype(np.int32)
        pick = moved[self.field_rows]
        self.f0, self.f1 = self.f0[pick], self.f1[pick]
        del at, moved
        m = len(rows)
        for j in range(4):
            self.rec[:m, j] = self.rec[:, j][rows]
        self.rec = self.rec[:m]
        self.form, self.op = self.form[rows], self.op[rows]
        if self.depth is not None:
            self.depth = self.depth[rows]


def _distinct_rows(kinds, const_of, consts, n):
    """(distinct rows, each row's index among them) of rows (kind, constant operand ids or -1):
    each packed into one int64 (consts: the constant values' ids, all < n), in place, and ranked
    through a table, linear in the rows (np.unique over rows sorts: ~1 s at 2M rows)."""
    if not len(kinds):
        return np.zeros((0, 1 + const_of.shape[1]), dtype=np.int64), np.zeros(0, dtype=np.int64)
    dense = np.zeros(n + 1, dtype=np.int32)  # -1 (no constant) lands on the sentinel n: 0
    dense[consts] = np.arange(1, len(consts) + 1)
    base, packed = len(consts) + 1, kinds.astype(np.int64)
    for j in range(const_of.shape[1]):
        packed *= base
        packed += dense[const_of[:, j]]
    del dense
    if packed.max() >= 1 << 24:
        _, first, inv = np.unique(packed, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
    else:
        seen = np.full(int(packed.max()) + 1, -1, dtype=np.int64)
        seen[packed[::-1]] = np.arange(len(packed) - 1, -1, -1)  # each key's first row
        first = np.sort(seen[seen >= 0])
        rank = np.zeros_like(seen)
        rank[packed[first]] = np.arange(len(first))
        inv = rank[packed]
    return np.concatenate([kinds[first, None], const_of[first]], axis=1).astype(np.int64), inv


def _packed(reads):
    """Each row's non-negative entries moved first, in order (then the -1s), in place: a bubble
    over the few columns, with masks alone (an argsort over rows would hold 8 bytes an entry)."""
    for _ in range(reads.shape[1] - 1):
        for j in range(reads.shape[1] - 1):
            move = (reads[:, j] < 0) & (reads[:, j + 1] >= 0)
            reads[move, j], reads[move, j + 1] = reads[move, j + 1], -1
    return reads


def _fuse(cols, keys, room):
    """Fuse an op into its one reader when that is an op too and the two read at most three
    registers: one `pair` record (key ("pair", inner, outer, the position of the outer's operand
    the inner feeds)) computes both, from the inner's register operands then the outer's others,
    and the inner's value never takes a register. Micrograd's sums of products are chains of such pairs
    (mul into add): half the records, and no store and load between the two. At most `room` pair
    keys, the most frequent, each of at least PAIR_MIN records (a rare pair is interpreter code
    to compile for nothing); the inner's bits are those of straight-line code, as each part is
    its primitive's `scalar` lowering. Returns the number of pairs made."""
    ks, rec, op = cols.keys, cols.rec, cols.op
    room = min(room, PAIRS)
    if room <= 0 or not len(op):
        return 0
    regs = np.array([sum(s[0] == "reg" for s in k[3]) if k[0] == "op" else -9 for k in ks])  # -9: not an op
    out, reads = rec[:, 0], rec[:, 1:]
    size = int(max(out.max(), reads.max())) + 1
    count = np.bincount(reads[reads >= 0], minlength=size)
    reader, slot = np.full(size, -1, dtype=np.int32), np.zeros(size, dtype=np.int8)
    for j in range(3):
        rows = np.flatnonzero(reads[:, j] >= 0)
        reader[reads[rows, j]], slot[reads[rows, j]] = rows, j
    del rows
    p = np.flatnonzero((regs[op] >= 0) & (out >= 0))
    p = p[count[out[p]] == 1]
    del count
    q = reader[out[p]]
    ok = (regs[op[q]] >= 0) & (regs[op[p]] + regs[op[q]] <= 4)
    p, q = p[ok], q[ok]
    outers = np.zeros(len(op), dtype=bool)
    outers[q] = True
    p, q = p[~outers[p]], q[~outers[p]]  # a chain's middle stays an outer
    _, first = np.unique(q, return_index=True)  # one inner per outer
    p, q = p[first], q[first]
    j = slot[out[p]]
    del reader, slot, outers, first
    pair, which, counts = np.unique((op[p].astype(np.int64) * len(ks) + op[q]) * 3 + j,
                                    return_inverse=True, return_counts=True)
    best = np.argsort(-counts, kind="stable")[:room]
    best = best[counts[best] >= PAIR_MIN]
    if not len(best):
        return 0
    known = len(ks)
    code = np.full(len(pair), -1, dtype=np.int32)
    code[best] = np.arange(known, known + len(best))
    for c in best.tolist():
        a, rest = divmod(int(pair[c]), 3 * known)
        outer = ks[rest // 3]
        key = ("pair", ks[a], outer, [i for i, s in enumerate(outer[3]) if s[0] == "reg"][rest % 3])
        ks.append(key)
        keys[key] = None  # its parts' attrs are theirs
    code = code[which]
    sel = code >= 0
    p, q, j, code = p[sel], q[sel], j[sel], code[sel]
    both = np.concatenate([reads[p], reads[q]], axis=1)
    both[np.arange(len(q)), 3 + j] = -1  # the outer's operand the inner feeds
    reads[q] = _packed(both)[:, :3]
    op[q] = code
    keep = np.ones(len(op), dtype=bool)
    keep[p] = False
    cols.take(np.flatnonzero(keep))
    return len(p)


def _with_memory_keys(keys, ops):
    for _, _, key, _ in ops:
        keys.setdefault(key, None)
    return keys


def _needed(r, tag, outputs, n):
    """Which of region r's first n values an output needs (walking operands back over its columns;
    -1, 'no operand', lands on the sentinel at n)."""
    need = bytearray(n + 1)
    for v in outputs:
        need[v] = 1
    a, b, c = r.a, r.b, r.c
    ops = (tag == 0).tobytes()
    for v in range(n - 1, -1, -1):
        if need[v] and ops[v]:
            need[a[v]] = need[b[v]] = need[c[v]] = 1
    return np.frombuffer(bytes(need), dtype=np.uint8)[:n].astype(bool)


def _depths(r, tag, baked, n):
    """Each value's depth: 0 for loads and sets, one more than its deepest register operand for an
    op (so an op of constants alone is 0); -1 for baked constants and 'no operand' (the sentinel)."""
    depth = array("q", [-1]) * (n + 1)  # an array, not a list: no int object kept per value
    a, b, c = r.a, r.b, r.c
    ops, bk = (tag == 0).tobytes(), baked.tobytes()
    for v in range(n):
        if ops[v]:
            depth[v] = 1 + max(depth[a[v]], depth[b[v]], depth[c[v]])
        elif not bk[v]:
            depth[v] = 0
    return np.frombuffer(depth, dtype=np.int64, count=n).astype(np.int32)


def _allocate(cols):
    """(records, registers used): cols.rec turned in place into the interpreter's records, each
    value a register, taken when written and free again after its last reader (a record may write
    the register its operand just freed). Only the free list walks the records one by one, over
    arrays: at 2M records a list of ints per record would be ~60 MB."""
    rec = cols.rec
    t_count = len(rec)
    out, reads = rec[:, 0].copy(), rec[:, 1:]
    size = int(max(out.max(initial=-1), reads.max(initial=-1))) + 1
    last = np.full(size + 1, -1, dtype=np.int32)  # each value's last reader; [size]: 'no operand'
    when = np.arange(t_count, dtype=np.int32)
    for j in range(3):
        np.maximum.at(last, reads[:, j], when)  # -1 lands on [size]
    last = last[:size]
    read = last >= 0
    deaths = memoryview(np.bincount(last[read], minlength=t_count).astype(np.int32))  # values last read at t
    readers = np.nonzero(read)[0].astype(np.int32)
    dying = iter(memoryview(readers[np.argsort(last[readers], kind="stable")]))  # in order of their last read
    del when, readers
    never = memoryview((~read).view(np.uint8))
    del read
    reg = array("i", bytes(4 * (size + 1)))  # [size] stays 0: 'no operand' reads register 0
    free, top = [], 0
    for t, o in enumerate(memoryview(out)):
        for _ in range(deaths[t]):
            free.append(reg[next(dying)])
        if o >= 0:
            if free:
                reg[o] = free.pop()
            else:
                reg[o], top = top, top + 1
            if never[o]:  # never read (a value only a later program uses is stored)
                free.append(reg[o])
    del dying, deaths, never, last, out
    regs = np.frombuffer(reg, dtype=np.int32)
    # op: (out, a, b, c) registers; load, set: (out, f0, f1); store: (-, value, f0, f1): each
    # column rewritten in place, then patched where the form differs
    for j in range(4):
        rec[:, j] = regs[rec[:, j]]
    rows, store = cols.field_rows, cols.form[cols.field_rows] == 2
    fields, stores = rows[~store], rows[store]
    rec[fields, 1], rec[fields, 2], rec[fields, 3] = cols.f0[~store], cols.f1[~store], 0
    rec[stores, 0], rec[stores, 2], rec[stores, 3] = 0, cols.f0[store], cols.f1[store]
    cols.rec = None
    return rec, top
