"""LLVM IR emission, JIT and the calling convention (knows nothing of tracing).

Registers the "native" backend, which becomes the default of @burjit.compile, and "mlir". The pieces:
  native.py    build(graph) -> NativeExecutable: cache lookup, compile, call, inspection
  mlir.py      the planned step as MLIR (step.mlir());  mlir_backend.py the "mlir" backend over it
  lowering.py  the step's driver over the schedule and memory plan, each distinct kernel a module
  objects.py   the step's object code: from memory, the per-step and per-kernel disk caches, or compiled
  program.py   per-element kernels: fused elementwise groups, reductions with prologues
  loops.py     loop nests and the affine index maps every data movement reduces to
  kernels.py   gather, scatter_add, pad, concatenate
  bodies.py    loop nodes: the native loop that calls a loop body's own step
  tape.py      the tape tier: large scalar programs as records run by an interpreter kernel
  matmul.py    register-blocked, vectorised matrix product
  emitter.py   the scalar emitter of primitives' `scalar` lowerings; mathfns.py its exp/log/log1p/tanh
  engine.py    host target machines, optimisation, object code, MCJIT;  cache.py object code on disk
  forked.py    the compile servers: LLVM in forked processes, one per core, its memory kept out of ours
  abi.py       the object layouts the fast entry reads;  types.py LLVM types per dtype
"""

from burjit.jit import register_backend

from .mlir_backend import MLIRExecutable
from .native import NativeExecutable, build

register_backend("native", NativeExecutable)
register_backend("mlir", MLIRExecutable)

__all__ = ["NativeExecutable", "build"]
