"""What every adapter shares: the Bench it returns, Skip, pytree helpers, numpy-like namespaces."""

import importlib.metadata
from types import SimpleNamespace

import numpy as np


class Skip(Exception):
    """This framework cannot run this workload (the message says why)."""


class Bench:
    """A workload built in one framework.

    step()   runs one step and returns when its results are ready (JAX dispatches asynchronously)
    read()   the check values as numpy arrays: {"value", "grad"} or {"loss", parameter paths...}
    trivial  a call, with the step's own arguments and result structure, of a compiled function
             that does no arithmetic: its time is the per-call overhead (None for eager frameworks)
    arena    () -> bytes of burjit's planned arena, or None
    loop     k -> runs k steps inside one call of the framework's own loop (jax.lax.fori_loop),
             or None for a framework without one
    """

    def __init__(self, step, read, trivial=None, arena=None, loop=None):
        self.step, self.read, self.trivial, self.arena = step, read, trivial, arena or (lambda: None)
        self.loop = loop


# -- pytrees of dicts / lists / tuples ---------------------------------------------------------

def tree_map(f, tree, *rest):
    if isinstance(tree, dict):
        return {k: tree_map(f, tree[k], *[r[k] for r in rest]) for k in tree}
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_map(f, *xs) for xs in zip(tree, *rest))
    return f(tree, *rest)


def named_leaves(tree, prefix=""):
    """{"blocks/0/attn/w": leaf, ...}: parameter paths for checks."""
    if isinstance(tree, dict):
        return {n: v for k in sorted(tree) for n, v in named_leaves(tree[k], f"{prefix}{k}/").items()}
    if isinstance(tree, (list, tuple)):
        return {n: v for i, x in enumerate(tree) for n, v in named_leaves(x, f"{prefix}{i}/").items()}
    return {prefix.rstrip("/"): tree}


def leaves(tree):
    """The leaves in tree_map's order (a flat argument list for a framework that wants one)."""
    out = []
    tree_map(out.append, tree)
    return out


def unflatten(tree, flat):
    """The pytree shaped like `tree` whose leaves, in tree_map's order, are `flat`."""
    flat = iter(flat)
    return tree_map(lambda _: next(flat), tree)


def first_leaf(tree):
    return next(iter(named_leaves(tree).values()))


def read_state(state, to_numpy):
    """The check values of a training Bench whose state is {"p": params, "loss": loss}."""
    return {"loss": np.array(float(state["loss"])),
            **{k: np.array(to_numpy(v)) for k, v in named_leaves(state["p"]).items()}}


def version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def numpy_ns(np_mod, **extra):
    """The namespace for numpy-compatible modules (jax.numpy, autograd.numpy)."""
    ns = SimpleNamespace(
        exp=np_mod.exp, log=np_mod.log, tanh=np_mod.tanh, sqrt=np_mod.sqrt, where=np_mod.where,
        transpose=np_mod.transpose, reshape=np_mod.reshape,
        sum=lambda x, axis=None, keepdims=False: np_mod.sum(x, axis=axis, keepdims=keepdims),
        mean=lambda x, axis=None, keepdims=False: np_mod.mean(x, axis=axis, keepdims=keepdims),
        max=lambda x, axis=None, keepdims=False: np_mod.max(x, axis=axis, keepdims=keepdims),
        relu=lambda x: np_mod.maximum(x, 0.0),
        unstack=lambda x: [x[i] for i in range(x.shape[0])])
    vars(ns).update(extra)
    return ns
