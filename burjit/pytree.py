"""Pytrees: nested dicts, lists, tuples, namedtuples (and None) whose leaves are arrays or
scalars, and registered nodes: OrderedDicts, dataclasses and the types given to `register`.

A treedef is a hashable nested tuple (kind, meta, children), so it can sit in a compile-cache
key as it is. Dict keys are sorted, as in JAX, so two dicts built in different orders trace
alike (keys of mixed types sort by type name first); an OrderedDict keeps its order. A
registered node's treedef is ("node", (type, aux, keys), children): `aux` is what its flatten
returned beside the children (a dataclass's static fields), so it is part of the cache key and
must be hashable; `keys` name the children in key paths (field names, or indices).
"""

import collections
import dataclasses
import operator

LEAF = "*"
_NODES = {}  # type -> (flatten: x -> (children, aux, keys), unflatten: (aux, children) -> x)


def register(node_type, flatten, unflatten):
    """Make `node_type` a pytree node (JAX's register_pytree_node): flatten(x) -> (children,
    aux) with aux hashable, unflatten(aux, children) -> x. Children are named by index. A type
    is registered once (a second registration would change the trees already cached)."""
    if not isinstance(node_type, type):
        raise TypeError(f"register: node_type must be a class, got {node_type!r}")
    if node_type in (dict, list, tuple, type(None)) or node_type in _NODES:
        raise ValueError(f"register: {node_type.__name__} is a pytree node already")
    if not (callable(flatten) and callable(unflatten)):
        raise TypeError(f"register: flatten and unflatten must be callables, got {type(flatten).__name__} "
                        f"and {type(unflatten).__name__}")
    name = node_type.__name__

    def flat(x):
        out = flatten(x)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(f"tree.register: {name}'s flatten must return (children, aux), got {type(out).__name__}")
        children = tuple(out[0])
        return children, out[1], tuple(range(len(children)))
    _NODES[node_type] = (flat, unflatten)


def _register_dataclass(cls):
    """A dataclass's fields are its children, but fields with metadata {"static": True}, which
    go into aux (so a new static value is a new signature)."""
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = tuple(f.name for f in fields if not f.metadata.get("static"))
    statics = tuple(f.name for f in fields if f.metadata.get("static"))

    def flat(x):
        return tuple(getattr(x, n) for n in names), tuple(getattr(x, n) for n in statics), names

    def build(aux, children):
        return cls(**dict(zip(names, children)), **dict(zip(statics, aux)))
    _NODES[cls] = (flat, build)


_NODES[collections.OrderedDict] = (lambda d: (tuple(d.values()), tuple(d), tuple(d)),
                                   lambda keys, children: collections.OrderedDict(zip(keys, children)))


def flatten(tree):
    """Return (leaves, treedef)."""
    leaves = []
    return leaves, _flatten(tree, leaves)


def _flatten(tree, leaves):
    t = type(tree)  # exact-type check first: flatten runs on every call of a compiled step
    if t is list or t is tuple:
        return (t.__name__, len(tree), tuple([_flatten(x, leaves) for x in tree]))
    node = _NODES.get(t)
    if node is None and dataclasses.is_dataclass(t):
        _register_dataclass(t)
        node = _NODES[t]
    if node is not None:
        children, aux, keys = node[0](tree)
        meta = (t, aux, keys)
        try:
            hash(meta)
        except TypeError:
            raise TypeError(f"a {t.__name__}'s static part {aux!r} is not hashable; it is part of the "
                            "compile-cache key") from None
        return ("node", meta, tuple([_flatten(x, leaves) for x in children]))
    if isinstance(tree, dict):
        keys = _sorted_keys(tree)
        return ("dict", tuple(keys), tuple([_flatten(tree[k], leaves) for k in keys]))
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return ("namedtuple", t, tuple([_flatten(x, leaves) for x in tree]))
    if isinstance(tree, (list, tuple)):
        return ("list" if isinstance(tree, list) else "tuple", len(tree), tuple([_flatten(x, leaves) for x in tree]))
    if tree is None:
        return ("none",)
    leaves.append(tree)
    return LEAF


def _sorted_keys(d):
    """Sorted keys; keys of mixed types (1 and "a") sort by type name first, then value."""
    try:
        return sorted(d)
    except TypeError:
        return sorted(d, key=lambda k: (type(k).__name__, k))


def unflatten(treedef, leaves):
    """Inverse of flatten: rebuild the tree from its treedef and leaves."""
    it = iter(leaves)
    out = _unflatten(treedef, it)
    if next(it, LEAF) is not LEAF:
        raise ValueError("too many leaves for treedef")
    return out


def _unflatten(td, it):
    if td == LEAF:
        return next(it)
    kind = td[0]
    if kind == "none":
        return None
    if kind == "dict":
        return {k: _unflatten(c, it) for k, c in zip(td[1], td[2])}
    children = [_unflatten(c, it) for c in td[2]]
    if kind == "node":
        return _NODES[td[1][0]][1](td[1][1], children)
    if kind == "namedtuple":
        return td[1](*children)
    return tuple(children) if kind == "tuple" else children


def num_leaves(treedef):
    if treedef == LEAF:
        return 1
    return sum(num_leaves(c) for c in treedef[2]) if treedef[0] != "none" else 0


def leaf_paths(treedef):
    """Each leaf's key path (dict keys and sequence indices, root first), in flatten order."""
    if treedef == LEAF:
        return [()]
    if treedef[0] == "none":
        return []
    kind = treedef[0]
    keys = treedef[1] if kind == "dict" else treedef[1][2] if kind == "node" else range(len(treedef[2]))
    return [(k,) + path for k, child in zip(keys, treedef[2]) for path in leaf_paths(child)]


def to_data(treedef):
    """The treedef as JSON-ready lists (an exported library's name.json); from_data inverts it.
    A namedtuple's class cannot be written down without importing it again: refused."""
    if treedef == LEAF:
        return LEAF
    kind = treedef[0]
    if kind == "none":
        return [kind]
    if kind in ("namedtuple", "node"):
        cls = treedef[1] if kind == "namedtuple" else treedef[1][0]
        what = "namedtuple" if kind == "namedtuple" else "pytree node"
        raise TypeError(f"a {what} ({cls.__name__}) cannot be written as data; use a tuple or a dict")
    if kind == "dict" and not all(type(k) in (str, int) for k in treedef[1]):
        raise TypeError(f"dict keys {treedef[1]!r} cannot be written as data; use str or int keys")
    return [kind, list(treedef[1]) if kind == "dict" else treedef[1], [to_data(c) for c in treedef[2]]]


def from_data(data):
    """Inverse of to_data: the treedef, equal to the one flatten makes of the same tree."""
    if data == LEAF:
        return LEAF
    if data[0] == "none":
        return ("none",)
    return (data[0], tuple(data[1]) if data[0] == "dict" else data[1], tuple(from_data(c) for c in data[2]))


def tree_map(fn, tree, *rest):
    leaves, td = flatten(tree)
    others = []
    for r in rest:
        values, other = flatten(r)
        if other != td:
            raise ValueError(f"tree_map: trees of different structures:\n  {td}\n  {other}")
        others.append(values)
    return unflatten(td, [fn(*xs) for xs in zip(leaves, *others)])


def top_level(treedef):
    """The children of a top-level tuple/list output, or the whole tree as one child."""
    if treedef != LEAF and treedef[0] in ("tuple", "list"):
        return list(treedef[2])
    return [treedef]


def unflattener(treedef):
    """A function leaves -> tree for one treedef, generated once: rebuilding results is per-call work."""
    source, consts = rebuild_source(treedef)
    return eval(f"lambda o: {source}", {"c": consts})  # noqa: S307 (names and ints only)


def rebuild_source(treedef, given=None):
    """(expression, constants): the tree of treedef over the leaves list `o`, the constants read
    as c[k]. given: {index of a child of a top-level tuple or list: an expression to place there
    as it is (its leaves are skipped)}, e.g. over a caller's arguments (jit's fast path)."""
    given, consts = given or {}, []

    def expr(td, counter, top=False):
        if td == LEAF:
            counter[0] += 1
            return f"o[{counter[0] - 1}]"
        kind = td[0]
        if kind == "none":
            return "None"
        if kind == "dict" and len(td[2]) >= 16 and all(ch == LEAF for ch in td[2]):  # zip: no bytecode a key
            consts.append(td[1])
            counter[0] += len(td[2])
            return f"dict(zip(c[{len(consts) - 1}], o[{counter[0] - len(td[2])}:{counter[0]}]))"
        if kind == "dict":
            return "{" + ", ".join(f"{key(k)}: {expr(ch, counter)}" for k, ch in zip(td[1], td[2])) + "}"
        items = []
        for j, ch in enumerate(td[2]):
            if top and j in given and kind in ("tuple", "list"):
                counter[0] += num_leaves(ch)
                items.append(given[j])
            else:
                items.append(expr(ch, counter))
        if kind == "namedtuple":
            consts.append(td[1])
            return f"c[{len(consts) - 1}](" + ", ".join(items) + ")"
        if kind == "node":
            consts.append(lambda *children, build=_NODES[td[1][0]][1], aux=td[1][1]: build(aux, list(children)))
            return f"c[{len(consts) - 1}](" + ", ".join(items) + ")"
        body = ", ".join(items)
        return f"({body},)" if kind == "tuple" and len(items) == 1 else f"({body})" if kind == "tuple" else f"[{body}]"

    def key(k):  # a str key as a literal (the fastest to load), any other from the constants
        if type(k) is str:
            return repr(k)
        consts.append(k)
        return f"c[{len(consts) - 1}]"

    return expr(treedef, [0], top=True), consts


_CONTAINERS = (dict, list, tuple, type(None))


def _leaves_if(tree, treedef):
    """tree's leaves if its treedef is exactly `treedef`, else None."""
    leaves, td = flatten(tree)
    return leaves if td == treedef else None


def flattener(treedef, leaves_checked=True):
    """A function tree -> leaves for trees of exactly this treedef (None for any other tree).

    Generated once per treedef, it checks each container's size and reads the leaves by direct
    indexing (a dict's values by one itemgetter: a missing key is a KeyError, so a dict of the
    right size and every key has exactly these keys; a list, tuple, string or array where a dict
    was fails its lookups; lists and tuples are checked by exact type): several times faster
    than `flatten` for the parameter trees that a training step receives on every call (a type
    check per dict cost a GPT's call 1 us of 6). An object that is no dict but answers these
    keys at this length is read as the dict it mimics. With leaves_checked=False a container
    where a leaf was is not caught (the caller checks leaves).
    """
    lines, consts, names = [], [], iter(range(1 << 30))

    def visit(td, var):
        if td == LEAF:
            return [var]
        kind = td[0]
        if kind == "none":
            lines.append(f"if {var} is not None: return None")
            return []
        if kind == "node":  # flattened in full, then compared: registered nodes are rare in hot loops
            consts.append(lambda x, td=td: _leaves_if(x, td))
            values = f"v{next(names)}"
            lines.extend([f"{values} = c[{len(consts) - 1}]({var})", f"if {values} is None: return None"])
            return [f"*{values}"]
        if kind == "dict":
            keys = td[1]
            lines.append(f"if len({var}) != {len(keys)}: return None")
            if len(keys) < 16 and all(type(k) is str for k in keys):  # literal subscripts beat a call
                children = [f"{var}[{k!r}]" for k in keys]
            else:
                consts.append(operator.itemgetter(*keys) if len(keys) > 1 else lambda d, k=keys: tuple(d[x] for x in k))
                values = f"v{next(names)}"
                lines.append(f"{values} = c[{len(consts) - 1}]({var})")
                children = [f"{values}[{j}]" for j in range(len(keys))]
                if all(child == LEAF for child in td[2]):
                    return [f"*{values}"]
        else:
            check = {"list": "list", "tuple": "tuple"}.get(kind)
            if check is None:
                consts.append(td[1])
                check = f"c[{len(consts) - 1}]"
            lines.append(f"if type({var}) is not {check} or len({var}) != {len(td[2])}: return None")
            children = [f"{var}[{j}]" for j in range(len(td[2]))]
        out = []
        for child, read in zip(td[2], children):
            if child == LEAF:
                out.append(read)
                continue
            name = f"v{next(names)}"
            lines.append(f"{name} = {read}")
            out += visit(child, name)
        return out

    leaves = visit(treedef, "t")
    last = "None if any(type(x) in leaf_bad for x in out) else out" if leaves_checked else "out"
    body = "\n        ".join(lines + [f"out = [{', '.join(leaves)}]", f"return {last}"])
    scope = {"c": consts, "leaf_bad": _CONTAINERS}
    exec(f"def flat(t):\n    try:\n        {body}\n    except (KeyError, TypeError, IndexError, ValueError):\n"
         "        return None\n", scope)
    return scope["flat"]
