"""Pytrees: nested dicts, lists, tuples (and None) whose leaves are arrays or scalars.

A treedef is a hashable nested tuple, so it can sit in a compile-cache key as it is.
Dict keys are sorted, as in JAX, so two dicts built in different orders trace alike.
"""

_LEAF = "*"


def flatten(tree):
    """Return (leaves, treedef)."""
    leaves = []
    return leaves, _flatten(tree, leaves)


def _flatten(tree, leaves):
    if isinstance(tree, dict):
        keys = sorted(tree)
        return ("dict", tuple(keys), tuple(_flatten(tree[k], leaves) for k in keys))
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return ("namedtuple", type(tree), tuple(_flatten(x, leaves) for x in tree))
    if isinstance(tree, (list, tuple)):
        return (type(tree).__name__, len(tree), tuple(_flatten(x, leaves) for x in tree))
    if tree is None:
        return ("none",)
    leaves.append(tree)
    return _LEAF


def unflatten(treedef, leaves):
    """Inverse of flatten: rebuild the tree from its treedef and leaves."""
    it = iter(leaves)
    out = _unflatten(treedef, it)
    if next(it, _LEAF) is not _LEAF:
        raise ValueError("too many leaves for treedef")
    return out


def _unflatten(td, it):
    if td == _LEAF:
        return next(it)
    kind = td[0]
    if kind == "none":
        return None
    if kind == "dict":
        return {k: _unflatten(c, it) for k, c in zip(td[1], td[2])}
    children = [_unflatten(c, it) for c in td[2]]
    if kind == "namedtuple":
        return td[1](*children)
    return tuple(children) if kind == "tuple" else children


def num_leaves(treedef):
    if treedef == _LEAF:
        return 1
    return sum(num_leaves(c) for c in treedef[2]) if treedef[0] != "none" else 0


def tree_map(fn, tree, *rest):
    leaves, td = flatten(tree)
    others = [flatten(r)[0] for r in rest]
    return unflatten(td, [fn(*xs) for xs in zip(leaves, *others)])


def top_level(treedef):
    """The children of a top-level tuple/list output, or the whole tree as one child."""
    if treedef != _LEAF and treedef[0] in ("tuple", "list"):
        return list(treedef[2])
    return [treedef]


def unflattener(treedef):
    """A function leaves -> tree for one treedef, generated once: rebuilding results is per-call work."""
    consts = []

    def expr(td, counter):
        if td == _LEAF:
            counter[0] += 1
            return f"o[{counter[0] - 1}]"
        kind = td[0]
        if kind == "none":
            return "None"
        if kind == "dict":
            consts.extend(td[1])
            base = len(consts) - len(td[1])
            return "{" + ", ".join(f"c[{base + i}]: {expr(ch, counter)}" for i, ch in enumerate(td[2])) + "}"
        items = [expr(ch, counter) for ch in td[2]]
        if kind == "namedtuple":
            consts.append(td[1])
            return f"c[{len(consts) - 1}](" + ", ".join(items) + ")"
        body = ", ".join(items)
        return f"({body},)" if kind == "tuple" and len(items) == 1 else f"({body})" if kind == "tuple" else f"[{body}]"

    source = expr(treedef, [0])
    return eval(f"lambda o: {source}", {"c": consts})
