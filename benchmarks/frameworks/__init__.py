"""One adapter per framework, so that each workload's model is written once.

An adapter imports its framework pinned to one thread (`load`), offers a numpy-like namespace
`xp` that the workloads' models are written against, and turns a model into a `Bench` in the
framework's idiomatic form: `grad(f, x0)` for the value and gradient of a scalar function of a
vector, `sgd(loss, params, batch, lr)` for one training step (forward, gradients, SGD update).
Importing this package imports no framework: each adapter imports its own in `load`, in the
worker process that runs it.

The namespace `xp`: relu exp log tanh sqrt softplus, sum/mean/max(x, axis, keepdims),
softmax(x, axis), where(numpy_bool_mask, a, fill), transpose(x, axes), reshape(x, shape),
cross_entropy(logits_2d, int_targets_1d), unstack(vector) -> list of scalars; models also use
the operators + - * / ** @, basic indexing and integer-array indexing (an embedding lookup).
"""

from .autograd import Autograd
from .burjit import Burjit, BurjitLoad
from .common import Bench, Skip, named_leaves, tree_map
from .jax import Jax
from .micrograd import Micrograd
from .mlx import MLX
from .tf import TensorFlow
from .tflite import TFLite
from .tinygrad import Tinygrad
from .torch import Torch

FRAMEWORKS = {fw.name: fw for fw in (
    Burjit(), Burjit("burjit-ref", backend="reference"), Burjit("burjit.mlir", backend="mlir"), BurjitLoad(), Torch(), Torch("torch.compile", compiled=True),
    Jax(), TensorFlow(), TensorFlow("tf.function", graph=True), TFLite(),
    MLX(), MLX("mlx.compile", compiled=True), Tinygrad(),
    Autograd(), Micrograd())}
DEFAULT = ("burjit", "torch", "torch.compile", "jax", "tensorflow", "tf.function", "tflite", "mlx", "mlx.compile",
           "tinygrad", "autograd", "micrograd")
__all__ = ["Bench", "Skip", "named_leaves", "tree_map", "FRAMEWORKS", "DEFAULT"]
