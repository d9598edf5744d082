"""TensorFlow on one thread, eager (`tf.GradientTape`, `Variable.assign_sub`) and `tf.function`.

A tf.Tensor cannot be indexed with an integer array (the workloads' embedding lookup), and its
slices are strided slices, whose gradient TFLite cannot run; `getitem` reads indexing as
`tf.gather` and `tf.slice` (gradient: a pad) instead, for these rows and the tflite one alike.
"""

from types import SimpleNamespace

import numpy as np

from .common import Bench, first_leaf, named_leaves, read_state, tree_map


def load():
    """TensorFlow on one thread, its tensors indexed by `getitem`."""
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.Tensor.__getitem__ = getitem(tf, tf.Tensor.__getitem__)
    return tf


def namespace(tf, **extra):
    red = lambda op: lambda x, axis=None, keepdims=False: op(x, axis=axis, keepdims=keepdims)  # noqa: E731
    ns = SimpleNamespace(
        relu=tf.nn.relu, exp=tf.exp, log=tf.math.log, tanh=tf.tanh, sqrt=tf.sqrt, softplus=tf.nn.softplus,
        sum=red(tf.reduce_sum), mean=red(tf.reduce_mean), max=red(tf.reduce_max),
        softmax=lambda x, axis=-1: tf.nn.softmax(x, axis=axis),
        where=lambda c, a, b: tf.where(c, a, tf.convert_to_tensor(b, a.dtype)),
        transpose=lambda x, axes: tf.transpose(x, axes), reshape=tf.reshape,
        cross_entropy=lambda l, t: tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(t, l)),
        unstack=tf.unstack)
    vars(ns).update(extra)
    return ns


def getitem(tf, fallback):
    """x[int array] as tf.gather; x[ints and unit-step slices] as tf.slice; anything else as before."""
    def item(x, key):
        if isinstance(key, tf.Tensor) and key.dtype.is_integer or (
                isinstance(key, np.ndarray) and np.issubdtype(key.dtype, np.integer)):
            return tf.gather(x, key)
        keys = key if isinstance(key, tuple) else (key,)
        shape = x.shape.as_list() if x.shape.rank is not None else []
        if len(keys) > len(shape) or None in shape or not all(
                isinstance(k, (int, np.integer)) or isinstance(k, slice) and k.step in (None, 1) for k in keys):
            return fallback(x, key)
        begin, size, kept = [], [], []
        for d, k in zip(shape, keys):
            if isinstance(k, slice):
                start, stop, _ = k.indices(d)
                kept.append(max(stop - start, 0))
            elif -d <= k < d:
                start, stop = int(k) % d, int(k) % d + 1
            else:
                raise IndexError(f"index {k} is out of bounds for an axis of size {d}")
            begin.append(start)
            size.append(max(stop - start, 0))
        rest = shape[len(keys):]
        out = tf.slice(x, begin + [0] * len(rest), size + rest)
        return out if len(kept) == len(keys) else tf.reshape(out, kept + rest)
    return item


def value_and_grad(tf, xp, f):
    """x -> (f(xp, x), its gradient) by tf.GradientTape."""
    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = f(xp, x)
        return value, tape.gradient(value, x)
    return fn


def trivial_grad(tf):
    """The trivial step of a `grad` Bench: x -> (a scalar, an x-shaped tensor), no arithmetic."""
    return lambda x: (tf.reshape(x, [-1])[0], x)


class TensorFlow:
    family = "tensorflow"
    dtypes = ("float32", "float64")

    def __init__(self, name="tensorflow", graph=False):
        self.name, self.graph = name, graph

    def load(self, dtype):
        self.tf = load()
        self.xp = namespace(self.tf)
        return self.tf.__version__

    def _function(self, fn):
        return self.tf.function(fn) if self.graph else fn

    def grad(self, f, x0):
        tf, out = self.tf, {}
        fn, x = self._function(value_and_grad(tf, self.xp, f)), tf.constant(x0)

        def run():
            out["value"], out["grad"] = fn(x)
        trivial = tf.function(trivial_grad(tf)) if self.graph else None
        return Bench(run, lambda: {k: v.numpy() for k, v in out.items()}, trivial and (lambda: trivial(x)))

    def sgd(self, loss, params, batch, lr):
        tf = self.tf
        variables = tree_map(tf.Variable, params)
        leaves = list(named_leaves(variables).values())
        batch = tree_map(tf.constant, batch)

        def train(b):
            with tf.GradientTape() as tape:
                value = loss(self.xp, tree_map(tf.convert_to_tensor, variables), b)
            for v, g in zip(leaves, tape.gradient(value, leaves)):
                v.assign_sub(lr * tf.convert_to_tensor(g))  # a gather's gradient comes as IndexedSlices
            return value
        step, state = self._function(train), {"p": variables, "loss": np.nan}

        def run():
            state["loss"] = step(batch)
        trivial = tf.function(lambda b: tf.reshape(first_leaf(variables), [-1])[0]) if self.graph else None
        return Bench(run, lambda: read_state(state, lambda v: v.numpy()), trivial and (lambda: trivial(batch)))
