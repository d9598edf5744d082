"""`import burjit.numpy as bnp`: the numpy-style traced functions of burjit.ops under numpy's name."""

from .ops import *  # noqa: F401,F403
from .ops import __all__  # noqa: F401
