"""The record format of a scalar region: rows of int columns, read by tracing, grad and codegen.

A region (region.py) records each 0-d op as one row: a kind id (into the process-wide KINDS: op,
attrs, result dtype, operand dtypes) and up to three operand values. This module is the format
alone — what a backend may read (codegen/tape.py builds its tape from these columns, the
reference backend interprets them) — so backends need nothing of tracing.
"""

import hashlib
from array import array

import numpy as np

from . import primitives as P
from .graph import value_key

_NONE = {}  # the attrs of every record without any
IMPORT, CONST = "import", "const"
KINDS = []   # kind id -> (op, attrs, dtype, operand dtypes): what a record computes, for every region
_KIND_IDS = {}


def kind(op, attrs, dtype, dtypes):
    """The id of records of `op` with `attrs` from operands of `dtypes` to `dtype` (an IMPORT's or
    CONST's have no operands): ids are process-wide, so records are ints and the tape reads them
    as arrays."""
    key = (op, _key(attrs), dtype, dtypes)
    k = _KIND_IDS.get(key)
    if k is None:
        k = _KIND_IDS[key] = len(KINDS)
        KINDS.append((op, attrs or _NONE, dtype, dtypes))
    return k



class Records:
    """Columns, one row per value v: kinds[v] (an id into KINDS), its operand values a[v], b[v], c[v]
    (-1 past its arity; an IMPORT's a is its position among the values the region reads from
    outside it); `values` holds each CONST's value. ~16 bytes a value, where a graph node takes
    ~1.3 kB. `dtype`: the float dtype of the region's values (and the bools its comparisons make)."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.kinds, self.a, self.b, self.c = array("i"), array("i"), array("i"), array("i")
        self.values, self._digest = {}, None

    def __len__(self):
        return len(self.kinds)

    def __repr__(self):
        return f"<region of {len(self)} values, sha {self.digest()[:12]}>"

    def digest(self):
        """Content hash (the graph's fingerprint reads it through repr): same records, same code."""
        if self._digest is None or self._digest[0] != len(self):
            h = hashlib.sha256(repr((self.dtype, [KINDS[k][:3] + (_key(KINDS[k][1]),) for k in sorted(set(self.kinds))],
                                     sorted((v, value_key(x)) for v, x in self.values.items()))).encode())
            for col in (self.kinds, self.a, self.b, self.c):
                h.update(col.tobytes())
            self._digest = (len(self), h.hexdigest())
        return self._digest[1]

    def op(self, v):
        return KINDS[self.kinds[v]][0]

    def dtype_of(self, v):
        return KINDS[self.kinds[v]][2]

    def args(self, v):
        """The operand values of record v (an IMPORT's: its position among the imports)."""
        a, b, c = self.a[v], self.b[v], self.c[v]
        return () if a < 0 else (a,) if b < 0 else (a, b) if c < 0 else (a, b, c)


def evaluate(*imports, region, outputs):
    """numpy reference: each record by its primitive's reference, in its dtype."""
    r, vals = region, []
    with np.errstate(all="ignore"):
        for v in range(max(outputs, default=-1) + 1):
            op, attrs, dtype, _ = KINDS[r.kinds[v]]
            args = r.args(v)
            if op == IMPORT:
                vals.append(np.asarray(imports[args[0]], dtype=dtype))
            elif op == CONST:
                vals.append(np.asarray(r.values[v], dtype=dtype))
            else:
                vals.append(np.asarray(P.PRIMITIVES[op].ref(*[vals[a] for a in args], **attrs), dtype=dtype))
    return np.array([vals[v] for v in outputs], dtype=r.dtype).reshape(len(outputs))


def distinct(a):
    """The distinct values of int array a, sorted: np.unique's first call imports numpy.ma (15 ms
    of every small step's first call)."""
    a = np.sort(a, kind="stable")
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if len(a) else a


def _key(attrs):
    return tuple((k, value_key(v)) for k, v in sorted(attrs.items())) if attrs else ()
