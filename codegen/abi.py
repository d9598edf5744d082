"""Where CPython keeps a list's item array and numpy an array's data pointer, probed at import.

With these offsets the step's entry function reads the buffer pointers straight out of the
Python lists of input and output arrays, so a call costs one ctypes call instead of a
ctypes round trip per array (`a.ctypes.data` alone takes over a microsecond). Both are
fixed fields of the C structs (PyListObject.ob_item, PyArrayObject.data); the probe checks
them on real objects, and on a build where they do not hold, `OFFSETS` is None and the
executable fills the pointer array from Python instead.
"""

import ctypes

import numpy as np

_WORD = ctypes.sizeof(ctypes.c_void_p)


def _probe():
    """(offset of PyListObject.ob_item, offset of PyArrayObject.data) if they hold here, else None."""
    list_items, array_data = 3 * _WORD, 2 * _WORD  # after PyObject_VAR_HEAD / PyObject_HEAD
    arrays = [np.zeros(3), np.zeros((2, 2), dtype=np.int32)]
    items = ctypes.c_void_p.from_address(id(arrays) + list_items).value
    ok = items and all(ctypes.c_void_p.from_address(items + k * _WORD).value == id(a)
                       and ctypes.c_void_p.from_address(id(a) + array_data).value == a.ctypes.data
                       for k, a in enumerate(arrays))
    return (list_items, array_data) if ok else None


OFFSETS = _probe()
