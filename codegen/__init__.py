"""LLVM IR emission, JIT and the calling convention (knows nothing of tracing)."""
