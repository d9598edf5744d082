"""Pytree utilities (JAX's tree_util, by shorter names): what a compiled step's arguments,
results, parameters and optimizer states are made of.

A pytree is nested dicts, lists, tuples, namedtuples, OrderedDicts, dataclasses and types given
to `register`, with anything else as a leaf (None is an empty node). Containers keep their type
on the way out. A dataclass field with metadata {"static": True} is not a child but part of the
structure, so a step taking the dataclass retraces when it changes:

    @dataclasses.dataclass
    class Model:
        w: np.ndarray
        act: str = dataclasses.field(default="relu", metadata={"static": True})

A key path is the tuple of dict keys, field names and sequence indices from the root to a leaf.
"""

from . import pytree
from .pytree import flatten, register, unflatten

__all__ = ["flatten", "unflatten", "leaves", "structure", "map", "flatten_with_path", "map_with_path",
           "register"]


def leaves(tree):
    return flatten(tree)[0]


def structure(tree):
    """The treedef: hashable, equal for trees of the same shape; unflatten(structure(t), leaves(t))."""
    return flatten(tree)[1]


def map(fn, tree, *rest):
    """fn applied leaf by leaf (over several trees of tree's structure), in tree's structure."""
    return pytree.tree_map(fn, tree, *rest)


def flatten_with_path(tree):
    """([(key path, leaf)], treedef)."""
    values, treedef = flatten(tree)
    return list(zip(pytree.leaf_paths(treedef), values)), treedef


def map_with_path(fn, tree, *rest):
    """fn(key path, leaf, *leaves of rest) per leaf."""
    paths = iter(pytree.leaf_paths(structure(tree)))
    return map(lambda *xs: fn(next(paths), *xs), tree, *rest)
