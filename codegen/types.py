"""LLVM types for each dtype (bool is i1 in registers, one byte in memory) and small IR helpers."""

import numpy as np
from llvmlite import ir

from burjit.primitives import ITEMSIZE  # noqa: F401  (re-exported: codegen reads it from here)

F32, F64, I1, I8, I32, I64 = ir.FloatType(), ir.DoubleType(), ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
REG = {"float32": F32, "float64": F64, "int32": I32, "int64": I64, "bool": I1}   # in registers
MEM = {"float32": F32, "float64": F64, "int32": I32, "int64": I64, "bool": I8}   # in memory


def is_float(ty):
    return isinstance(ty, (ir.FloatType, ir.DoubleType))


def declare(module, name, ret, args):
    """The function `name` of type ret(args), declared once per module."""
    fn = module.globals.get(name)
    return fn if fn is not None else ir.Function(module, ir.FunctionType(ret, args), name=name)


def assume(b, cond):
    """Tell LLVM that the i1 value cond holds here."""
    b.call(declare(b.module, "llvm.assume", ir.VoidType(), [I1]), [cond])


def i64(n):
    """n, an int or an i64 value known at run time, as an i64 value."""
    return n if isinstance(n, ir.Value) else I64(n)


def mangle(t):
    """LLVM's overload suffix for a type: f32, f64, i64, v8f32..."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{mangle(t.element)}"
    return {F32: "f32", F64: "f64"}.get(t) or f"i{t.width}"


def const(ty, value):
    if is_float(ty):
        return ir.Constant(ty, float(value))
    return ir.Constant(ty, int(bool(value)) if ty == I1 else int(value))


class _Bytes(ir.Constant):
    """A byte array constant written as \\XX escapes by numpy: llvmlite escapes byte by byte in
    Python (0.12 s for 4 MB), and captured arrays become such constants."""

    _HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)

    def _get_reference(self):
        raw = np.frombuffer(bytes(self.constant), dtype=np.uint8)
        text = np.empty((len(raw), 3), dtype=np.uint8)
        text[:, 0], text[:, 1], text[:, 2] = ord("\\"), self._HEX[raw >> 4], self._HEX[raw & 15]
        return 'c"' + text.tobytes().decode("ascii") + '"'


def constant_global(module, name, data, align):
    """A private constant global holding the bytes `data` (at least one byte)."""
    data = data or b"\0"
    ty = ir.ArrayType(I8, len(data))
    gv = ir.GlobalVariable(module, ty, name=name)
    gv.initializer = _Bytes(ty, bytearray(data))
    gv.global_constant, gv.linkage, gv.align = True, "private", align
    return gv
