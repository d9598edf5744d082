"""Errors raised to users. Each message names the user's file:line where it can."""


class TracingError(Exception):
    """The step cannot be traced as written (Python control flow on a traced value, bad types...)."""


class ShapeError(TracingError, ValueError):
    """Operand shapes or dtypes do not fit the operation."""


class AxisError(ShapeError, IndexError):
    """An axis out of range for the array's rank (an IndexError and a ValueError, as numpy's)."""


def out_of_range(size, op, src, indices=None):
    """The message for an index out of range in op (at the user's line src), as the native step
    and a loaded library give it: naming the first bad value when the indices are an input
    (`indices`, an array)."""
    where = f"{op} at {src}" if src else op
    if indices is not None:
        flat = indices.ravel()
        bad = flat[(flat < 0) | (flat >= size)]
        if bad.size:
            return f"index {bad[0]} is out of range for an axis of size {size} ({where})"
    return f"an index computed in the step is out of range for an axis of size {size} ({where})"
