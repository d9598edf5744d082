"""burjit against PyTorch, JAX, autograd and micrograd on the same workloads: `python -m benchmarks`."""
