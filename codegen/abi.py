"""The few CPython and numpy object layouts the step's entry function relies on, probed at import.

With them the entry reads buffer pointers straight out of the Python lists of input and output
arrays and is itself a METH_FASTCALL builtin, so a call costs one Python-level call instead of
a ctypes round trip per array (`a.ctypes.data` alone takes over a microsecond). It also checks
each input as the Python front door would (exact ndarray type, dimensions, dtype, C order,
writable if donated) and reads a numpy scalar's value in place, so a call with an unchanged
signature does no per-leaf Python work (jit.py). The fields are fixed parts of the C structs
(PyObject.ob_type, PyListObject.ob_item, PyArrayObject's data, nd, dimensions, descr and flags,
a numpy scalar's value right after its PyObject header); the probe checks them on real
objects, and where they do not hold `OFFSETS` is None and the executable takes the portable
ctypes path instead.
"""

import ctypes
import sys
from typing import NamedTuple

import numpy as np

_WORD = ctypes.sizeof(ctypes.c_void_p)
METH_FASTCALL = 0x80
C_CONTIGUOUS, WRITEABLE = 0x1, 0x400  # PyArrayObject.flags bits (numpy's NPY_ARRAY_*)


class Layout(NamedTuple):
    """Byte offsets into CPython and numpy objects."""
    ob_type: int = _WORD                  # PyObject.ob_type
    list_items: int = 3 * _WORD           # PyListObject.ob_item, after PyObject_VAR_HEAD
    array_data: int = 2 * _WORD           # PyArrayObject.data, after PyObject_HEAD
    array_nd: int = 3 * _WORD             # .nd (int)
    array_dims: int = 4 * _WORD           # .dimensions (npy_intp *)
    array_descr: int = 7 * _WORD          # .descr, after .strides and .base
    array_flags: int = 8 * _WORD          # .flags (int)
    scalar_value: int = 2 * _WORD         # a numpy scalar's value, after PyObject_HEAD


def _probe():
    """The Layout if it holds here, else None."""
    at = Layout()
    word = lambda addr: ctypes.c_void_p.from_address(addr).value or 0  # noqa: E731
    arrays = [np.zeros(3), np.zeros((2, 5), dtype=np.int32)[:, ::2], np.zeros((), dtype=np.float32)]
    arrays[2].setflags(write=False)
    if ctypes.c_ssize_t.from_address(id(arrays)).value != sys.getrefcount(arrays) - 1:
        return None  # ob_refcnt is not a plain first-word count (e.g. a free-threaded build)
    items = word(id(arrays) + at.list_items)
    for k, a in enumerate(arrays):
        o = id(a)
        flags = ctypes.c_int.from_address(o + at.array_flags).value
        if not (items and word(items + k * _WORD) == o and word(o + at.ob_type) == id(np.ndarray)
                and word(o + at.array_data) == a.ctypes.data and word(o + at.array_descr) == id(a.dtype)
                and ctypes.c_int.from_address(o + at.array_nd).value == a.ndim
                and all(ctypes.c_ssize_t.from_address(word(o + at.array_dims) + 8 * d).value == n
                        for d, n in enumerate(a.shape))
                and bool(flags & C_CONTIGUOUS) == a.flags.c_contiguous
                and bool(flags & WRITEABLE) == a.flags.writeable):
            return None
    for t in (np.float64, np.float32, np.int64, np.int32, np.bool_):
        x = t(1)
        if ctypes.string_at(id(x) + at.scalar_value, x.itemsize) != x.tobytes():
            return None
    return at


OFFSETS = _probe()


class _MethodDef(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("meth", ctypes.c_void_p), ("flags", ctypes.c_int),
                ("doc", ctypes.c_char_p)]


_new_function = ctypes.pythonapi.PyCFunction_NewEx
_new_function.restype = ctypes.py_object
_new_function.argtypes = [ctypes.POINTER(_MethodDef), ctypes.py_object, ctypes.py_object]


def builtin(address, name, owner):
    """A METH_FASTCALL builtin function object around native code at `address` that keeps its
    method def and `owner` (what holds the code) alive as its __self__. CPython reads the def
    whenever it traverses or frees the function, which may be after whatever made it is gone
    (a reference cycle collected in any order, interpreter shutdown): a def freed first is a
    use after free, and code freed first a jump into unmapped memory."""
    method = _MethodDef(name.encode(), address, METH_FASTCALL, None)
    return _new_function(ctypes.byref(method), (method, owner), None)
