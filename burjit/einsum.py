"""numpy.einsum on traced values, as transposes, reshapes, sums and one matmul per pair of operands.

A pair contracts as one (batched) matmul, not a broadcast product summed: the product would
materialise batch x M x K x N elements, the matmul reads each operand once. Operands contract
left to right; an index needed by no later operand nor the output is summed as soon as it can
be, and a size-1 axis facing a longer one (numpy broadcasts those) is dropped, not copied.
"""

import math

from . import ops as F
from .errors import ShapeError
from .tracer import describe, user_src


def _error(msg):
    return ShapeError(f"{describe(user_src())}\n  einsum: {msg}")


def _subscripts(term, where):
    """A term's letters, with -1 standing for its '...'."""
    letters = term.replace("...", "")
    if term.count("...") > 1 or not all(c.isascii() and c.isalpha() for c in letters):
        raise _error(f"bad subscripts {term!r} in {where}: use letters and at most one '...'")
    return [-1 if c == "." else c for c in term.replace("...", ".")]


def _parse(spec, xs):
    """(labels per operand, output labels): letters, and ints for the broadcast '...' axes
    (numbered so that every operand's '...' lines up on the right, as numpy broadcasts)."""
    if not isinstance(spec, str):
        raise TypeError(f"{describe(user_src())}\n  einsum: the first argument must be the subscripts string")
    ins, arrow, out = spec.replace(" ", "").partition("->")
    terms = [_subscripts(t, "the operands") for t in ins.split(",")]
    if len(terms) != len(xs):
        raise _error(f"{spec!r} names {len(terms)} operand(s), got {len(xs)}")
    dots = []
    for k, (t, x) in enumerate(zip(terms, xs)):
        dots.append(x.ndim - len(t) + (-1 in t))
        if dots[-1] < 0 or (dots[-1] and -1 not in t):
            raise _error(f"operand {k} has shape {x.shape}, subscripts {ins.split(',')[k]!r} name "
                         f"{len(t) - (-1 in t)} axes")
    n_dots = max(dots, default=0)
    labels = [[d for e in t for d in (range(n_dots - n, n_dots) if e == -1 else [e])] for t, n in zip(terms, dots)]
    letters = [c for ls in labels for c in ls if isinstance(c, str)]
    if not arrow:
        return labels, list(range(n_dots)) + sorted(c for c in set(letters) if letters.count(c) == 1)
    o = _subscripts(out, "the output")
    if -1 not in o and n_dots:
        raise _error(f"the operands have '...' axes, the output {out!r} has no '...'")
    o = [d for e in o for d in (range(n_dots) if e == -1 else [e])]
    for c in o:
        if o.count(c) > 1 or c not in letters and isinstance(c, str):
            raise _error(f"output index {c!r} " + ("repeats" if o.count(c) > 1 else "is in no operand"))
    return labels, o


def _sizes(xs, labels):
    sizes, first = {}, {}
    for k, (x, ls) in enumerate(zip(xs, labels)):
        for c, n in zip(ls, x.shape):
            if len({m for d, m in zip(ls, x.shape) if d == c}) > 1:
                raise _error(f"index {c!r} repeats in operand {k} (shape {x.shape}) with different sizes")
            if n != 1 and sizes.get(c, 1) not in (1, n):
                name = f"index {c!r}" if isinstance(c, str) else "a '...' axis"
                raise _error(f"{name} has size {sizes[c]} in operand {first[c]} and {n} in operand {k}")
            if n != 1 or c not in sizes:
                sizes[c], first[c] = n, k
    return sizes


def _prepare(x, ls, sizes):
    """Drop size-1 axes that broadcast, and take the diagonal of a repeated index ('ii->i')."""
    keep = [i for i, (c, n) in enumerate(zip(ls, x.shape)) if n != 1 or sizes[c] == 1]
    if len(keep) < len(ls):
        x, ls = F.reshape(x, tuple(x.shape[i] for i in keep)), [ls[i] for i in keep]
    while len(set(ls)) < len(ls):
        c = next(c for c in ls if ls.count(c) > 1)
        i, j = [k for k, d in enumerate(ls) if d == c][:2]
        n = x.shape[i]
        rest = [k for k in range(len(ls)) if k not in (i, j)]
        x = F.reshape(F.transpose(x, rest + [i, j]), tuple(x.shape[k] for k in rest) + (n * n,))
        x, ls = x[..., ::n + 1], [ls[k] for k in rest] + [c]  # (i, i) sits n + 1 apart in the flat pair
    return x, ls


def _sum_unneeded(x, ls, needed):
    axes = tuple(i for i, c in enumerate(ls) if c not in needed)
    return (F.sum(x, axes) if axes else x), [c for c in ls if c in needed]


def _order(x, ls, new):
    return F.transpose(x, tuple(ls.index(c) for c in new))


def _contract(a, la, b, lb, needed, sizes):
    """The pair as one matmul: a -> (batch, left, summed), b -> (batch, summed, right)."""
    a, la = _sum_unneeded(a, la, needed | set(lb))
    b, lb = _sum_unneeded(b, lb, needed | set(la))
    batch = [c for c in la if c in lb and c in needed]
    summed = [c for c in la if c in lb and c not in needed]
    left, right = [c for c in la if c not in lb], [c for c in lb if c not in la]
    def n(cs):
        return math.prod(sizes[c] for c in cs)
    lead = (n(batch),) if batch else ()
    a = F.reshape(_order(a, la, batch + left + summed), lead + (n(left), n(summed)))
    b = F.reshape(_order(b, lb, batch + summed + right), lead + (n(summed), n(right)))
    out = F.matmul(a, b)
    return F.reshape(out, tuple(sizes[c] for c in batch + left + right)), batch + left + right


def einsum(spec, *operands):
    """numpy.einsum: explicit ('ij,jk->ik') and implicit ('ij,jk') subscripts, '...' broadcasting,
    repeated indices (diagonals, traces). With two or more operands the values are computed in
    one float dtype (matmul's), so integer operands give float64, where numpy keeps integers."""
    xs = F._promote([F.lift(x) for x in operands], floating=len(operands) > 1) if operands else []
    labels, out = _parse(spec, xs)
    sizes = _sizes(xs, labels)
    acc, la = _prepare(xs[0], labels[0], sizes)
    for k in range(1, len(xs)):
        b, lb = _prepare(xs[k], labels[k], sizes)
        needed = set(out).union(*labels[k + 1:])
        acc, la = _contract(acc, la, b, lb, needed, sizes)
    acc, la = _sum_unneeded(acc, la, set(out))
    return _order(acc, la, out)
