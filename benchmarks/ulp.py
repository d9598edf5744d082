"""Max error in ulp of the native math functions on dense sweeps: `python -m benchmarks.ulp`.

Each sweep has 2^20 or more points: linear and log-spaced over the range, both signs, dense
where a formula switches. The reference is numpy in a wider type (float64 for float32, long
double for float64 where it is wider), the error is in ulp of the reference rounded to the
dtype (subnormal results in ulp of the smallest subnormal). codegen/mathfns.py quotes these
numbers and tests/test_codegen.py holds them to bounds.
"""

import numpy as np

import burjit
from burjit import ops as F

WIDE = {"float32": np.float64, "float64": np.longdouble if np.finfo(np.longdouble).nmant > 52 else None}


def _dense(dtype, lo, hi, n=1 << 18):
    """n points each: linear over [lo, hi], log-spaced from the smallest normal to hi and to lo."""
    tiny = float(np.finfo(dtype).tiny)
    pieces = [np.linspace(lo, hi, n), np.geomspace(tiny, hi, n), -np.geomspace(tiny, -lo, n)]
    return np.concatenate(pieces).astype(dtype)


def sweeps(dtype):
    """{name: (traced function, numpy reference, arguments)}."""
    sat, under = {"float64": (20.0, 800.0), "float32": (10.0, 110.0)}[dtype]  # tanh is 1 beyond, softplus 0 below
    big = 0.99 * np.log(np.finfo(dtype).max)
    small = np.linspace(0.0, 0.6, 1 << 18).astype(dtype)  # tanh's switch at 0.3, exp's reduction at ln2/2
    near_minus_one = np.concatenate([_dense(dtype, -1.0, 1e30), small - 1])
    return {"tanh": (F.tanh, np.tanh, np.concatenate([_dense(dtype, -sat, sat), small, -small])),
            "softplus": (F.softplus, lambda x: np.logaddexp(x.dtype.type(0), x), _dense(dtype, -under, 50.0)),
            "log1p": (F.log1p, np.log1p, near_minus_one[near_minus_one > -1]),
            "exp": (F.exp, np.exp, _dense(dtype, -big, big)),
            "log": (F.log, np.log, np.abs(_dense(dtype, -1e30, 1e30))),
            "expm1": (F.expm1, np.expm1, np.concatenate([_dense(dtype, -big, big), small, -small])),
            "cos": (F.cos, np.cos, _dense(dtype, -1e4, 1e4)),  # libm's; schedules take cos of [0, pi]
            "sin": (F.sin, np.sin, _dense(dtype, -1e4, 1e4))}


def max_ulps(dtype):
    """{name: (max error in ulp, an argument where it occurs)}; needs WIDE[dtype]."""
    wide, cases = WIDE[dtype], sweeps(dtype)
    fns = [f for f, _, _ in cases.values()]
    got = burjit.compile(lambda *xs: [f(x) for f, x in zip(fns, xs)])(*[x for _, _, x in cases.values()])
    worst = {}
    for (name, (_, ref, x)), g in zip(cases.items(), got):
        with np.errstate(all="ignore"):
            w = ref(x.astype(wide))
        err = np.abs(g.astype(wide) - w) / np.spacing(np.abs(w.astype(dtype))).astype(wide)
        if not np.isfinite(err).all():
            raise ValueError(f"{name}: a sweep point has a non-finite result or reference")
        worst[name] = (float(np.max(err)), x[np.argmax(err)].item())
    return worst


def main():
    for dtype in ("float64", "float32"):
        if WIDE[dtype] is None:
            print(f"{dtype}: no wider type for the reference here")
            continue
        for name, (err, at) in max_ulps(dtype).items():
            print(f"{dtype}  {name:9s} max {err:.3f} ulp at x = {at!r}")


if __name__ == "__main__":
    main()
