"""The scalar emitter that primitives' `scalar` lowerings are written against (see primitives.py).

A value's LLVM type says its dtype (float/double, i32/i64, i1 for bool), so methods need no
dtype arguments. exp/log/log1p/tanh come from mathfns (branch-free polynomials, so loops over them
still vectorise); sqrt/cos/sin/max/min/pow use LLVM intrinsics. Float arithmetic carries no fast-math
flags: no FMA contraction (`a*a - b*b` with a == b must be 0, as in numpy, jax and torch) and no
reassociation, so each op rounds as numpy's does. Only reductions (program.py) and matmul reassociate.
"""

from llvmlite import ir

from . import mathfns
from .types import F32, I1, I8, ITEMSIZE, MEM, REG, const, declare, is_float, mangle

_FPRED = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "=="}


class Emitter:
    """`outline=True` (straight-line code) calls exp/log/log1p/tanh as shared functions instead of
    inlining their polynomials: inlined, a scalar graph's one basic block grows ~20 instructions
    per call and LLVM's instruction selection, superlinear in block size, dominates the build."""

    def __init__(self, builder, outline=False):
        self.b = builder
        self.outline = outline

    def call(self, name, *args):
        """Call the LLVM intrinsic `name` overloaded on the first operand's type."""
        fn = declare(self.b.module, f"{name}.{mangle(args[0].type)}", args[0].type, [a.type for a in args])
        return self.b.call(fn, list(args))

    # -- arithmetic -----------------------------------------------------------------------------
    def add(self, x, y):
        return self.b.fadd(x, y) if is_float(x.type) else self.b.add(x, y)

    def sub(self, x, y):
        return self.b.fsub(x, y) if is_float(x.type) else self.b.sub(x, y)

    def mul(self, x, y):
        return self.b.fmul(x, y) if is_float(x.type) else self.b.mul(x, y)

    def div(self, x, y):
        return self.b.fdiv(x, y)

    def neg(self, x):
        return self.b.fneg(x) if is_float(x.type) else self.b.sub(const(x.type, 0), x)

    def abs(self, x):
        if is_float(x.type):
            return self.call("llvm.fabs", x)
        return self.b.select(self.b.icmp_signed("<", x, const(x.type, 0)), self.neg(x), x)

    def sqrt(self, x):
        return self.call("llvm.sqrt", x)

    def cos(self, x):  # libm's, so a loop over cos does not vectorise (schedules, not hot loops)
        return self.call("llvm.cos", x)

    def sin(self, x):
        return self.call("llvm.sin", x)

    def exp(self, x):
        return self._math(mathfns.exp, x)

    def log(self, x):
        return self._math(mathfns.log, x)

    def log1p(self, x):
        return self._math(mathfns.log1p, x)

    def tanh(self, x):
        return self._math(mathfns.tanh, x)

    def _math(self, fn, x):
        if not self.outline:
            return fn(self, x)
        name = f"burjit.{fn.__name__}.{mangle(x.type)}"
        f = self.b.module.globals.get(name)
        if f is None:
            f = ir.Function(self.b.module, ir.FunctionType(x.type, [x.type]), name=name)
            f.linkage = "internal"
            f.attributes.add("noinline")
            f.attributes.add("nounwind")
            body = ir.IRBuilder(f.append_basic_block())
            body.ret(fn(Emitter(body), f.args[0]))
        return self.b.call(f, [x])

    def pow(self, x, y):
        if isinstance(y, ir.Constant):  # literal exponents: multiplications, no libm call
            n = y.constant
            if n == 0.5:
                return self.sqrt(x)
            if n == int(n) and 0 < abs(n) <= 4:
                r = x
                for _ in range(int(abs(n)) - 1):
                    r = self.mul(r, x)
                return r if n > 0 else self.div(const(x.type, 1), r)
        return self.call("llvm.pow", x, y)

    def max(self, x, y):
        if is_float(x.type):
            return self.call("llvm.maximum", x, y)  # NaN-propagating, like numpy
        return self.b.select(self.b.icmp_signed(">", x, y), x, y)

    def min(self, x, y):
        if is_float(x.type):
            return self.call("llvm.minimum", x, y)
        return self.b.select(self.b.icmp_signed("<", x, y), x, y)

    # -- logic ----------------------------------------------------------------------------------
    def cmp(self, pred, x, y):
        if is_float(x.type):
            # numpy: every comparison with NaN is False except !=.
            return (self.b.fcmp_unordered("!=", x, y) if pred == "!=" else self.b.fcmp_ordered(_FPRED[pred], x, y))
        if x.type == I1:
            return self.b.icmp_unsigned(pred, x, y)
        return self.b.icmp_signed(pred, x, y)

    def select(self, c, x, y):
        return self.b.select(c, x, y)

    def and_(self, x, y):
        return self.b.and_(x, y)

    def or_(self, x, y):
        return self.b.or_(x, y)

    def not_(self, x):
        return self.b.xor(x, const(I1, 1))

    def xor(self, x, y):
        return self.b.xor(x, y)

    def shl(self, x, y):
        return self.b.shl(x, y)

    def lshr(self, x, y):
        return self.b.lshr(x, y)

    # -- types ----------------------------------------------------------------------------------
    def const(self, value, like):
        return const(like.type, value)

    def cast(self, x, dtype):
        src, dst = x.type, REG[dtype]
        if src == dst:
            return x
        if dst == I1:
            return self.b.fcmp_unordered("!=", x, const(src, 0)) if is_float(src) else self.b.icmp_unsigned("!=", x, const(src, 0))
        if is_float(dst):
            if is_float(src):
                return self.b.fpext(x, dst) if src == F32 else self.b.fptrunc(x, dst)
            return self.b.uitofp(x, dst) if src == I1 else self.b.sitofp(x, dst)
        if is_float(src):  # NaN and out-of-range values give INT_MIN, as numpy does on x86 (never poison)
            fn = declare(self.b.module, f"llvm.fptosi.sat.{mangle(dst)}.{mangle(src)}", dst, [src])
            lowest = const(dst, -(1 << (dst.width - 1)))
            fits = self.b.and_(self.b.fcmp_ordered(">=", x, const(src, -2.0 ** (dst.width - 1))),
                               self.b.fcmp_ordered("<", x, const(src, 2.0 ** (dst.width - 1))))
            return self.b.select(fits, self.b.call(fn, [x]), lowest)
        if src == I1:
            return self.b.zext(x, dst)
        return self.b.sext(x, dst) if src.width < dst.width else self.b.trunc(x, dst)

    # -- memory ---------------------------------------------------------------------------------
    def load(self, ptr, dtype, index):
        v = self.b.load(self.b.gep(ptr, [index], inbounds=True, source_etype=MEM[dtype]), typ=MEM[dtype],
                        align=ITEMSIZE[dtype])
        return self.b.icmp_unsigned("!=", v, const(I8, 0)) if dtype == "bool" else v

    def store(self, value, ptr, dtype, index):
        if dtype == "bool":
            value = self.b.zext(value, I8)
        self.b.store(value, self.b.gep(ptr, [index], inbounds=True, source_etype=MEM[dtype]), align=ITEMSIZE[dtype])
