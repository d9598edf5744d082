"""The planned step as MLIR text, in upstream dialects only (func, arith, math, memref, linalg, scf).

One `func.func @step` over the native step's buffers: each input, each output, the arena as
one byte memref whose values are `memref.view`s at the planned offsets (views of another value
are `memref.reinterpret_cast`s of its buffer), and a status word: a gather or scatter index out
of range reads or writes row 0 instead and leaves the status naming that op, for the caller to
raise. Kernels follow the schedule, one per fusion
group: an elementwise group, or a reduction with its prologue, is one `linalg.generic` whose
body is the registry's `scalar` rules run against `Scalar`, the MLIR scalar emitter below (the
same rules the LLVM emitter runs: no second copy of an op); matmul is `linalg.matmul` or
`linalg.batch_matmul`, transpose `linalg.transpose`, slices and gathers `linalg.generic`s with
affine or loaded indices, scatter_add an `scf.for` nest. Ops carry `loc` attributes with the
user's file:line. A loop's body is a private function of its own, called from an `scf.for`
or `scf.while` (`_loop`); an allreduce an external call of `MPI_Allreduce`; a scalar region
(the tape tier) straight-line scalar code. Values are stored as the native step stores them:
bool as i8.
"""

import struct

import numpy as np

from burjit import primitives as P
from burjit.passes import pipeline
from burjit.records import CONST, IMPORT, KINDS
from burjit.passes.memplan import ALIGN

from .types import ITEMSIZE

TYPE = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64", "bool": "i1"}
STORED = dict(TYPE, bool="i8")
_FCMP = {"<": "olt", "<=": "ole", ">": "ogt", ">=": "oge", "==": "oeq", "!=": "une"}
_ICMP = {"<": "slt", "<=": "sle", ">": "sgt", ">=": "sge", "==": "eq", "!=": "ne"}
PARALLEL = '"parallel"'
WORDS = "burjit_mpi_words"  # a step's MPI handles (distributed.NATIVE_WORDS), written after loading
ARENA = "memref<?xi8>"  # the step's arena: its size is the plan's plus what its loops reserve
_UCMP = dict(_ICMP, **{"<": "ult", "<=": "ule", ">": "ugt", ">=": "uge"})


class V(str):
    """An SSA value: its name, with its MLIR scalar type in `.type`."""

    def __new__(cls, name, typ):
        v = super().__new__(cls, name)
        v.type = typ
        return v


def _float(t):
    return t in ("f32", "f64")


def constant_text(value, typ):
    """An arith.constant's attribute, exact: floats by their bit pattern."""
    if typ == "i1":
        return "true" if value else "false"
    if _float(typ):
        bits = struct.unpack("<Q", struct.pack("<d", float(value)))[0] if typ == "f64" else \
            struct.unpack("<I", struct.pack("<f", np.float32(value)))[0]
        return f"0x{bits:0{16 if typ == 'f64' else 8}X} : {typ}"
    return f"{int(value)} : {typ}"


class Scalar:
    """The scalar emitter (primitives.py names its methods) writing MLIR lines into `lines`."""

    def __init__(self, lines, names, loc=""):
        self.lines, self.names, self.loc = lines, names, loc

    def op(self, text, typ):
        v = V(f"%s{next(self.names)}", typ)
        self.lines.append(f"{v} = {text}{self.loc}")
        return v

    def _bin(self, fop, iop, x, y):
        return self.op(f"arith.{fop if _float(x.type) else iop} {x}, {y} : {x.type}", x.type)

    def add(self, x, y):
        return self._bin("addf", "addi", x, y)

    def sub(self, x, y):
        return self._bin("subf", "subi", x, y)

    def mul(self, x, y):
        return self._bin("mulf", "muli", x, y)

    def div(self, x, y):
        return self._bin("divf", "divsi", x, y)

    def max(self, x, y):
        return self._bin("maximumf", "maxsi", x, y)  # maximumf propagates NaN, as numpy does

    def min(self, x, y):
        return self._bin("minimumf", "minsi", x, y)

    def neg(self, x):
        if _float(x.type):
            return self.op(f"arith.negf {x} : {x.type}", x.type)
        return self.sub(self.const(0, x), x)

    def _math(self, name, x):
        return self.op(f"math.{name} {x} : {x.type}", x.type)

    def abs(self, x):
        return self._math("absf" if _float(x.type) else "absi", x)

    def sqrt(self, x):
        return self._math("sqrt", x)

    def exp(self, x):
        return self._math("exp", x)

    def log(self, x):
        return self._math("log", x)

    def log1p(self, x):
        return self._math("log1p", x)

    def tanh(self, x):
        return self._math("tanh", x)

    def cos(self, x):
        return self._math("cos", x)

    def sin(self, x):
        return self._math("sin", x)

    def pow(self, x, y):
        return self.op(f"math.powf {x}, {y} : {x.type}", x.type)

    def cmp(self, pred, x, y):
        if _float(x.type):
            return self.op(f"arith.cmpf {_FCMP[pred]}, {x}, {y} : {x.type}", "i1")
        return self.op(f"arith.cmpi {(_UCMP if x.type == 'i1' else _ICMP)[pred]}, {x}, {y} : {x.type}", "i1")

    def select(self, c, x, y):
        return self.op(f"arith.select {c}, {x}, {y} : {x.type}", x.type)

    def and_(self, x, y):
        return self.op(f"arith.andi {x}, {y} : i1", "i1")

    def or_(self, x, y):
        return self.op(f"arith.ori {x}, {y} : i1", "i1")

    def not_(self, x):
        return self.op(f"arith.xori {x}, {self.const(True, x)} : i1", "i1")

    def xor(self, x, y):
        return self.op(f"arith.xori {x}, {y} : {x.type}", x.type)

    def shl(self, x, y):
        return self.op(f"arith.shli {x}, {y} : {x.type}", x.type)

    def lshr(self, x, y):
        return self.op(f"arith.shrui {x}, {y} : {x.type}", x.type)

    def const(self, value, like):
        return self.constant(value, like.type)

    def constant(self, value, typ):
        return self.op(f"arith.constant {constant_text(value, typ)}", typ)

    def cast(self, x, dtype):
        src, dst = x.type, TYPE[dtype]
        if src == dst:
            return x
        if dst == "i1":
            return self.cmp("!=", x, self.constant(0, src))
        if _float(dst):
            if _float(src):
                return self.op(f"arith.{'extf' if src == 'f32' else 'truncf'} {x} : {src} to {dst}", dst)
            return self.op(f"arith.{'uitofp' if src == 'i1' else 'sitofp'} {x} : {src} to {dst}", dst)
        if _float(src):  # out of range and NaN give INT_MIN, as numpy does on x86 (as emitter.py)
            width = int(dst[1:])
            fits = self.and_(self.cmp(">=", x, self.constant(-2.0 ** (width - 1), src)),
                             self.cmp("<", x, self.constant(2.0 ** (width - 1), src)))
            return self.select(fits, self.op(f"arith.fptosi {x} : {src} to {dst}", dst),
                               self.constant(-(1 << (width - 1)), dst))
        if src == "i1":
            return self.op(f"arith.extui {x} : i1 to {dst}", dst)
        return self.op(f"arith.{'extsi' if int(src[1:]) < int(dst[1:]) else 'trunci'} {x} : {src} to {dst}", dst)

    def index(self, dim):
        return self.op(f"linalg.index {dim} : index", "index")

    def load(self, stored, dtype):
        """A value read from memory as the register type of dtype (bool: i8 -> i1)."""
        return self.op(f"arith.trunci {stored} : i8 to i1", "i1") if dtype == "bool" else stored

    def store(self, value, dtype):
        return self.op(f"arith.extui {value} : i1 to i8", "i8") if dtype == "bool" else value


def memref_type(shape, dtype, strides=None, offset=0):
    dims = "".join(f"{s}x" for s in shape)
    layout = "" if strides is None else f", strided<[{', '.join(map(str, strides))}], offset: {offset}>"
    return f"memref<{dims}{STORED[dtype]}{layout}>"


def _contiguous(shape):
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]


class Buffer:
    """A value in memory: its SSA name, type and dtype; the buffer it views (`root`, itself if
    none), where it starts in that buffer and its strides, in elements; `arena_byte`, where it
    starts in the arena if it lives there (None for the caller's buffers and stack values)."""

    def __init__(self, name, typ, dtype, root=None, offset=0, strides=None, arena_byte=None):
        self.name, self.type, self.dtype, self.offset, self.strides = name, typ, dtype, offset, strides
        self.root = root or self
        self.arena_byte = arena_byte


def _operands(buffers):
    """`%a, %b : type_a, type_b`, as linalg's ins(...) and outs(...) take them."""
    return f"{', '.join(b.name for b in buffers)} : {', '.join(b.type for b in buffers)}"


def _loc(src):
    if not src or ":" not in src:
        return ""
    path, _, line = src.rpartition(":")
    return f' loc("{path}":{line}:0)' if line.isdigit() else ""


def _map(rank, exprs):
    dims = ", ".join(f"d{i}" for i in range(rank))
    return f"affine_map<({dims}) -> ({', '.join(exprs)})>"


def _align(n):
    return -(-n // ALIGN) * ALIGN


class Emitter:
    """One graph's function. A loop body's Emitter (`parent` given) shares the module's globals,
    functions, SSA names and error list with the step's."""

    def __init__(self, graph, name="step", parent=None):
        self.g, self.name = graph, name
        self.plan = graph.meta["memory"]
        self.lines, self.buffers = [], {}
        self.ranks = None
        if parent is None:
            self.globals, self.functions, self.errors, self.names = [], [], [], iter(range(1 << 40))
        else:
            self.globals, self.functions, self.errors, self.names = (parent.globals, parent.functions, parent.errors,
                                                                     parent.names)
        self.loops = parent.loops if parent else ()  # the srcs of the loops this graph's function runs in
        self.top = _align(self.plan.arena_bytes)  # the arena beyond the plan: what loops need (`reserve`)

    def fresh(self, prefix="v"):
        return f"%{prefix}{next(self.names)}"

    def emit(self, line, src=None):
        self.lines.append(f"    {line}{_loc(src)}")

    def index(self, value):
        v = self.fresh("c")
        self.emit(f"{v} = arith.constant {value} : index")
        return v

    # -- buffers ----------------------------------------------------------------------------------
    def function(self, private=False):
        """This graph's func.func (into self.functions); its arena is `self.top` bytes."""
        g = self.g
        args = [f"%in{k}: {memref_type(g[n]['shape'], g[n]['dtype'])}" for k, n in enumerate(g.inputs)]
        args += [f"%out{j}: {memref_type(g[n]['shape'], g[n]['dtype'])}" for j, n in enumerate(g.outputs)]
        args += [f"%arena: {ARENA}", "%status: memref<i32>"]
        self.signature = [a.split(": ", 1)[1] for a in args]
        for n in g.topo():
            if n in self.plan.location and self.plan.location[n][0] != "view":
                self.buffers[n] = self._placed(n)
        for n in g.topo():
            if n in self.plan.location and self.plan.location[n][0] == "view":
                self.buffers[n] = self._view(n)
        for group in g.meta["schedule"]:
            self._kernel(group)
        self._copy_outputs()
        # the step has a C interface: a wrapper taking a pointer to each memref's descriptor (mlir_backend.py)
        head = (f"func.func private @{self.name}" if private else f"func.func @{self.name}") + f"({', '.join(args)})"
        self.functions.append("\n".join([f"  {head}{'' if private else ' attributes {llvm.emit_c_interface}'} {{",
                                         *self.lines, "    return", "  }"]))

    def text(self):
        self.function()
        return "\n".join(["module {", *(f"  {x}" for x in self.globals), *self.functions, "}", ""])

    def reserve(self, nbytes):
        """Arena bytes past the plan's (a loop body's arena, staging rows): their offset."""
        at, self.top = self.top, _align(self.top + max(nbytes, 1))
        return at

    def arena_view(self, at, shape, dtype, src=None):
        """The arena's bytes from `at` (an int, or an index SSA value) on as a contiguous memref."""
        name, typ = self.fresh("w"), memref_type(shape, dtype)
        offset = self.index(at) if isinstance(at, int) else at
        self.emit(f"{name} = memref.view %arena[{offset}][] : {ARENA} to {typ}", src)
        byte = at if isinstance(at, int) else None
        return Buffer(name, typ, dtype, strides=_contiguous(shape), arena_byte=byte)

    def _placed(self, n):
        a, (kind, v) = self.g[n], self.plan.location[n][:2]
        typ = memref_type(a["shape"], a["dtype"])
        if kind == "input":
            name = f"%in{v}"
        elif kind == "output":
            name = f"%out{v}"
        else:
            name = f"%n{n}"  # the graph's node id, as str(graph) prints it
            self.emit(f"{name} = memref.view %arena[{self.index(v)}][] : {ARENA} to {typ}")
            return Buffer(name, typ, a["dtype"], strides=_contiguous(a["shape"]), arena_byte=v)
        return Buffer(name, typ, a["dtype"], strides=_contiguous(a["shape"]))

    def _view(self, n):
        a = self.g[n]
        _, of, off = self.plan.location[n]
        base = self.buffers[of]
        offset = base.offset + off // ITEMSIZE[a["dtype"]]
        return self._reinterpret(base, a["shape"], a["dtype"], offset, _contiguous(a["shape"]), a.get("src"), f"%n{n}")

    def _reinterpret(self, base, shape, dtype, offset, strides, src=None, name=None):
        plain = offset == 0 and list(strides) == _contiguous(shape)  # then the type says so: a body takes it
        name, typ = name or self.fresh("r"), memref_type(shape, dtype, None if plain else strides, offset)
        self.emit(f"{name} = memref.reinterpret_cast {base.root.name} to offset: [{offset}], sizes: "
                  f"[{', '.join(map(str, shape))}], strides: [{', '.join(map(str, strides))}] : "
                  f"{base.root.type} to {typ}", src)
        root = base.root
        byte = None if root.arena_byte is None else root.arena_byte + offset * ITEMSIZE[dtype]
        return Buffer(name, typ, dtype, root, offset, strides, byte)

    def buffer(self, n):
        """n's buffer; a source that codegen inlines (const, iota, literal) gets one made here."""
        if n in self.buffers:
            return self.buffers[n]
        a = self.g[n]
        typ = memref_type(a["shape"], a["dtype"])
        name = self.fresh("k")
        if a["op"] == "literal":
            sym = f"@literal{n}"
            data = np.ascontiguousarray(a["attrs"]["value"].array)
            if data.dtype == np.bool_:
                data = data.astype(np.int8)
            self.globals.append(f'memref.global "private" constant {sym} : {typ} = dense<"0x{data.tobytes().hex().upper()}">')
            self.emit(f"{name} = memref.get_global {sym} : {typ}", a.get("src"))
        else:  # const, iota: a buffer of the stack filled by the kernel of its own value
            self.emit(f"{name} = memref.alloca() : {typ}", a.get("src"))
            self._elementwise((n,), out_buffers={n: Buffer(name, typ, a["dtype"], strides=_contiguous(a["shape"]))})
        self.buffers[n] = Buffer(name, typ, a["dtype"], strides=_contiguous(a["shape"]))
        return self.buffers[n]

    # -- kernels ----------------------------------------------------------------------------------
    def _kernel(self, group):
        g = self.g
        kinds = {P.PRIMITIVES[g[n]["op"]].kind for n in group}
        head = g[group[0]]
        if kinds <= {"elementwise", "reduce", "shape"} and (len(group) > 1 or kinds != {"shape"}
                                                             or head["op"] == "broadcast_to"):
            return self._elementwise(group)
        (n,) = group  # every other kind of kernel is one node, emitted by the method of its op
        getattr(self, f"_{head['op']}")(n)

    def _elementwise(self, group, out_buffers=None):
        """One linalg.generic: elementwise nodes of one shape, broadcasts into it, and at most one
        reduction over it, its output indexed without the reduced axes."""
        g, inside = self.g, set(group)
        red = [n for n in group if P.PRIMITIVES[g[n]["op"]].kind == "reduce"]
        shape = g[g.operands(red[0])[0]]["shape"] if red else g[group[-1]]["shape"]
        rank, axes = len(shape), set(g[red[0]]["attrs"]["axes"]) if red else set()
        identity = [f"d{i}" for i in range(rank)]
        outs = [n for n in group if n in (out_buffers or self.plan.location)]
        out_buf = out_buffers or self.buffers
        ins, reads = [], {}  # (buffer, map exprs); (operand, exprs) -> position in ins

        def read(o, exprs):
            if g[o]["op"] in ("const", "iota") and o not in self.buffers:
                return ("inline", o, exprs)
            key = (o, tuple(exprs))
            if key not in reads:
                reads[key] = len(ins)
                ins.append((self.buffer(o), exprs))
            return ("arg", reads[key])
        plan = []
        for n in group:
            a = g[n]
            if a["op"] in ("const", "iota"):
                plan.append((n, [("inline", n, identity)]))
            elif a["op"] == "broadcast_to":
                (o,) = g.operands(n)
                lead, src_shape = rank - len(g[o]["shape"]), g[o]["shape"]
                exprs = ["0" if s == 1 and shape[lead + i] != 1 else f"d{lead + i}" for i, s in enumerate(src_shape)]
                plan.append((n, [read(o, exprs) if o not in inside else ("node", o)]))
            else:
                plan.append((n, [("node", o) if o in inside else read(o, identity) for o in g.operands(n)]))
        if red and all(exprs != identity for _, exprs in ins):  # nothing spans the loops: a carrier of the shape
            carrier = self.fresh("k")
            self.emit(f"{carrier} = memref.alloca() : {memref_type(shape, 'bool')}")
            ins.append((Buffer(carrier, memref_type(shape, "bool"), "bool"), identity))
        for n in red:
            self.emit(f"linalg.fill ins({self._init(n)}) outs({out_buf[n].name} : {out_buf[n].type})", g[n].get("src"))
        maps = [_map(rank, exprs) for _, exprs in ins]
        maps += [_map(rank, [d for i, d in enumerate(identity) if i not in axes] if n in red else identity) for n in outs]
        iterators = ", ".join('"reduction"' if i in axes else '"parallel"' for i in range(rank))
        body, loc = [], _loc(g[group[-1]].get("src"))
        e = Scalar(body, self.names, loc)
        args = [V(f"%a{i}", STORED[b.dtype]) for i, (b, _) in enumerate(ins)]
        accs = [V(f"%o{i}", STORED[g[n]["dtype"]]) for i, n in enumerate(outs)]
        values = {}
        for n, operands in plan:
            vals = []
            for kind, *rest in operands:
                if kind == "node":
                    vals.append(values[rest[0]])
                elif kind == "arg":
                    vals.append(e.load(args[rest[0]], ins[rest[0]][0].dtype))
                else:
                    vals.append(self._source(e, rest[0], rest[1]))
            a = g[n]
            if a["op"] in ("const", "iota", "broadcast_to"):
                values[n] = vals[0]
            elif n in red:
                acc = e.load(accs[outs.index(n)], a["dtype"])
                values[n] = e.add(acc, vals[0]) if a["op"] == "reduce_sum" else e.max(acc, vals[0])
            else:
                values[n] = P.PRIMITIVES[a["op"]].scalar(e, *vals, **a["attrs"])
        yields = [e.store(values[n], g[n]["dtype"]) for n in outs]
        block = ", ".join([f"{v}: {v.type}" for v in args] + [f"{v}: {v.type}" for v in accs])
        ins_text = _operands([b for b, _ in ins])
        outs_text = _operands([out_buf[n] for n in outs])
        self.emit(f"linalg.generic {{indexing_maps = [{', '.join(maps)}], iterator_types = [{iterators}]}}"
                  + (f" ins({ins_text})" if ins else "") + f" outs({outs_text}) {{")
        self.lines.append(f"    ^bb0({block}):")
        self.lines += [f"      {line}" for line in body]
        self.lines.append(f"      linalg.yield {', '.join(yields)} : {', '.join(v.type for v in yields)}")
        self.lines.append(f"    }}{loc}")

    def _source(self, e, n, exprs):
        a = self.g[n]
        if a["op"] == "const":
            return e.constant(a["attrs"]["value"], TYPE[a["dtype"]])
        d = exprs[a["attrs"]["axis"]]
        typ = TYPE[a["dtype"]]
        if d == "0":
            return e.constant(0, typ)
        i = e.op(f"arith.index_cast {e.index(int(d[1:]))} : index to i64", "i64")
        return e.cast(i, a["dtype"]) if typ != "i64" else i

    def _init(self, n):
        a = self.g[n]
        typ = TYPE[a["dtype"]]
        if a["op"] == "reduce_sum":
            value = 0
        else:
            value = -np.inf if _float(typ) else -(1 << (int(typ[1:]) - 1))
        v = self.fresh("c")
        self.emit(f"{v} = arith.constant {constant_text(value, typ)}")
        return f"{v} : {typ}"

    # -- single-node kernels ----------------------------------------------------------------------
    def _matmul(self, n):
        g = self.g
        a, b = (self.buffer(o) for o in g.operands(n))
        out, rank = self.buffers[n], len(g[n]["shape"])
        zero = self.fresh("c")
        typ = TYPE[g[n]["dtype"]]
        self.emit(f"{zero} = arith.constant {constant_text(0, typ)}")
        self.emit(f"linalg.fill ins({zero} : {typ}) outs({out.name} : {out.type})", g[n].get("src"))
        if rank > 3:  # the batch axes as one: every operand here is contiguous
            dtype, src = g[n]["dtype"], g[n].get("src")
            a, b, out = (self._reinterpret(x, (int(np.prod(s[:-2])),) + tuple(s[-2:]), dtype, x.offset,
                                           _contiguous((int(np.prod(s[:-2])),) + tuple(s[-2:])), src)
                         for x, s in zip((a, b, out), [g[o]["shape"] for o in g.operands(n)] + [g[n]["shape"]]))
        op = "linalg.matmul" if rank == 2 else "linalg.batch_matmul"
        self.emit(f"{op} ins({a.name}, {b.name} : {a.type}, {b.type}) outs({out.name} : {out.type})", g[n].get("src"))

    def _transpose(self, n):
        (x,) = self.g.operands(n)
        src, out = self.buffer(x), self.buffers[n]
        perm = ", ".join(map(str, self.g[n]["attrs"]["perm"]))
        self.emit(f"linalg.transpose ins({src.name} : {src.type}) outs({out.name} : {out.type}) permutation = [{perm}]",
                  self.g[n].get("src"))

    def _reshape(self, n):
        (x,) = self.g.operands(n)
        src, out, a = self.buffer(x), self.buffers[n], self.g[n]
        view = self._reinterpret(src, a["shape"], a["dtype"], src.offset, _contiguous(a["shape"]), a.get("src"))
        self._copy(view, out, a.get("src"))

    def _slice(self, n):
        (x,) = self.g.operands(n)
        a, src = self.g[n], self.buffer(x)
        starts, steps, shape = a["attrs"]["starts"], a["attrs"]["steps"], a["shape"]
        full = self.g[x]["shape"]
        # forward steps by a subview (linalg checks a plain d_i against the operand's size);
        # backward ones by an index expression over the whole axis
        fwd = [st > 0 for st in steps]
        part = self._subview(src, [s0 if f else 0 for s0, f in zip(starts, fwd)],
                             [k if f else m for k, m, f in zip(shape, full, fwd)],
                             [st if f else 1 for st, f in zip(steps, fwd)], a["dtype"])
        exprs = [f"d{i}" if f else f"d{i} * {st} + {s0}" for i, (s0, st, f) in enumerate(zip(starts, steps, fwd))]
        self._copy_generic(part, exprs, self.buffers[n], len(shape), a)

    def _copy_generic(self, src, exprs, out, rank, a):
        identity = [f"d{i}" for i in range(rank)]
        t = STORED[a["dtype"]]
        self.emit(f"linalg.generic {{indexing_maps = [{_map(rank, exprs)}, {_map(rank, identity)}], iterator_types = "
                  f"[{', '.join([PARALLEL] * rank)}]}} ins({src.name} : {src.type}) outs({out.name} : {out.type}) {{")
        self.lines += [f"    ^bb0(%a: {t}, %o: {t}):", f"      linalg.yield %a : {t}", f"    }}{_loc(a.get('src'))}"]

    def _subview(self, out, starts, shape, steps, dtype):
        strides = [s * st for s, st in zip(out.strides, steps)]
        offset = out.offset + sum(s0 * s for s0, s in zip(starts, out.strides))
        name, typ = self.fresh("s"), memref_type(shape, dtype, strides, offset)
        self.emit(f"{name} = memref.subview {out.name}[{', '.join(map(str, starts))}] [{', '.join(map(str, shape))}] "
                  f"[{', '.join(map(str, steps))}] : {out.type} to {typ}")
        return Buffer(name, typ, dtype, out.root, offset, strides)

    def _fill_zero(self, n):
        out, typ = self.buffers[n], TYPE[self.g[n]["dtype"]]
        zero = self.fresh("c")
        self.emit(f"{zero} = arith.constant {constant_text(0, typ)}")
        self.emit(f"linalg.fill ins({zero} : {typ}) outs({out.name} : {out.type})", self.g[n].get("src"))

    def _pad(self, n):
        (x,) = self.g.operands(n)
        a, src = self.g[n], self.buffer(x)
        self._fill_zero(n)
        part = self._subview(self.buffers[n], a["attrs"]["starts"], self.g[x]["shape"], a["attrs"]["steps"], a["dtype"])
        self._copy(src, part, a.get("src"))

    def _concatenate(self, n):
        a, at = self.g[n], 0
        axis = a["attrs"]["axis"]
        for x in self.g.operands(n):
            shape, src = self.g[x]["shape"], self.buffer(x)
            starts = [at if i == axis else 0 for i in range(len(shape))]
            part = self._subview(self.buffers[n], starts, shape, [1] * len(shape), a["dtype"])
            self._copy(src, part, a.get("src"))
            at += shape[axis]

    def _take(self, n):
        """out[i..., r...] = table[idx[i...], r...]: a generic over the output that loads the table."""
        g = self.g
        table, idx = g.operands(n)
        a, tb, ib, out = g[n], self.buffer(table), self.buffer(idx), self.buffers[n]
        rank, k = len(a["shape"]), len(g[idx]["shape"])
        body, loc = [], _loc(a.get("src"))
        e = Scalar(body, self.names, loc)
        it = TYPE[g[idx]["dtype"]]
        i = self._checked(e, V("%a", it), g[table]["shape"][0], n)
        rest = [e.index(d) for d in range(k, rank)]
        t = STORED[a["dtype"]]
        v = e.op(f"memref.load {tb.name}[{', '.join([i] + rest)}] : {tb.type}", t)
        identity = [f"d{j}" for j in range(rank)]
        self.emit(f"linalg.generic {{indexing_maps = [{_map(rank, identity[:k])}, {_map(rank, identity)}], "
                  f"iterator_types = [{', '.join([PARALLEL] * rank)}]}} ins({ib.name} : {ib.type}) "
                  f"outs({out.name} : {out.type}) {{")
        self.lines += [f"    ^bb0(%a: {it}, %o: {t}):"] + [f"      {line}" for line in body]
        self.lines += [f"      linalg.yield {v} : {t}", f"    }}{loc}"]

    def _scatter_add(self, n):
        """out = zeros; out[idx[i...], r...] += updates[i..., r...]: an scf.for nest over the updates."""
        g = self.g
        updates, idx = g.operands(n)
        a, ub, ib, out = g[n], self.buffer(updates), self.buffer(idx), self.buffers[n]
        self._fill_zero(n)
        shape, k = g[updates]["shape"], len(g[idx]["shape"])
        zero, one = self.index(0), self.index(1)
        ivs = []
        for d, size in enumerate(shape):
            iv = self.fresh("i")
            self.emit(f"scf.for {iv} = {zero} to {self.index(size)} step {one} {{")
            ivs.append(iv)
        it, t = TYPE[g[idx]["dtype"]], TYPE[a["dtype"]]
        body = []
        e = Scalar(body, self.names, _loc(a.get("src")))
        j = e.op(f"memref.load {ib.name}[{', '.join(ivs[:k])}] : {ib.type}", it)
        row = self._checked(e, j, a["attrs"]["n"], n)
        at = ", ".join([row] + ivs[k:])
        total = e.add(e.op(f"memref.load {out.name}[{at}] : {out.type}", t),
                      e.op(f"memref.load {ub.name}[{', '.join(ivs)}] : {ub.type}", t))
        body.append(f"memref.store {total}, {out.name}[{at}] : {out.type}")
        self.lines += [f"    {line}" for line in body]
        self.lines += ["    }"] * len(shape)

    def _checked(self, e, j, size, n):
        """Index j as an index, 0 where it is out of range; then %status holds error k (1-based,
        the k-th of self.errors: graph, node, the loops around it), so the caller raises after the
        step and restores what it wrote."""
        self.errors.append((self.g, n, self.loops))
        bad = e.or_(e.cmp("<", j, e.const(0, j)), e.cmp(">=", j, e.const(size, j)))
        old = e.op("memref.load %status[] : memref<i32>", "i32")
        e.lines.append(f"memref.store {e.select(bad, e.constant(len(self.errors), 'i32'), old)}, %status[] : memref<i32>")
        return e.op(f"arith.index_cast {e.select(bad, e.const(0, j), j)} : {j.type} to index", "index")

    # -- scalar regions (burjit/region.py) --------------------------------------------------------
    def _region(self, n):
        """A scalar region of the tape tier: its records as straight-line scalar code (the same
        registry rules), reading its 0-d imports and storing each output into its vector."""
        g, a = self.g, self.g[n]
        r, outputs = a["attrs"]["region"], a["attrs"]["outputs"]
        lines = []
        e = Scalar(lines, self.names, _loc(a.get("src")))
        imports = [(self.buffer(o), g[o]["dtype"]) for o in g.operands(n)]
        vals = []
        for v in range(max(outputs, default=-1) + 1):
            op, attrs, dtype, _ = KINDS[r.kinds[v]]
            args = r.args(v)
            if op == IMPORT:
                buf, d = imports[args[0]]
                vals.append(e.cast(e.load(e.op(f"memref.load {buf.name}[] : {buf.type}", STORED[d]), d), dtype))
            elif op == CONST:
                vals.append(e.constant(r.values[v], TYPE[dtype]))
            else:
                vals.append(P.PRIMITIVES[op].scalar(e, *[vals[k] for k in args], **attrs))
        out = self.buffers[n]
        for slot, w in enumerate(outputs):
            lines.append(f"memref.store {e.store(vals[w], r.dtype)}, {out.name}[{self.index(slot)}] : {out.type}")
        self.lines += [f"    {line}" for line in lines]

    # -- loops (burjit/control.py) ----------------------------------------------------------------
    def _loop(self, n):
        """The body as a private function of its own graph (its arena reserved in this one's),
        called from an scf.for (scf.while for a while loop). Its carry lives in the loop's
        vector, updated in place; each iteration's row of xs is copied into a staging buffer
        before the call and its row of ys out of one after, as a function takes contiguous memrefs."""
        g, a = self.g, self.g[n]
        spec, src = a["attrs"]["body"], a.get("src")
        body = Emitter(pipeline.prepare(spec.graph), f"{self.name}_loop{n}", self)
        body.loops = (src,) + self.loops
        body.function(private=True)
        self.ranks = self.ranks or body.ranks
        operands, vec = g.operands(n), self.buffers[n]
        nc, nx, until = spec.n_carry, spec.n_xs, spec.length is None
        leaves = [self._leaf(vec, off, shape, d, src) for off, shape, d in spec.leaves]
        for k in range(nc):
            self._copy(self.buffer(operands[k]), leaves[k], src)
        if until:  # the flag ends the vector: cond(init) before the first iteration
            self._copy(self.buffer(operands[nc]), leaves[nc], src)
        captures = [self._contiguous_copy(self.buffer(o), g[o]["shape"], g[o]["dtype"], src)
                    for o in operands[nc + nx + until:]]
        index = self.arena_view(self.reserve(8), (), "int64", src)
        xs = [(self.buffer(o), g[o]["shape"][1:], g[o]["dtype"]) for o in operands[nc:nc + nx]]
        ys = [] if until else [(leaves[nc + j], shape[1:], d) for j, (_, shape, d) in enumerate(spec.leaves[nc:])]
        rows_in = [self.arena_view(self.reserve(_nbytes(shape, d)), shape, d, src) for _, shape, d in xs]
        rows_out = [self.arena_view(self.reserve(_nbytes(shape, d)), shape, d, src) for _, shape, d in ys]
        arena = self.fresh("w")
        self.emit(f"{arena} = memref.view %arena[{self.index(self.reserve(body.top))}][{self.index(body.top)}] : "
                  f"{ARENA} to {ARENA}", src)
        args = leaves[:nc] + [index] + rows_in + captures + leaves[:nc] + (leaves[nc:] if until else rows_out)
        call = (f"func.call @{body.name}({', '.join(b.name for b in args)}, {arena}, %status) : "
                f"({', '.join(body.signature)}) -> ()")
        if until:
            return self._while(leaves[nc], index, call, src)
        k = self.fresh("k")
        self.emit(f"scf.for {k} = {self.index(0)} to {self.index(spec.length)} step {self.index(1)} {{")
        i = k
        if spec.reverse:
            i = self.fresh("i")
            self.emit(f"{i} = arith.subi {self.index(spec.length - 1)}, {k} : index")
        start = self.fresh("i")
        self.emit(f"{start} = arith.addi {i}, {self.index(spec.start)} : index")
        value = self.fresh("i")
        self.emit(f"{value} = arith.index_cast {start} : index to i64")
        self.emit(f"memref.store {value}, {index.name}[] : {index.type}")
        for (buf, shape, d), row in zip(xs, rows_in):
            self._copy(self._row(buf, i, shape, d), row, src)
        self.emit(call, src)
        for (buf, shape, d), row in zip(ys, rows_out):
            self._copy(row, self._row(buf, i, shape, d), src)
        self.emit("}", src)

    def _while(self, flag, index, call, src):
        """scf.while the flag (the body's last output, cond of its new carry) is nonzero and no
        index has failed: a clamped index must not keep a loop running that would have ended."""
        k, k2, f, go, s, ok, more, one = (self.fresh(x) for x in "kkfgsomc")
        t = STORED[flag.dtype]
        zero = constant_text(0, t)
        self.emit(f"{self.fresh('r')} = scf.while ({k} = {self.index(0)}) : (index) -> index {{")
        self.emit(f"{f} = memref.load {flag.name}[] : {flag.type}")
        self.emit(f"{go} = " + (f"arith.cmpf one, {f}, {self.literal(zero)} : {t}" if _float(t)
                                else f"arith.cmpi ne, {f}, {self.literal(zero)} : {t}"))
        self.emit(f"{s} = memref.load %status[] : memref<i32>")
        self.emit(f"{ok} = arith.cmpi eq, {s}, {self.literal('0 : i32')} : i32")
        self.emit(f"{more} = arith.andi {go}, {ok} : i1")
        self.emit(f"scf.condition({more}) {k} : index")
        self.emit("} do {")
        self.lines.append(f"    ^bb0({k2}: index):")
        value = self.fresh("i")
        self.emit(f"{value} = arith.index_cast {k2} : index to i64")
        self.emit(f"memref.store {value}, {index.name}[] : {index.type}")
        self.emit(call, src)
        self.emit(f"{one} = arith.addi {k2}, {self.index(1)} : index")
        self.emit(f"scf.yield {one} : index")
        self.emit("}", src)

    def literal(self, text):
        v = self.fresh("c")
        self.emit(f"{v} = arith.constant {text}")
        return v

    def _leaf(self, vec, off, shape, dtype, src):
        """Leaf (element offset, shape, dtype) of a loop's vector as a contiguous memref (of another
        dtype than the vector's too: a packed vector's leaf, control.PACKED)."""
        if vec.arena_byte is not None:
            return self.arena_view(vec.arena_byte + off * ITEMSIZE[vec.dtype], shape, dtype, src)
        if dtype == vec.dtype and vec.offset + off == 0:
            return self._reinterpret(vec, shape, dtype, 0, _contiguous(shape), src)
        if _nbytes(shape, dtype) == 0:  # ys of no rows after a carry that is the whole vector
            name, typ = self.fresh("k"), memref_type(shape, dtype)
            self.emit(f"{name} = memref.alloca() : {typ}", src)
            return Buffer(name, typ, dtype, strides=_contiguous(shape))
        # a vector in the caller's buffer is a loop node that is itself the output: one leaf spans it
        raise AssertionError(f"loop at {src}: leaf at element {off} of a vector in the caller's buffer")

    def _contiguous_copy(self, buf, shape, dtype, src):
        """buf as a memref of the plain contiguous type a function takes: itself, or a copy."""
        if buf.type == memref_type(shape, dtype):
            return buf
        out = self.arena_view(self.reserve(_nbytes(shape, dtype)), shape, dtype, src)
        self._copy(buf, out, src)
        return out

    def _row(self, buf, i, shape, dtype):
        """Row i (an index SSA value) of buf, rank-reduced to `shape`."""
        strides = buf.strides[1:]
        name = self.fresh("s")
        typ = f"memref<{''.join(f'{d}x' for d in shape)}{STORED[dtype]}, strided<[{', '.join(map(str, strides))}], offset: ?>>"
        zeros = ", 0" * len(shape)
        self.emit(f"{name} = memref.subview {buf.name}[{i}{zeros}] [1{''.join(f', {d}' for d in shape)}] "
                  f"[1{', 1' * len(shape)}] : {buf.type} to {typ}")
        return Buffer(name, typ, dtype)

    def _bitcast(self, n):
        """A packed leaf of a loop's vector (int64 words holding its bytes), copied out."""
        a = self.g[n]
        (vec,) = self.g.operands(n)
        leaf = self._leaf(self.buffer(vec), a["attrs"]["start"], a["shape"], a["dtype"], a.get("src"))
        self._copy(leaf, self.buffers[n], a.get("src"))

    # -- collectives (burjit/distributed.py) ------------------------------------------------------
    def _allreduce(self, n):
        """MPI_Allreduce(operand, node, count, datatype, MPI_SUM, communicator): an external call,
        its handles read from the global WORDS that the backend fills in each process (ints
        under MPICH, pointers under Open MPI: 64-bit words either way, as native's)."""
        from burjit.distributed import NATIVE_WORDS
        g, a = self.g, self.g[n]
        (x,) = g.operands(n)
        count = int(np.prod(a["shape"], dtype=np.int64))
        self.ranks = a["attrs"]["ranks"]
        if not count:
            return
        typ = f"memref<{len(NATIVE_WORDS)}xi64>"
        for line in (f"memref.global @{WORDS} : {typ} = uninitialized",
                     "func.func private @MPI_Allreduce(i64, i64, i32, i64, i64, i64) -> i32"):
            if line not in self.globals:
                self.globals.append(line)
        words = self.fresh("h")
        self.emit(f"{words} = memref.get_global @{WORDS} : {typ}")
        word = {}
        for name in ("comm", "MPI_SUM", a["dtype"]):
            word[name] = self.fresh("h")
            self.emit(f"{word[name]} = memref.load {words}[{self.index(NATIVE_WORDS.index(name))}] : {typ}")
        send, recv = (self._address(self.buffer(v)) for v in (x, n))
        size = self.literal(f"{count} : i32")
        self.emit(f"{self.fresh('r')} = func.call @MPI_Allreduce({send}, {recv}, {size}, {word[a['dtype']]}, "
                  f"{word['MPI_SUM']}, {word['comm']}) : (i64, i64, i32, i64, i64, i64) -> i32", a.get("src"))

    def _address(self, buf):
        """The address of buf's first element as an i64: from the arena argument's aligned pointer
        when it lives there (mlir-opt 19's expand-strided-metadata folds the aligned pointer of a
        memref.view to its source's, dropping the shift), else from its root's."""
        if buf.arena_byte is not None:
            root, typ, shift = "%arena", ARENA, buf.arena_byte
        else:
            root, typ, shift = buf.root.name, buf.root.type, buf.offset * ITEMSIZE[buf.dtype]
        base, at, v = self.fresh("p"), self.fresh("p"), self.fresh("p")
        self.emit(f"{base} = memref.extract_aligned_pointer_as_index {root} : {typ} -> index")
        self.emit(f"{at} = arith.addi {base}, {self.index(shift)} : index")
        self.emit(f"{v} = arith.index_cast {at} : index to i64")
        return v

    # -- results ----------------------------------------------------------------------------------
    def _copy_outputs(self):
        g = self.g
        # outputs into their own buffers first: they may read an input a donated output overwrites
        for j, n in sorted(enumerate(g.outputs), key=lambda jn: jn[0] in g.aliases):
            k = g.aliases.get(j)
            dest = f"%in{k}" if k is not None else f"%out{j}"
            a = g[n]
            src = self.buffer(n)
            if src.name != dest:
                self._copy(src, Buffer(dest, memref_type(a["shape"], a["dtype"]), a["dtype"]))

    def _copy(self, src, dest, where=None):
        # linalg.copy, not memref.copy: the latter's memcpy size becomes a constant expression
        # (`mul`) in mlir-translate 19's IR, which LLVM 22 (llvmlite) no longer parses
        self.emit(f"linalg.copy ins({_operands([src])}) outs({_operands([dest])})", where)


def _nbytes(shape, dtype):
    return int(np.prod(shape, dtype=np.int64)) * ITEMSIZE[dtype]


def step_mlir(graph):
    """The MLIR module of a planned graph (after the pipeline and pipeline.prepare)."""
    return module(graph).module_text


def module(graph):
    """The Emitter of graph, run: its `module_text`, the arena bytes it needs (`top`), `errors`
    (graph, gather or scatter node, srcs of the loops around it: the one whose index check sets
    %status to k+1) and `ranks`, its allreduces' number of ranks (None without any)."""
    e = Emitter(graph)
    e.module_text = e.text()
    return e

