"""The step as LLVM IR: a module for `i32 burjit_step(ptr argv)`, one for its entry, one per kernel.

argv holds the buffer pointers [inputs..., outputs..., arena]; `burjit_entry(inputs, outputs,
arena)` builds it from Python lists of numpy arrays (or numpy scalars), checking each input,
when `offsets` (abi.py) are known; it is a module of its own (entry_module), so that it is
optimised at a level of its own, as the step function is (objects.py). The step runs the
schedule's kernels in order over the memory plan (passes/memplan.py), then copies each output
to its destination, and returns 0, or 1 + i for error i of `Lowering.errors` (an index out of
range) before anything a caller can see was written:
  * index operands that are graph inputs are checked in a prologue, before any kernel runs;
  * constant index operands (const, iota, literal) are checked once at build (`static_error`);
  * computed index operands are checked by their kernel as it runs; the executable then
    restores the donated buffers listed in `backup` (those the plan updates in place).
Each distinct kernel with loops is a function in a module of its own (`kernels`: symbol -> IR
text), called from the step with buffer pointers and trip counts, so kernels compile apart, in
parallel, and are cached one by one (objects.py); its pointer parameters are `noalias` (the plan
never overlaps two values live in one kernel), which is what lets LLVM vectorise it. A kernel's
identity is what its code depends on (its programs' ops, shapes, dtypes and index forms; buffers
as parameter positions, never arena offsets), less the trip counts the step passes at run time
(each at least 1: a program's outer loop, Program.count, a product's rows or batch count, a
gather's or scatter's indices), so repeated layers, other batch sizes and other steps of the
process share one function, its IR built once. BURJIT_CHECK_KERNELS=1 builds the IR of every
call anyway and fails if two calls of one identity would emit different code (the test suite
runs so). One-element kernels (scalar graphs) are emitted straight into the step as SSA code,
or, when large (or BURJIT_TIER says), run by the tape interpreter over records the executable
holds, their address in the arena's last bytes (tape.py; `tapes`: group index -> Tape, chosen at
construction since their registers take arena bytes).
"""

import hashlib
import math
import os
from collections import Counter

import numpy as np
from llvmlite import ir

from burjit import primitives as P
from burjit.distributed import NATIVE_WORDS
from burjit.passes.memplan import ALIGN

from . import abi, kernels, loops, tape
from . import bodies as loop_bodies
from .emitter import Emitter
from .matmul import MR, matmul
from .program import Program, running_totals
from .types import I1, I8, I32, I64, assume, constant_global, declare

SYMBOL = "burjit_step"
# Programs of at most this many elements (one vector of doubles) run in the driver: a kernel
# module of its own costs ~2 ms of LLVM (~20 ms on a compile server's first job), which tiny
# vector ops (a 2-element update in a loop body, say) do not repay.
INLINE_ELEMENTS = 4
ENTRY = "burjit_entry"
PTR = ir.PointerType()
_INLINE_SOURCES = ("const", "iota")


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Lowering:
    def __init__(self, graph, poison=False, offsets=None, bodies=None):
        self.graph, self.poison, self.offsets = graph, poison, offsets
        self.bodies = bodies or {}  # loop node -> its body's Lowering (bodies.py)
        self.plan = graph.meta["memory"]
        self.schedule = graph.meta["schedule"]
        self.n_in, self.n_out = len(graph.inputs), len(graph.outputs)
        self.arena_slot = self.n_in + self.n_out
        self.errors = []         # (node, axis size, input position of the index operand or None),
                                 # or (loop node, its body's error code, "loop")
        self.static_error = None  # an IndexError message if a constant index is out of range
        self.backup = []         # donated input positions to restore when a computed index fails
        self._checks, self._fallible = [], {}
        self.kernels = self.calls = None  # once module() ran: symbol -> IR text; symbol -> calls
        self.mod = None          # the module being built (module(), entry_module())
        self.inline = 0          # once module() ran: values the step function computes itself (elements
                                 # times entries of its straight-line or inline programs, and its loop bodies')
        self.loop_errors = {}    # loop node -> the code of its body's first error here
        self._classify_indices()
        self.copies, staged_end = self._final_copies()
        self.scratch = ("arg", self.arena_slot, staged_end)  # float64 running totals of a float32 sum (program.py)
        self.scratch_bytes = _align(max((running_totals(graph, n)[2] for group in self.schedule for n in group
                                         if P.PRIMITIVES[graph[n]["op"]].kind == "reduce"), default=0))
        self.status_offset = staged_end + self.scratch_bytes
        self._programs = {}  # group index -> its plain Program, built while choosing tiers
        self.tapes = self._tapes()  # group index -> Tape, for the 0-d groups the tape tier runs
        self.tape_offset = self.status_offset + ALIGN
        self.tape_bytes = _align(max((t.registers * tape.REGISTER for t in self.tapes.values()), default=0))
        # then each loop's argv for its body and the index it passes
        self.loop_argv, at = {}, self.tape_offset + self.tape_bytes
        for n, body in self.bodies.items():
            self.loop_argv[n], at = at, at + loop_bodies.argv_bytes(body)
        # then two pointers per tape, to its records and its runs, and one per loop, to its
        # body's arena, which the executable writes once (not poisoned)
        self.records_offset = _align(at)
        self.record_slots = {gi: self.records_offset + 16 * k for k, gi in enumerate(sorted(self.tapes))}
        at = self.records_offset + 16 * len(self.tapes)
        self.loop_slots = {n: at + 8 * k for k, n in enumerate(self.bodies)}
        at += 8 * len(self.bodies)
        # then, if the step calls collectives (psum, pmean), the words distributed.NATIVE_WORDS
        # names: MPI_Allreduce's address, the communicator and the handles it takes, which the
        # executable writes once (process-local, never baked in)
        self.collectives = [n for group in self.schedule for n in group
                            if P.PRIMITIVES[graph[n]["op"]].kind == "collective"]
        self.handles_offset = at if self.collectives else None
        at += 8 * len(NATIVE_WORDS) if self.collectives else 0
        # then, per input, the addresses of its dtype and numpy scalar type, which the entry
        # checks inputs against (process-local: written by the executable, never baked in)
        self.expect_offset = _align(at)
        # then the input addresses of the last call whose donated inputs overlapped nothing
        self.verified_offset = self.expect_offset + 16 * self.n_in
        self.arena_bytes = self.verified_offset + 8 * self.n_in

    # -- buffers --------------------------------------------------------------------------------
    def ref(self, node):
        """Where node's bytes are: ('arg', slot, byte offset) or ('global', node) for a constant."""
        node, off = self._root(node)
        loc = self.plan.location.get(node)
        if loc is None:
            if self.graph[node]["op"] in ("literal",) + _INLINE_SOURCES:
                return ("global", node)
            raise ValueError(f"node %{node} ({self.graph[node]['op']}) is used outside its group but the "
                             "memory plan gives it no location")
        kind, v = loc
        if kind == "arena":
            return ("arg", self.arena_slot, v + off)
        return ("arg", v if kind == "input" else self.n_in + v, off)

    def constant_value(self, node):
        a = self.graph[node]
        return np.asarray(P.PRIMITIVES[a["op"]].ref(**a["attrs"]), dtype=a["dtype"])

    def _root(self, node):
        """(node whose bytes `node` shares, byte offset into them): itself and 0 unless a view."""
        loc = self.plan.location.get(node)
        if loc is not None and loc[0] == "view":
            return loc[1], loc[2]
        return node, 0

    # -- index checks -------------------------------------------------------------------------
    def _classify_indices(self):
        g = self.graph
        for group in self.schedule:
            for n in group:
                kind = P.PRIMITIVES[g[n]["op"]].kind
                if kind not in ("gather", "scatter"):
                    continue
                table, idx = g.operands(n)
                size = g[table]["shape"][0] if kind == "gather" else g[n]["attrs"]["n"]
                root = self._root(idx)[0]
                op = g[root]["op"]
                if op in ("literal",) + _INLINE_SOURCES:
                    values = self.constant_value(root).ravel()
                    bad = values[(values < 0) | (values >= size)]
                    if bad.size and self.static_error is None:
                        self.static_error = f"index {bad[0]} is out of range for an axis of size {size}"
                    continue
                self.errors.append((n, size, g[root]["attrs"]["index"] if op == "input" else None))
                if op == "input":
                    self._checks.append((idx, size, len(self.errors)))
                else:
                    self._fallible[n] = len(self.errors)
        for n, body in self.bodies.items():  # a body's error e is this step's loop_errors[n] + e - 1
            self.static_error = self.static_error or body.static_error
            if body.errors:
                self.loop_errors[n] = len(self.errors) + 1
                self.errors += [(n, e, "loop") for e in range(1, len(body.errors) + 1)]
                self._fallible[n] = self.loop_errors[n]
            else:
                self.loop_errors[n] = 1  # never returned: the body cannot fail
        if self._fallible:
            self.backup = sorted({loc[1] for n, loc in self.plan.location.items()
                                  if loc[0] == "input" and g[n]["op"] != "input"})

    # -- final copies ---------------------------------------------------------------------------
    def _final_copies(self):
        """[(source ref or node to fill, destination ref, node)] and the arena size with staging.

        A source that is a donated input some other copy overwrites is first staged in extra
        arena bytes after the plan's, so copies in any order read the old values.
        """
        g = self.graph
        copies, dests = [], set()
        for j, n in enumerate(g.outputs):
            dst = ("arg", g.aliases[j] if j in g.aliases else self.n_in + j, 0)
            src = None if g[n]["op"] in _INLINE_SOURCES else self.ref(n)
            if src != dst:
                copies.append([src, dst, n])
                dests.add(dst)
        offset = start = _align(self.plan.arena_bytes)
        staged = []
        for c in copies:
            if c[0] in dests:
                staged.append((c[0], ("arg", self.arena_slot, offset), c[2]))
                c[0] = staged[-1][1]
                offset += _align(g.nbytes(c[2]))
        self._staged, self.staging_bytes = staged, offset - start
        return [tuple(c) for c in copies], offset

    # -- emission -------------------------------------------------------------------------------
    def module(self, triple="", data_layout="", on_kernel=None, symbol=SYMBOL, into=None):
        """The step's module, its step function named `symbol` (added to module `into` if given:
        a loop body's, bodies.py); on_kernel(symbol, IR text) is called for each distinct kernel
        as soon as it exists (native.py starts compiling it then). The entry is a module of its
        own (entry_module)."""
        self.mod = into if into is not None else _module("burjit_step", (triple, data_layout))
        self._on_kernel, self.symbol = on_kernel, symbol
        self._globals, self._target = {}, (triple, data_layout)
        self.kernels, self.calls = {}, Counter()
        self._check = os.environ.get("BURJIT_CHECK_KERNELS") == "1"
        fn = ir.Function(self.mod, ir.FunctionType(I32, [PTR]), name=symbol)
        if into is not None:
            fn.linkage = "internal"  # a loop body: only its driver calls it (and may inline it)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        self._argv = argv = fn.args[0]
        self._slots = [b.load(b.gep(argv, [I64(k)], inbounds=True, source_etype=PTR), typ=PTR)
                       for k in range(self.arena_slot + 1)]
        for idx, size, code in self._checks:
            self._emit_check(b, idx, size, code)
        if self.poison:
            self._memset(b, self._slots[self.arena_slot], self.records_offset)
        for gi, group in enumerate(self.schedule):
            self._group(b, gi, group)
        for src, dst, n in self._staged:
            self._memcpy(b, self._main_ptr(b, dst), self._main_ptr(b, src), self.graph.nbytes(n))
        for src, dst, n in self.copies:
            if src is None:
                p = Program(self, self.graph[n]["shape"])
                p.store(dst, self.graph[n]["dtype"], p.value(n))
                self._run(b, [p])  # one per destination: outputs may repeat a node
            else:
                self._memcpy(b, self._main_ptr(b, dst), self._main_ptr(b, src), self.graph.nbytes(n))
        b.ret(I32(0))
        return self.mod

    def entry_module(self, triple="", data_layout=""):
        """The entry's module (None without object layouts), optimised at a level of its own
        (objects.ENTRY) and linked with the step function's."""
        if not self.offsets:
            return None
        step, self.mod = self.mod, _module("burjit_entry", (triple, data_layout))
        try:  # _entry's helpers build into self.mod
            self._entry(declare(self.mod, SYMBOL, I32, [PTR]))
            return self.mod
        finally:
            self.mod = step

    def _entry(self, step):
        """`burjit_entry(self, args, nargs)`, a METH_FASTCALL builtin called with (inputs, outputs,
        arena): argv from the lists' objects; returns the outputs list, or on an error the inputs
        list with the code stored at `status_offset` of the arena, or the arena if an input is
        not what the step was built for (a new reference each time). An input must be an exact
        ndarray of its shape and dtype, C-contiguous, writable and overlapping no other input if
        donated; or, if 0-d and not donated, a numpy scalar of its dtype, read in place."""
        at, g = self.offsets, self.graph
        fn = ir.Function(self.mod, ir.FunctionType(PTR, [PTR, PTR, I64]), name=ENTRY)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        args = [b.load(b.gep(fn.args[1], [I64(k)], source_etype=PTR), typ=PTR) for k in range(3)]

        def field(obj, offset, typ=PTR):
            return b.load(b.gep(obj, [I64(offset)], source_etype=I8), typ=typ)
        arena = field(args[2], at.array_data)
        mismatch, fails = fn.append_basic_block("mismatch"), []  # fails: the blocks branching there

        def check(cond, then):
            b.cbranch(cond, then, mismatch)
            fails.append(b.block)
        donated = set(g.meta.get("donated", ()))
        argv = b.alloca(PTR, size=I64(self.arena_slot + 1))
        if g.inputs:
            self._input_checks(b, args, argv, donated, field, check)
        if donated:
            self._overlaps(b, argv, arena, sorted(donated), check)
        outs = field(args[1], at.list_items)
        for j in range(self.n_out):
            b.store(field(b.load(b.gep(outs, [I64(j)], source_etype=PTR), typ=PTR), at.array_data),
                    b.gep(argv, [I64(self.n_in + j)], source_etype=PTR))
        b.store(arena, b.gep(argv, [I64(self.arena_slot)], source_etype=PTR))
        rc = b.call(step, [argv])
        failed = b.icmp_unsigned("!=", rc, I32(0))
        with b.if_then(failed):
            b.store(rc, b.gep(arena, [I64(self.status_offset)], source_etype=I8))
        result = b.select(failed, args[0], args[1])
        done = b.block
        b.branch(mismatch)
        b.position_at_end(mismatch)
        back = b.phi(PTR)
        back.add_incoming(result, done)
        for pred in fails:
            back.add_incoming(args[2], pred)
        b.store(b.add(b.load(back, typ=I64), I64(1)), back)  # Py_INCREF (lists and the arena are never immortal)
        b.ret(back)

    def _input_checks(self, b, args, argv, donated, field, check):
        """argv[k] <- input k's data (or a numpy scalar's value), in one loop over the inputs
        against constant tables of what each must be: code that does not grow with the inputs
        (a GPT's 74 unrolled cost 18 KB of object code and 50 ms of LLVM)."""
        at, g, fn = self.offsets, self.graph, b.function
        shapes = [g[n]["shape"] for n in g.inputs]
        starts = np.cumsum([0] + [len(sh) for sh in shapes])
        table = {"ndim": [len(sh) for sh in shapes], "start": starts[:-1],
                 "need": [abi.C_CONTIGUOUS | (abi.WRITEABLE if k in donated else 0) for k in range(len(shapes))],
                 "scalar": [int(sh == () and k not in donated) for k, sh in enumerate(shapes)],
                 "dims": [n for sh in shapes for n in sh]}
        tables = {name: constant_global(self.mod, f"input_{name}", np.asarray(v, np.int64).tobytes(), 8)
                  for name, v in table.items()}

        def entry(name, k):
            return b.load(b.gep(tables[name], [k], source_etype=I64), typ=I64)
        names = ("loop", "array", "scalar", "dims", "dim", "ok", "next", "done")
        loop, array, scalar, dims, dim, ok, following, done = (fn.append_basic_block(f"inputs_{x}") for x in names)
        start = b.block
        b.branch(loop)
        b.position_at_end(loop)
        k = b.phi(I64)
        k.add_incoming(I64(0), start)
        obj = b.load(b.gep(field(args[0], at.list_items), [k], source_etype=PTR), typ=PTR)
        expect = b.gep(field(args[2], at.array_data), [b.add(b.mul(k, I64(16)), I64(self.expect_offset))],
                       source_etype=I8)
        kind = field(obj, at.ob_type)
        b.cbranch(b.icmp_unsigned("==", kind, field(args[2], at.ob_type)), array, scalar)
        b.position_at_end(scalar)  # a numpy scalar of the dtype, where 0-d and not donated
        value = b.gep(obj, [I64(at.scalar_value)], source_etype=I8)
        check(b.and_(b.icmp_unsigned("!=", entry("scalar", k), I64(0)),
                     b.icmp_unsigned("==", kind, field(expect, 8))), ok)
        b.position_at_end(array)  # an exact ndarray: rank, C order (writable if donated), dtype
        need, ndim = entry("need", k), entry("ndim", k)
        flags = b.zext(field(obj, at.array_flags, I32), I64)
        check(b.and_(b.and_(b.icmp_unsigned("==", b.zext(field(obj, at.array_nd, I32), I64), ndim),
                            b.icmp_unsigned("==", b.and_(flags, need), need)),
                     b.icmp_unsigned("==", field(obj, at.array_descr), b.load(expect, typ=PTR))), dims)
        b.position_at_end(dims)  # then each dimension
        data, extents, first = field(obj, at.array_data), field(obj, at.array_dims), entry("start", k)
        b.cbranch(b.icmp_unsigned("==", ndim, I64(0)), ok, dim)
        b.position_at_end(dim)
        d = b.phi(I64)
        d.add_incoming(I64(0), dims)
        same = b.icmp_unsigned("==", b.load(b.gep(extents, [d], source_etype=I64), typ=I64),
                               entry("dims", b.add(first, d)))
        more = b.add(d, I64(1))
        d.add_incoming(more, following)
        check(same, following)
        b.position_at_end(following)
        b.cbranch(b.icmp_unsigned("<", more, ndim), dim, ok)
        b.position_at_end(ok)
        ptr = b.phi(PTR)
        ptr.add_incoming(value, scalar)
        ptr.add_incoming(data, dims)
        ptr.add_incoming(data, following)
        b.store(ptr, b.gep(argv, [k], source_etype=PTR))
        step = b.add(k, I64(1))
        k.add_incoming(step, ok)
        b.cbranch(b.icmp_unsigned("<", step, I64(len(shapes))), loop, done)
        b.position_at_end(done)

    def _overlaps(self, b, argv, arena, donated, check):
        """check(cond, then) fails if a donated input's bytes overlap another input's (views are
        caught, not just repeats). The inputs' addresses of the last call that passed are kept
        in the arena: where every donated input is where it was (a training loop passes back
        the parameters it was given), only the inputs that moved are compared with the donated
        ones, else every (donated, input) pair is."""
        g, fn = self.graph, b.function
        n = len(g.inputs)
        others = [k for k in range(n) if k not in set(donated)]
        sizes, which, rest = (constant_global(self.mod, name, np.asarray(values, np.int64).tobytes(), 8)
                              for name, values in (("input_bytes", [g.nbytes(x) for x in g.inputs]),
                                                   ("donated_inputs", donated), ("other_inputs", others or [0])))
        verified = b.gep(arena, [I64(self.verified_offset)], source_etype=I8)

        def item(table, i, typ=I64):
            return b.load(b.gep(table, [i], source_etype=typ), typ=typ)

        def span(k):
            lo = b.ptrtoint(item(argv, k, PTR), I64)
            return lo, b.add(lo, item(sizes, k))

        def meet(x, y):  # the byte ranges of inputs x and y overlap
            (lo_x, hi_x), (lo_y, hi_y) = span(x), span(y)
            return b.and_(b.icmp_unsigned("<", lo_x, hi_y), b.icmp_unsigned("<", lo_y, hi_x))

        def any_of(count, flag):  # flag(i) for some i < count
            return loops.nest(b, [count], lambda idx, acc: [b.or_(acc[0], flag(idx[0]))], [I1(0)])[0]

        def moved(table, i):  # input table[i] is not where the last verified call had it
            k = item(table, i)
            return b.icmp_unsigned("!=", b.ptrtoint(item(argv, k, PTR), I64), b.ptrtoint(item(verified, k, PTR), I64))

        def clashes(k):  # donated input k overlaps another input
            return any_of(n, lambda j: b.and_(b.icmp_unsigned("!=", j, k), meet(j, k)))
        full, partial, done = (fn.append_basic_block(f"overlap_{x}") for x in ("full", "partial", "done"))
        b.cbranch(any_of(len(donated), lambda i: moved(which, i)), full, partial)
        b.position_at_end(full)
        check(b.not_(any_of(len(donated), lambda d: clashes(item(which, d)))), done)
        b.position_at_end(partial)
        if others:
            def moved_and_clashes(i):  # a non-donated input that moved overlaps a donated one
                j, was = item(rest, i), b.block
                clash, after = fn.append_basic_block("overlap_moved"), fn.append_basic_block("overlap_kept")
                b.cbranch(moved(rest, i), clash, after)
                b.position_at_end(clash)
                found = any_of(len(donated), lambda d: meet(j, item(which, d)))
                end = b.block
                b.branch(after)
                b.position_at_end(after)
                result = b.phi(I1)
                result.add_incoming(I1(0), was)
                result.add_incoming(found, end)
                return result
            check(b.not_(any_of(len(others), moved_and_clashes)), done)
        else:
            b.branch(done)
        b.position_at_end(done)
        self._memcpy(b, verified, argv, 8 * n)  # verified: these addresses overlap as checked

    def _main_ptr(self, b, ref):
        if ref[0] == "global":
            return self._global(ref[1])
        _, slot, off = ref
        return b.gep(self._slots[slot], [I64(off)], inbounds=True, source_etype=I8) if off else self._slots[slot]

    def _global(self, node):
        gv = self._globals.get(node)
        if gv is None:
            gv = self._globals[node] = constant_global(
                self.mod, f"{self.symbol}_const{node}", np.ascontiguousarray(self.constant_value(node)).tobytes(), ALIGN)
        return gv

    def _memcpy(self, b, dst, src, n):
        if n:
            fn = declare(self.mod, "llvm.memcpy.p0.p0.i64", ir.VoidType(), [PTR, PTR, I64, I1])
            b.call(fn, [dst, src, I64(n), I1(0)])

    def _memset(self, b, dst, n):
        if n:
            fn = declare(self.mod, "llvm.memset.p0.i64", ir.VoidType(), [PTR, I8, I64, I1])
            b.call(fn, [dst, I8(0xFF), I64(n), I1(0)])  # all-ones bytes: NaN as floats, -1 as ints

    def _fail_if(self, b, cond, code):
        """Return `code` (an int or an i32 value) from the current function when cond holds."""
        bad = b.append_basic_block("bad")
        ok = b.append_basic_block("ok")
        b.cbranch(cond, bad, ok)
        b.position_at_end(bad)
        b.ret(code if isinstance(code, ir.Value) else I32(code))
        b.position_at_end(ok)

    def _emit_check(self, b, idx, size, code):
        """Return `code` unless every element of index operand idx is in [0, size)."""
        g = self.graph
        dtype = g[idx]["dtype"]
        count = math.prod(g[idx]["shape"])
        if not count:
            return
        base = self._main_ptr(b, self.ref(idx))
        e = Emitter(b)

        def any_bad(i, acc):
            v = e.cast(e.load(base, dtype, i[0]), "int64")
            return [b.or_(acc[0], b.or_(b.icmp_signed("<", v, I64(0)), b.icmp_signed(">=", v, I64(size))))]
        bad = loops.nest(b, [count], any_bad, [I1(0)])[0]
        self._fail_if(b, bad, code)

    def _located(self, group):
        return [n for n in group if n in self.plan.location and self.plan.location[n][0] != "view"]

    def _plain(self, group):
        """Whether group is elementwise work alone (no reduction, matmul, gather, scatter, pad,
        concatenate, loop or bitcast): one _plain_program."""
        g, head = self.graph, self.graph[group[-1]]
        return (P.PRIMITIVES[head["op"]].kind not in ("matmul", "gather", "scatter", "loop", "bitcast", "collective")
                and head["op"] not in ("pad", "concatenate")
                and all(P.PRIMITIVES[g[n]["op"]].kind != "reduce" for n in group))

    def _plain_program(self, group):
        """The Program of a plain group: it stores each of its values the plan gives a place."""
        g, located = self.graph, self._located(group)
        p = Program(self, g[group[-1]]["shape"], group)
        for n in located:
            p.store(self.ref(n), g[n]["dtype"], p.value(n))
        return p

    def _tapes(self):
        which, found = tape.tier(self.graph), {}
        constant = lambda node, k: self.constant_value(node).ravel()[k].item()  # noqa: E731
        for gi, group in enumerate(self.schedule):
            if self.graph[group[-1]]["op"] == "region":
                t = tape.Tape.of_region(self, group[-1], constant)
                if t.table is None:  # too many distinct constants to bake: set them at run time
                    t = tape.Tape.of_region(self, group[-1], constant, bake=False)
                if t.table is None:
                    raise ValueError(f"a scalar region needs more than {tape.MAX_OPCODES} opcodes or an arena "
                                     "offset past 2 GiB; run it with tier='straight'")
                found[gi] = t
                continue
            if which == "straight" or self.graph[group[-1]]["shape"] != () or not self._located(group) \
                    or not self._plain(group):
                continue
            p = self._plain_program(group)
            t = tape.Tape.of_program(p, constant) if tape.wanted(p, which) else None
            if t is not None and t.table is not None:
                found[gi] = t
            else:
                self._programs[gi] = p  # built once: emission takes it
        return found

    def _group(self, b, gi, group):
        g = self.graph
        located = self._located(group)
        if not located:
            return  # views (no-op reshapes) and dead groups
        if self.poison:
            for n in located:
                kind, off = self.plan.location[n]
                if kind == "arena":
                    self._memset(b, self._main_ptr(b, ("arg", self.arena_slot, off)), g.nbytes(n))
        reduce = [n for n in group if P.PRIMITIVES[g[n]["op"]].kind == "reduce"]
        head = group[-1]
        a = g[head]
        kind = P.PRIMITIVES[a["op"]].kind
        if gi in self.tapes:
            self._run_tape(b, gi, self.tapes[gi])
        elif kind == "loop":
            loop_bodies.emit(self, b, head)
        elif kind == "collective":
            self._allreduce(b, head)
        elif kind == "bitcast":  # a loop's packed leaf: its bytes copied out (burjit/control.py)
            (vec,) = g.operands(head)
            src = b.gep(self._main_ptr(b, self.ref(vec)), [I64(8 * a["attrs"]["start"])], source_etype=I8)
            self._memcpy(b, self._main_ptr(b, self.ref(head)), src, g.nbytes(head))
        elif self._plain(group):
            self._run(b, [self._programs.pop(gi, None) or self._plain_program(group)])
        elif reduce:
            (r,) = reduce
            (x,) = g.operands(r)
            p = Program(self, g[x]["shape"], group)
            for n in located:
                if n != r:
                    p.store(self.ref(n), g[n]["dtype"], p.value(n))
            p.reduce(r, p.value(x))
            self._run(b, [p])
        elif kind == "matmul":
            x, y = g.operands(head)
            batch = math.prod(a["shape"][:-2])
            M, N, K = a["shape"][-2], a["shape"][-1], g[x]["shape"][-1]
            refs = [self.ref(x), self.ref(y), self.ref(head)]
            # the size a batch reaches, passed at run time: the count of a batched product (attention's
            # per-head ones), or the rows of a single one, if at least MR (activations times weights).
            # Weight gradients contract over the batch, but a run-time K cost BurTorch's GPT steps 2-4%
            given = None if not (batch and M and N) else "batch" if batch > 1 else "M" if M >= MR else None

            def emit(kb, ptr, n):
                matmul(kb, [ptr(r) for r in refs], a["dtype"], n[0] if given == "batch" else batch,
                       n[0] if given == "M" else M, K, N)
            self._kernel(b, refs, emit, False,
                         lambda slot: ("matmul", a["dtype"], None if given == "batch" else batch,
                                       None if given == "M" else M, K, N, tuple(map(slot, refs))),
                         [batch] if given == "batch" else [M] if given == "M" else [])
        elif kind in ("gather", "scatter"):
            data, idx = g.operands(head)
            refs = [self.ref(data), self.ref(idx), self.ref(head)]
            count = math.prod(g[idx]["shape"])
            row_len = math.prod(g[data]["shape"][1 if kind == "gather" else len(g[idx]["shape"]):])
            size = g[data]["shape"][0] if kind == "gather" else a["attrs"]["n"]
            emit = kernels.take if kind == "gather" else kernels.scatter_add
            code = self._fallible.get(head)
            counts = [count] if count > 1 and row_len else []
            self._kernel(b, refs, lambda kb, ptr, n: emit(
                kb, [ptr(r) for r in refs], a["dtype"], g[idx]["dtype"], *n or [count], row_len, size,
                None if code is None else (lambda cb, cond: self._fail_if(cb, cond, code))), code is not None,
                lambda slot: (kind, a["dtype"], g[idx]["dtype"], None if counts else count, row_len, size, code,
                              tuple(map(slot, refs))), counts)
        elif a["op"] == "pad":
            self._run(b, kernels.pad_programs(self, head))
        else:  # concatenate
            self._run(b, kernels.concatenate_programs(self, head))

    def _allreduce(self, b, node):
        """MPI_Allreduce(operand, node, count, its datatype, MPI_SUM, communicator): a call through
        the words at handles_offset. Handles are ints under MPICH and pointers under Open MPI;
        both pass as 64-bit words (the callee reads an int's low half of the register)."""
        (x,) = self.graph.operands(node)
        a = self.graph[node]
        count = math.prod(a["shape"])
        if not count:
            return

        def word(name):
            at = self.handles_offset + 8 * NATIVE_WORDS.index(name)
            return b.load(self._main_ptr(b, ("arg", self.arena_slot, at)), typ=I64)
        mpi_allreduce = ir.FunctionType(I32, [PTR, PTR, I32, I64, I64, I64]).as_pointer()
        b.call(b.inttoptr(word("MPI_Allreduce"), mpi_allreduce),
               [self._main_ptr(b, self.ref(x)), self._main_ptr(b, self.ref(node)), I32(count), word(a["dtype"]),
                word("MPI_SUM"), word("comm")])

    def _run(self, b, programs):
        """Emit Programs: inline when each has at most INLINE_ELEMENTS elements (straight-line
        code, or a loop of a few trips in the driver), else as a kernel."""
        if all(math.prod(p.domain) <= INLINE_ELEMENTS for p in programs):
            self.inline += sum(math.prod(p.domain) * len(p.entries) for p in programs)
            for p in programs:
                p.emit(b, lambda r: self._main_ptr(b, r))
            return
        refs = [r for p in programs for r in p.refs()]
        counts = [p.count() for p in programs]

        def emit(kb, ptr, n):
            n = iter(n)
            for p, c in zip(programs, counts):
                p.emit(kb, ptr, None if c is None else next(n))
        self._kernel(b, refs, emit, False, lambda slot: ("programs", tuple(p.signature(slot) for p in programs)),
                     [c[0] for c in counts if c is not None])

    def _run_tape(self, b, gi, t):
        """Run tape t: its records' and runs' addresses and its registers in the arena (tape.py).
        The records stay out of the IR: a 10^6-record tape is 16 MB, 60 MB as IR text for LLVM."""
        records, runs = (b.load(self._main_ptr(b, ("arg", self.arena_slot, self.record_slots[gi] + k)), typ=PTR)
                         for k in (0, 8))
        symbol = self._function((("tape", t.per_run, t.table), self._target), [PTR] * 4,
                                lambda kb, params: t.interpreter(kb, *params))
        regs = self._main_ptr(b, ("arg", self.arena_slot, self.tape_offset))
        b.call(declare(self.mod, symbol, I32, [PTR] * 4), [self._argv, records, runs, regs])

    def _kernel(self, b, refs, body, fallible, describe, counts=()):
        """Call the kernel body(builder, ptr, n) over one noalias pointer per distinct buffer of
        `refs`, then one i64 per trip count in `counts`, which body gets as values `n`.

        describe(slot) -> the kernel's identity, given each buffer's parameter position slot(ref)
        and leaving the counts out: calls of one identity share one function, whose IR is built
        on the first call alone, so counts passed at run time let batch sizes share kernels.
        Kernels stay out of line: inlining hundreds of vectorised loop nests into the step
        doubled O3 time (GPT test model: 9 s -> 4.6 s first call) for no measurable gain."""
        uniq = list(dict.fromkeys(refs))
        slots = {r: k for k, r in enumerate(uniq)}
        params = [PTR] * len(uniq) + [I64] * len(counts)
        symbol = self._function((describe(slots.__getitem__), self._target), params,
                                lambda kb, args: body(kb, dict(zip(uniq, args)).__getitem__, args[len(uniq):]))
        rc = b.call(declare(self.mod, symbol, I32, params),
                    [self._main_ptr(b, r) for r in uniq] + [I64(c) for c in counts])
        if fallible:
            self._fail_if(b, b.icmp_unsigned("!=", rc, I32(0)), rc)

    def _function(self, identity, params, body):
        """The symbol of the kernel `identity` stands for, its module built by body(builder,
        args) on its first call in this process; counted as one more call."""
        known = _KNOWN.get(identity)
        if known is None or self._check:
            built = self._kernel_module(params, body)
            if known is not None and known != built:
                raise AssertionError(f"kernel identity {identity!r} stands for two different kernels")
            known = _remember(identity, built)
        self.add_kernel(*known)
        return known[0]

    def add_kernel(self, symbol, text, calls=1):
        """Count `calls` more calls of kernel `symbol` (this step's, or a loop body's: bodies.py),
        handing its IR text on at the first."""
        if symbol not in self.kernels:
            self.kernels[symbol] = text
            if self._on_kernel:
                self._on_kernel(symbol, text)
        self.calls[symbol] += calls

    def _kernel_module(self, params, body):
        """(symbol, IR text) of a module holding one kernel `i32 symbol(params)`, its pointers
        noalias; the symbol is named for a hash of the text, so equal code is one symbol everywhere."""
        mod = _module("kernel", self._target)
        fn = ir.Function(mod, ir.FunctionType(I32, params), name="kernel")
        for arg in fn.args:
            if arg.type == PTR:
                arg.add_attribute("noalias")
        kb = ir.IRBuilder(fn.append_basic_block("entry"))
        for arg in fn.args:
            if arg.type == I64:  # a trip count, at least 1
                assume(kb, kb.icmp_unsigned("!=", arg, I64(0)))
        body(kb, fn.args)
        kb.ret(I32(0))
        text = str(mod)
        symbol = "burjit_k" + hashlib.sha256(text.encode()).hexdigest()[:32]
        return symbol, text.replace('@"kernel"', f'@"{symbol}"', 1)


def _module(name, target):
    mod = ir.Module(name=name)
    mod.triple, mod.data_layout = target
    return mod


_KNOWN = {}  # kernel identity -> (symbol, IR text), for every step this process lowers
_KNOWN_MAX = 4096


def _remember(identity, built):
    """Keep identity -> built (the oldest entries go past _KNOWN_MAX, so memory stays bounded)."""
    if len(_KNOWN) >= _KNOWN_MAX:
        del _KNOWN[next(iter(_KNOWN))]
    return _KNOWN.setdefault(identity, built)
