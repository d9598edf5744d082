"""Optimizers written in traced ops, so the update fuses into the compiled training step.

An optimizer is a pair of pure functions: `state = opt.init(params)` (numpy arrays, outside
the step) and `params, state = opt.update(params, grads, state)` (inside it). Return both
from the step and donate both (`donate_argnums=(0, 1)`) to update them in place. The step
counter is a 0-d int64 array, not a Python int: a Python int would be a static value, baked
into the graph, and every step would retrace. For the same reason a learning-rate schedule is
a function of that counter (`optim.warmup_cosine(...)` passed as `lr`), evaluated inside the
step, so the whole schedule compiles once; a 0-d array passed into the step as `lr` works too.

Weight decay (AdamW, Lion) applies by default to leaves of two or more dimensions only (weights
and embeddings), not to biases or LayerNorm gains, as nanoGPT and most recipes do; `mask` (a
tree of bools like params, or a function of a leaf's key path and the leaf) says otherwise.
`chain(*transforms, opt)` runs gradient transforms (`clip`) before an optimizer, and
`accumulate(opt, k)` applies it once every k steps to the mean of their gradients.

    opt = optim.adamw(lr=3e-4)
    state = opt.init(params)

    @burjit.compile(donate_argnums=(0, 1))
    def step(params, state, x, y):
        loss, grads = burjit.value_and_grad(loss_fn)(params, x, y)
        params, state = opt.update(params, grads, state)
        return params, state, loss
"""

import math
from typing import Callable, NamedTuple

import numpy as np

from . import ops as F
from .pytree import flatten, leaf_paths, tree_map, unflatten
from .tracer import Tracer

__all__ = ["Optimizer", "Transform", "sgd", "adam", "adamw", "rmsprop", "lion", "chain", "clip", "accumulate",
           "clip_by_global_norm", "constant", "linear", "cosine_decay", "warmup_cosine", "step_decay", "join"]


class Optimizer(NamedTuple):
    init: Callable    # params -> state (numpy arrays)
    update: Callable  # (params, grads, state) -> (params, state), in traced ops


class Transform(NamedTuple):
    init: Callable    # params -> state
    update: Callable  # (grads, state, params) -> (grads, state): what chain runs before the optimizer


# -- schedules: the number of updates done so far (a 0-d int64) -> a value --------------------

def constant(value):
    return lambda count: value


def _updates(name, what, n, least=1):
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < least:
        raise ValueError(f"{name}: {what} must be an int >= {least} (a number of updates), got {n!r}")
    return n


def linear(start, end, steps):
    """start -> end linearly over `steps` updates, then end: a linear warmup from 0, say."""
    _updates("linear", "steps", steps)
    return lambda count: start + (end - start) * F.minimum(F.astype(count, "float64") / steps, 1.0)


def cosine_decay(init, steps, end=0.0):
    """init -> end along half a cosine over `steps` updates, then end (Loshchilov & Hutter's SGDR)."""
    _updates("cosine_decay", "steps", steps)
    return lambda count: end + (init - end) * 0.5 * (1.0 + F.cos(math.pi * F.minimum(F.astype(count, "float64") / steps, 1.0)))


def step_decay(init, every, factor):
    """init * factor ** (count // every): torch's StepLR."""
    _updates("step_decay", "every", every)
    return lambda count: init * factor ** F.astype(F.astype(F.astype(count, "float64") / every, "int64"), "float64")


def join(schedules, boundaries):
    """schedules[i] from boundaries[i - 1] on, counting from there (optax.join_schedules)."""
    if len(schedules) != len(boundaries) + 1:
        raise ValueError(f"join: {len(schedules)} schedules need {len(schedules) - 1} boundaries, got {len(boundaries)}")
    for a, b in zip([0] + list(boundaries), boundaries):
        if _updates("join", "a boundary", b, 0) < a:
            raise ValueError(f"join: boundaries must not decrease, got {list(boundaries)}")

    def schedule(count):
        value = schedules[0](count)
        for b, s in zip(boundaries, schedules[1:]):
            value = F.where(count < b, value, s(count - b))
        return value
    return schedule


def warmup_cosine(peak, warmup, steps, end=0.0, start=0.0):
    """Linear warmup start -> peak over `warmup` updates, then cosine decay to `end` at `steps`."""
    if _updates("warmup_cosine", "warmup", warmup, 0) >= _updates("warmup_cosine", "steps", steps):
        raise ValueError(f"warmup_cosine: warmup ({warmup}) must be shorter than steps ({steps})")
    if not warmup:
        return cosine_decay(peak, steps, end)
    return join([linear(start, peak, warmup), cosine_decay(peak, steps - warmup, end)], [warmup])


# -- helpers ----------------------------------------------------------------------------------

def _zeros(params):
    return tree_map(np.zeros_like, params)


def _as(x, p):
    """A hyperparameter in p's dtype: a traced one (a schedule's lr, say) must not promote p."""
    return F.astype(x, p.dtype) if isinstance(x, Tracer) else x


def _counter(lr):
    """A schedule's state: the updates done so far."""
    return {"step": np.zeros((), np.int64)} if callable(lr) else {}


def _lr(lr, state):
    """This update's learning rate: a schedule's value at the updates done so far."""
    return lr(state["step"]) if callable(lr) else lr


def _next(lr, state):
    """The counter after this update."""
    return {"step": state["step"] + 1} if callable(lr) else {}


def _decays(mask, params):
    """Per leaf in flatten order, whether weight decay applies (module docstring: the default)."""
    leaves, td = flatten(params)
    if mask is None:
        return [len(p.shape) >= 2 for p in leaves]
    if callable(mask):
        return [bool(mask(path, p)) for path, p in zip(leaf_paths(td), leaves)]
    flags, mtd = flatten(mask)
    if mtd != td:
        raise ValueError("a weight-decay mask must be a tree of bools with the structure of params")
    return [bool(f) for f in flags]


def _with_decay(params, mask, rule):
    """rule(p, decays) per leaf, rebuilt into params' tree."""
    leaves, td = flatten(params)
    return unflatten(td, [rule(i, p, d) for i, (p, d) in enumerate(zip(leaves, _decays(mask, params)))])


# -- optimizers -------------------------------------------------------------------------------

def sgd(lr, momentum=0.0):
    """p -= lr * v with v = momentum * v + g (PyTorch's form); plain SGD when momentum is 0."""

    def init(params):
        return {**_counter(lr), **({"v": _zeros(params)} if momentum else {})}

    def update(params, grads, state):
        rate, counter = _lr(lr, state), _next(lr, state)
        if not momentum:
            return tree_map(lambda p, g: p - _as(rate, p) * g, params, grads), counter
        v = tree_map(lambda v, g: momentum * v + g, state["v"], grads)
        return tree_map(lambda p, v: p - _as(rate, p) * v, params, v), {**counter, "v": v}
    return Optimizer(init, update)


def adamw(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01, mask=None):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p),
    wd only where `mask` says (module docstring: by default not on biases and gains)."""

    def init(params):
        return {"step": np.zeros((), np.int64), "m": _zeros(params), "v": _zeros(params)}

    def update(params, grads, state):
        rate, t = _lr(lr, state), state["step"] + 1
        m = tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
        v = tree_map(lambda v, g: b2 * v + (1 - b2) * (g * g), state["v"], grads)
        m_leaves, v_leaves = flatten(m)[0], flatten(v)[0]

        def step(i, p, decays):
            tf = F.astype(t, p.dtype)
            m_hat = m_leaves[i] / (1 - b1 ** tf)
            v_hat = v_leaves[i] / (1 - b2 ** tf)
            u = m_hat / (F.sqrt(v_hat) + eps)
            return p - _as(rate, p) * (u + weight_decay * p if weight_decay and decays else u)
        return _with_decay(params, mask, step), {"step": t, "m": m, "v": v}
    return Optimizer(init, update)


def adam(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """Adam (Kingma & Ba) with bias correction: AdamW without weight decay."""
    return adamw(lr, b1, b2, eps, weight_decay=0.0)


def rmsprop(lr=1e-2, alpha=0.99, eps=1e-8, momentum=0.0):
    """PyTorch's RMSprop: v = alpha v + (1 - alpha) g^2, p -= lr * g / (sqrt(v) + eps) (through a
    momentum buffer b = momentum b + g / (sqrt(v) + eps) when momentum is set)."""

    def init(params):
        return {**_counter(lr), "v": _zeros(params), **({"b": _zeros(params)} if momentum else {})}

    def update(params, grads, state):
        rate, counter = _lr(lr, state), _next(lr, state)
        v = tree_map(lambda v, g: alpha * v + (1 - alpha) * (g * g), state["v"], grads)
        step = tree_map(lambda g, v: g / (F.sqrt(v) + eps), grads, v)
        out = {**counter, "v": v}
        if momentum:
            step = out["b"] = tree_map(lambda b, s: momentum * b + s, state["b"], step)
        return tree_map(lambda p, s: p - _as(rate, p) * s, params, step), out
    return Optimizer(init, update)


def lion(lr=1e-4, b1=0.9, b2=0.99, weight_decay=0.0, mask=None):
    """Lion (Chen et al., 2023): p -= lr * (sign(b1 m + (1 - b1) g) + wd * p), m = b2 m + (1 - b2) g;
    every coordinate moves by lr, so its lr is typically 3-10x smaller than AdamW's."""

    def init(params):
        return {**_counter(lr), "m": _zeros(params)}

    def update(params, grads, state):
        rate = _lr(lr, state)
        m_leaves, g_leaves = flatten(state["m"])[0], flatten(grads)[0]

        def step(i, p, decays):
            u = F.sign(b1 * m_leaves[i] + (1 - b1) * g_leaves[i])
            return p - _as(rate, p) * (u + weight_decay * p if weight_decay and decays else u)
        m = tree_map(lambda m, g: b2 * m + (1 - b2) * g, state["m"], grads)
        return _with_decay(params, mask, step), {**_next(lr, state), "m": m}
    return Optimizer(init, update)


# -- composition ------------------------------------------------------------------------------

def clip(max_norm):
    """The transform of clip_by_global_norm, for chain."""
    return Transform(lambda params: {}, lambda grads, state, params: (clip_by_global_norm(grads, max_norm), state))


def chain(*parts):
    """chain(t1, ..., tn, opt): the gradients go through the transforms in order, then to opt."""
    *transforms, opt = parts
    if not isinstance(opt, Optimizer) or not all(isinstance(t, Transform) for t in transforms):
        raise TypeError("chain(*transforms, optimizer): transforms (optim.clip, ...) first, one Optimizer last")

    def init(params):
        return {"transforms": [t.init(params) for t in transforms], "opt": opt.init(params)}

    def update(params, grads, state):
        states = []
        for t, s in zip(transforms, state["transforms"]):
            grads, s = t.update(grads, s, params)
            states.append(s)
        params, inner = opt.update(params, grads, state["opt"])
        return params, {"transforms": states, "opt": inner}
    return Optimizer(init, update)


def accumulate(opt, k):
    """opt applied once every k updates, to the mean of the k gradients since (optax.MultiSteps):
    k micro-batches train like one batch k times larger, in the memory of one. In between, the
    parameters and opt's state stay as they are (both branches are computed; where picks one)."""
    if not (isinstance(k, int) and k >= 1):
        raise ValueError(f"accumulate: k must be a positive int, got {k!r}")

    def init(params):
        return {"opt": opt.init(params), "sum": _zeros(params), "micro": np.zeros((), np.int64)}

    def update(params, grads, state):
        total = tree_map(lambda s, g: s + g, state["sum"], grads)
        micro = state["micro"] + 1
        ready = micro == k
        new_params, new_state = opt.update(params, tree_map(lambda s: s / k, total), state["opt"])
        pick = lambda new, old: F.where(ready, new, old)  # noqa: E731
        return tree_map(pick, new_params, params), {
            "opt": tree_map(pick, new_state, state["opt"]),
            "sum": tree_map(lambda s: F.where(ready, F.zeros_like(s), s), total),
            "micro": F.where(ready, F.zeros_like(micro), micro)}
    return Optimizer(init, update)


def clip_by_global_norm(grads, max_norm):
    """Scale all gradients by min(1, max_norm / ||grads||), the norm taken over every leaf together."""
    squares = [F.astype(F.sum(g * g), "float64") for g in flatten(grads)[0]]
    scale = F.minimum(1.0, max_norm / (F.sqrt(sum(squares)) + 1e-6))
    return tree_map(lambda g: g * F.astype(scale, g.dtype), grads)
