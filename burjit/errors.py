"""Errors raised to users. Each message names the user's file:line where it can."""


class TracingError(Exception):
    """The step cannot be traced as written (Python control flow on a traced value, bad types...)."""


class ShapeError(TracingError, ValueError):
    """Operand shapes or dtypes do not fit the operation."""


class AxisError(ShapeError, IndexError):
    """An axis out of range for the array's rank (an IndexError and a ValueError, as numpy's)."""
