"""LLVM types for each dtype (bool is i1 in registers, one byte in memory) and small IR helpers."""

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


def mangle(t):
    """LLVM's overload suffix for a type: f32, f64, i64, v8f32..."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{mangle(t.element)}"
    return {F32: "f32", F64: "f64"}.get(t) or f"i{t.width}"


def const(ty, value):
    if is_float(ty):
        return ir.Constant(ty, float(value))
    return ir.Constant(ty, int(bool(value)) if ty == I1 else int(value))
