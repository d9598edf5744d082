"""Correctness before timing: every framework's check values must agree, or it is not timed.

Values are compared key by key with a relative tolerance scaled to each key's largest magnitude
(so a gradient near zero in one entry is not held to a relative bound). The reference is the
workload's published numbers where it has them, else the framework that agrees with the most
others, so one wrong framework, burjit included, cannot make the rest look wrong.
"""

import numpy as np

RTOL = {"float64": 1e-6, "float32": 2e-3}
EXPECTED_RTOL = 1e-5  # published numbers are printed to 4 decimals


def disagreement(values, reference, rtol):
    """None when `values` match `reference` (dicts of number lists), else what differs and by how much."""
    missing = sorted(set(reference) ^ set(values))
    if missing:
        return f"keys differ: {', '.join(missing[:3])}"
    for key in sorted(reference):
        a = np.asarray(values[key], dtype=np.float64)
        b = np.asarray(reference[key], dtype=np.float64)
        if a.shape != b.shape:
            return f"{key}: shape {a.shape} != {b.shape}"
        scale = max(float(np.max(np.abs(b), initial=0.0)), 1e-30)
        err = np.abs(a - b)
        if not np.all(np.isfinite(a)) or np.any(err > rtol * scale):
            i = int(np.nanargmax(np.where(np.isfinite(err), err, np.inf)))
            return f"{key}[{i}] = {a.ravel()[i]:.6g}, expected {b.ravel()[i]:.6g}"
    return None


def judge(checks, dtype, expected=None):
    """{framework: None (agrees) or the reason it does not} for {framework: check values}."""
    rtol = RTOL[dtype]
    if expected is not None:
        return {fw: disagreement(v, expected, max(rtol, EXPECTED_RTOL)) for fw, v in checks.items()}
    names = list(checks)
    votes = {a: sum(disagreement(checks[a], checks[b], rtol) is None for b in names) for a in names}
    reference = max(names, key=lambda a: votes[a]) if names else None
    return {fw: disagreement(v, checks[reference], rtol) for fw, v in checks.items()}
