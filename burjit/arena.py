"""A step's arena: zero-filled bytes at the memory plan's alignment.

The native step (codegen/native.py) and a loaded library (library.py) allocate it alike; this
module imports only numpy, so burjit.load stays free of the compiler.
"""

import numpy as np


def zeroed(nbytes, align):
    """nbytes of zeros starting at a multiple of align (numpy's own allocation guarantees less)."""
    raw = np.zeros(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + nbytes]
