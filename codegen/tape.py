"""The tape tier: a large scalar program run by a native interpreter loop, not as straight-line code.

LLVM's time on one straight-line function grows faster than the function (fastest_autograd,
n = 1,000: one 20k-node function took ~1 s of the first call's 2.7 s), and an interpreter is
compiled once for every step that uses the same ops. So a 0-d group whose Program has more
than TAPE_ENTRIES entries (or any, with BURJIT_TIER=tape) becomes a tape: records of five
int32 (opcode, out, a, b, c) in a constant of the step, run by `interpreter`:

    load   out <- *(argv[a] + b)           one opcode per dtype
    set    out <- the bits (a, b)          one opcode per dtype (constants of a region, unbaked)
    store  *(argv[b] + c) <- out's value   (a names the register stored)
    op     out <- op(a, b, c)              one opcode per (primitive, attrs, operand dtypes,
                                           constant operands); its case is the primitive's
                                           `scalar` lowering, the code straight-line code runs
    end    (opcode 0)

Constant operands are baked into their opcode, as straight-line code folds them, so both tiers
give the same bits. Registers are 8-byte slots in the arena (one region for every tape of a
step, as they run one after another), reused as soon as their value's last reader has run.
Records are ordered by (depth, opcode): a node's depth is one more than its deepest operand's,
so the order is still topological, and runs of one opcode keep the dispatch branch predicted.
The interpreter is a kernel like the others (lowering.py): its identity is its opcode table,
so it is built once per op set, compiled in the compile servers and cached on disk.
"""


import numpy as np
from llvmlite import ir

from burjit import primitives as P
from burjit.graph import tier as graph_tier

from .emitter import Emitter
from .program import const_bits
from .types import I8, I32, I64, ITEMSIZE, REG, const

TAPE_ENTRIES = 4096  # auto tier: larger 0-d Programs run on the tape (README "Compile cost")
MAX_OPCODES = 1024   # a program needing more distinct opcodes stays straight-line code
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

    def __init__(self, ops, keys):
        """ops: (depth, value id, opcode key, fields) per record, in any order; keys: opcode key
        -> the attrs its primitive's lowering takes."""
        for _, _, key, _ in ops:
            keys.setdefault(key, None)
        fits = all(0 <= f < 2 ** 31 for o in ops if o[2][0] in ("load", "store") for f in o[3])
        self.table = tuple(sorted(keys, key=repr)) if len(keys) <= MAX_OPCODES and fits else None
        if self.table is None:
            return
        self._attrs = keys
        code = {k: c + 1 for c, k in enumerate(self.table)}
        ops.sort(key=lambda o: (o[0], code[o[2]], o[1]))
        self.records, self.registers = _allocate(ops, code)

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
                key = ("op", a["op"], repr(sorted(a["attrs"].items())) if a["attrs"] else "[]", spec, a["dtype"])
                keys.setdefault(key, a["attrs"])
                value[i] = ("reg", i)
                regs = [v[1] for v in args if v[0] == "reg"]
                depth[i] = 1 + max(map(depth.__getitem__, regs), default=-1)
                ops.append((depth[i], i, key, regs))
        _stores(ops, keys, program.stores, value.__getitem__, max(depth.values(), default=0) + 1, len(entries))
        return cls(ops, keys)

    @classmethod
    def of_region(cls, ctx, node, constant, bake=True):
        """A region node (burjit/region.py): loads of its imports, the records its outputs need, a
        store of each output; ctx.ref(node) says where a graph value's bytes are. With bake=False
        (a region whose baked constants would need too many opcodes) each constant is a `set`
        record instead, its bits in the record's fields."""
        g = ctx.graph
        r, outputs = g[node]["attrs"]["region"], g[node]["attrs"]["outputs"]
        imports, names, args, attrs, dtypes = g.operands(node), r.ops, r.args, r.attrs, r.dtypes
        need, stack = bytearray(len(r)), list(outputs)
        while stack:
            v = stack.pop()
            if not need[v]:
                need[v] = 1
                if names[v] is not None:
                    stack.extend(args[v])
        baked = [None] * len(r)  # a constant value's baked form; None for a register
        depth, keys, memo, ops = [0] * len(r), {}, {}, []
        for v in range(max(outputs, default=-1) + 1):
            if not need[v]:
                continue
            op = names[v]
            if op is None:
                ref = ctx.ref(imports[args[v][0]])
                if ref[0] == "global":
                    baked[v] = _baked(dtypes[v], constant(ref[1], 0))
                else:
                    ops.append((0, v, ("load", dtypes[v]), ref[1:]))
            elif op == "const" and bake:
                baked[v] = _baked(dtypes[v], attrs[v]["value"])
            elif op == "const":
                bits = const_bits(dtypes[v], attrs[v]["value"]).ljust(8, b"\0")
                ops.append((0, v, ("set", dtypes[v]), tuple(int.from_bytes(bits[k:k + 4], "little", signed=True)
                                                             for k in (0, 4))))
            else:
                xs = args[v]
                spec = tuple(baked[a] or ("reg", dtypes[a]) for a in xs)
                sig = (op, id(attrs[v]), spec, dtypes[v])  # one opcode key object per distinct op
                key = memo.get(sig)
                if key is None:
                    key = memo[sig] = ("op", op, repr(sorted(attrs[v].items())) if attrs[v] else "[]", spec, dtypes[v])
                    keys.setdefault(key, attrs[v])
                regs = [a for a in xs if baked[a] is None]
                depth[v] = d = 1 + max([depth[a] for a in regs]) if regs else 0
                ops.append((d, v, key, regs))
        stores = [(ctx.ref(node), r.dtype, (j,), v) for j, v in enumerate(outputs)]
        _stores(ops, keys, stores, lambda v: baked[v] or ("reg", v), max(depth, default=0) + 1, len(r))
        return cls(ops, keys)

    def interpreter(self, b, argv, records, regs):
        """The loop over records, at b's position (a kernel's body: lowering returns 0 after it)."""
        fn = b.function
        e = Emitter(b)
        start = b.block
        loop, done = fn.append_basic_block("loop"), fn.append_basic_block("done")
        b.branch(loop)
        b.position_at_end(loop)
        i = b.phi(I64)
        i.add_incoming(I64(0), start)
        rec = b.gep(records, [b.mul(i, I64(5))], inbounds=True, source_etype=I32)
        opcode, out, x, y, z = [b.load(b.gep(rec, [I64(k)], inbounds=True, source_etype=I32), typ=I32)
                                for k in range(5)]
        following = fn.append_basic_block("next")
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
            if key[0] == "load":
                e.store(e.load(memory(x, y), key[1], I64(0)), reg(out), key[1], I64(0))
            elif key[0] == "set":  # the value's bits: a the low 32, b the high 32 (if 8 bytes)
                if ITEMSIZE[key[1]] == 8:
                    b.store(b.or_(b.zext(x, I64), b.shl(b.zext(y, I64), I64(32))), reg(out))
                else:
                    b.store(x, reg(out))
            elif key[0] == "store":
                e.store(e.load(reg(x), key[1], I64(0)), memory(y, z), key[1], I64(0))
            else:
                _, op, _, spec, dtype = key
                fields = iter((x, y, z))
                args = [e.load(reg(next(fields)), s[1], I64(0)) if s[0] == "reg"
                        else const(REG[s[1]], np.frombuffer(s[2], dtype=s[1])[0].item()) for s in spec]
                e.store(P.PRIMITIVES[op].scalar(e, *args, **self._attrs[key]), reg(out), dtype, I64(0))
            b.branch(following)
        b.position_at_end(following)
        i.add_incoming(b.add(i, I64(1)), following)
        b.branch(loop)
        b.position_at_end(done)


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
            key = ("op", "id", "[]", (v,), dtype)
            keys.setdefault(key, {})
            ops.append((depth, fresh + j, key, []))
            ops.append((depth + 1, -1 - j, ("store", dtype), (fresh + j,) + where))


def _allocate(ops, code):
    """(records as an int32 array ending in `end`, registers used): each value a register, freed
    after its last reader (a record may write the register its operand just freed)."""
    read = [_reads(op) for op in ops]
    last = {v: t for t, vs in enumerate(read) for v in vs}
    free, reg, top, rows = [], {}, 0, []
    for t, (_, i, key, fields) in enumerate(ops):
        vs = read[t]
        reads = [reg[v] for v in vs]
        for v in (vs if len(vs) < 2 else dict.fromkeys(vs)):  # x * x frees x once
            if last[v] == t:
                free.append(reg[v])
        if key[0] == "store":
            rows += (code[key], 0, reads[0], fields[1], fields[2])
            continue
        out = reg[i] = free.pop() if free else top
        if out == top:
            top += 1
        if i not in last:  # never read (a value only a later program uses is stored)
            free.append(out)
        if key[0] in ("load", "set"):
            rows += (code[key], out, fields[0], fields[1], 0)
        else:
            rows += [code[key], out] + reads + [0] * (3 - len(reads))
    rows += (0, 0, 0, 0, 0)
    return np.array(rows, dtype=np.int32).reshape(-1, 5), top


def _reads(op):
    """The values (entry indices) record `op` reads."""
    _, _, key, fields = op
    if key[0] in ("load", "set"):
        return ()
    if key[0] == "store":
        return (fields[0],)
    return fields
