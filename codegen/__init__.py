"""LLVM IR emission, JIT and the calling convention (knows nothing of tracing).

Registers the "native" backend, which becomes the default of @burjit.compile.
"""

from burjit.jit import register_backend

from .native import NativeExecutable, build

register_backend("native", build)

__all__ = ["NativeExecutable", "build"]
