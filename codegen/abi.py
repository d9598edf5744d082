"""The few CPython and numpy object layouts the step's entry function relies on, probed at import.

With them the entry reads buffer pointers straight out of the Python lists of input and output
arrays and is itself a METH_FASTCALL builtin, so a call costs one Python-level call instead of
a ctypes round trip per array (`a.ctypes.data` alone takes over a microsecond). The fields are
fixed parts of the C structs (PyObject.ob_refcnt, PyListObject.ob_item, PyArrayObject.data);
the probe checks them on real objects, and where they do not hold `OFFSETS` is None and the
executable takes the portable ctypes path instead.
"""

import ctypes
import sys

import numpy as np

_WORD = ctypes.sizeof(ctypes.c_void_p)
METH_FASTCALL = 0x80


def _probe():
    """(offset of PyListObject.ob_item, offset of PyArrayObject.data) if they hold here, else None."""
    list_items, array_data = 3 * _WORD, 2 * _WORD  # after PyObject_VAR_HEAD / PyObject_HEAD
    arrays = [np.zeros(3), np.zeros((2, 2), dtype=np.int32)]
    if ctypes.c_ssize_t.from_address(id(arrays)).value != sys.getrefcount(arrays) - 1:
        return None  # ob_refcnt is not a plain first-word count (e.g. a free-threaded build)
    items = ctypes.c_void_p.from_address(id(arrays) + list_items).value
    ok = items and all(ctypes.c_void_p.from_address(items + k * _WORD).value == id(a)
                       and ctypes.c_void_p.from_address(id(a) + array_data).value == a.ctypes.data
                       for k, a in enumerate(arrays))
    return (list_items, array_data) if ok else None


OFFSETS = _probe()


class _MethodDef(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("meth", ctypes.c_void_p), ("flags", ctypes.c_int),
                ("doc", ctypes.c_char_p)]


_new_function = ctypes.pythonapi.PyCFunction_NewEx
_new_function.restype = ctypes.py_object
_new_function.argtypes = [ctypes.POINTER(_MethodDef), ctypes.py_object, ctypes.py_object]


class Builtin:
    """A METH_FASTCALL builtin function object around native code at `address`."""

    def __init__(self, address, name):
        self._def = _MethodDef(name.encode(), address, METH_FASTCALL, None)  # must outlive the function
        self.function = _new_function(ctypes.byref(self._def), None, None)
