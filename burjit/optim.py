"""Optimizers written in traced ops, so the update fuses into the compiled training step.

An optimizer is a pair of pure functions: `state = opt.init(params)` (numpy arrays, outside
the step) and `params, state = opt.update(params, grads, state)` (inside it). Return both
from the step and donate both (`donate_argnums=(0, 1)`) to update them in place. The step
counter is a 0-d int64 array, not a Python int: a Python int would be a static value, baked
into the graph, and every step would retrace. For the same reason a learning-rate schedule
passes lr into the step as a 0-d array and builds the optimizer there (optim.adamw(lr)).

    opt = optim.adamw(lr=3e-4)
    state = opt.init(params)

    @burjit.compile(donate_argnums=(0, 1))
    def step(params, state, x, y):
        loss, grads = burjit.value_and_grad(loss_fn)(params, x, y)
        params, state = opt.update(params, grads, state)
        return params, state, loss
"""

from typing import Callable, NamedTuple

import numpy as np

from . import ops as F
from .pytree import flatten, tree_map
from .tracer import Tracer

__all__ = ["Optimizer", "sgd", "adam", "adamw", "clip_by_global_norm"]


class Optimizer(NamedTuple):
    init: Callable
    update: Callable


def _zeros(params):
    return tree_map(np.zeros_like, params)


def _as(x, p):
    """A hyperparameter in p's dtype: a traced one (a schedule's lr, say) must not promote p."""
    return F.astype(x, p.dtype) if isinstance(x, Tracer) else x


def sgd(lr, momentum=0.0):
    """p -= lr * v with v = momentum * v + g (PyTorch's form); plain SGD when momentum is 0."""

    def init(params):
        return {"v": _zeros(params)} if momentum else {}

    def update(params, grads, state):
        if not momentum:
            return tree_map(lambda p, g: p - _as(lr, p) * g, params, grads), state
        v = tree_map(lambda v, g: momentum * v + g, state["v"], grads)
        return tree_map(lambda p, v: p - _as(lr, p) * v, params, v), {"v": v}
    return Optimizer(init, update)


def adamw(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p)."""

    def init(params):
        return {"step": np.zeros((), np.int64), "m": _zeros(params), "v": _zeros(params)}

    def update(params, grads, state):
        t = state["step"] + 1
        m = tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
        v = tree_map(lambda v, g: b2 * v + (1 - b2) * (g * g), state["v"], grads)

        def step(p, m, v):
            tf = F.astype(t, p.dtype)
            m_hat = m / (1 - b1 ** tf)
            v_hat = v / (1 - b2 ** tf)
            u = m_hat / (F.sqrt(v_hat) + eps)
            return p - _as(lr, p) * (u + weight_decay * p if weight_decay else u)
        return tree_map(step, params, m, v), {"step": t, "m": m, "v": v}
    return Optimizer(init, update)


def adam(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """Adam (Kingma & Ba) with bias correction: AdamW without weight decay."""
    return adamw(lr, b1, b2, eps, weight_decay=0.0)


def clip_by_global_norm(grads, max_norm):
    """Scale all gradients by min(1, max_norm / ||grads||), the norm taken over every leaf together."""
    squares = [F.astype(F.sum(g * g), "float64") for g in flatten(grads)[0]]
    scale = F.minimum(1.0, max_norm / (F.sqrt(sum(squares)) + 1e-6))
    return tree_map(lambda g: g * F.astype(scale, g.dtype), grads)
