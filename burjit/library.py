"""`burjit.load("dir/name")`: an exported step (export.py) as a Python callable, on ctypes and numpy alone.

Before any of the library's code runs, name.json's promises are checked: the .so's SHA-256 (a
truncated or foreign file is refused, never dlopen'ed), the machine (a library for another
architecture), the instruction sets the code was built for against this CPU's (a clear error
instead of SIGILL), and the entry symbol. A call flattens its arguments as the compiled step
does, checks each leaf's shape and dtype against the library's, and returns the same pytree;
an index out of range raises IndexError having changed no argument. This module imports no
part of the compiler, so a process that only loads steps never imports llvmlite or networkx.
"""

import ctypes
import hashlib
import json
import platform
import threading
from pathlib import Path

import numpy as np

from . import arena, pytree
from .errors import out_of_range

# LLVM's names for the x86 instruction sets our numeric code may use -> Linux's /proc/cpuinfo flags.
# Other target features (xsave, shstk, rdrnd, ...) are not emitted by burjit's kernels: unchecked.
X86_FEATURES = {
    "64bit": "lm", "cmov": "cmov", "mmx": "mmx", "sse": "sse", "sse2": "sse2", "sse3": "pni", "ssse3": "ssse3",
    "sse4.1": "sse4_1", "sse4.2": "sse4_2", "sse4a": "sse4a", "popcnt": "popcnt", "lzcnt": "abm", "bmi": "bmi1",
    "bmi2": "bmi2", "movbe": "movbe", "f16c": "f16c", "fma": "fma", "fma4": "fma4", "avx": "avx", "avx2": "avx2",
    "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512bw": "avx512bw", "avx512dq": "avx512dq",
    "avx512vl": "avx512vl", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi", "avx512vbmi2": "avx512_vbmi2",
    "avx512vnni": "avx512_vnni", "avx512bitalg": "avx512_bitalg", "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16", "avxvnni": "avx_vnni", "gfni": "gfni",
    "vaes": "vaes", "vpclmulqdq": "vpclmulqdq", "aes": "aes", "pclmul": "pclmulqdq",
}
_MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}


class LibraryError(ValueError):
    """An exported library that cannot be loaded here (missing, altered, or built for another CPU)."""


def load(path):
    """The exported step at `path` ("dir/name", as given to burjit.export) as a callable."""
    return Library(path)


class Library:
    """A loaded step: call it with the arguments' pytree; `describe` holds name.json.

    One arena per Library, so calls are serialised by a lock; load the library again for a
    thread of its own (its `.so` is mapped once)."""

    def __init__(self, path):
        path = Path(path)
        desc_file, so = path.with_suffix(".json"), path.with_suffix(".so")
        try:
            self.describe = desc = json.loads(desc_file.read_text())
            symbol, want = desc["symbol"], desc["library_sha256"]
        except FileNotFoundError:
            raise LibraryError(f"burjit.load: no {desc_file} (burjit.export writes it beside the library)") from None
        except (ValueError, KeyError, TypeError) as e:
            raise LibraryError(f"burjit.load: {desc_file} is not an exported step's description ({e})") from None
        if want is None:
            raise LibraryError(f"burjit.load: {so.name} was not linked when {path.name} was exported (no C "
                               "compiler); export it again where `cc` is found")
        try:
            data = so.read_bytes()
        except FileNotFoundError:
            raise LibraryError(f"burjit.load: no {so}") from None
        if hashlib.sha256(data).hexdigest() != want:
            raise LibraryError(f"burjit.load: {so} is not the library {desc_file.name} describes (truncated, "
                               "rebuilt or replaced); export the step again")
        _check_cpu(desc["target"], so)
        lib = ctypes.CDLL(str(so.resolve()))
        self._fn = getattr(lib, symbol)
        self._fn.restype, self._fn.argtypes = ctypes.c_int32, [ctypes.c_void_p]
        self._in_tree = pytree.from_data(desc["in_tree"])
        self._out = pytree.unflattener(pytree.from_data(desc["out_tree"]))
        self._inputs = [(x["name"], tuple(x["shape"]), np.dtype(x["dtype"])) for x in desc["inputs"]]
        self._outputs = [(tuple(x["shape"]), np.dtype(x["dtype"]), x["written_into_input"]) for x in desc["outputs"]]
        self._donated = {x["written_into_input"] for x in desc["outputs"]} - {None}
        self._arena = arena.zeroed(desc["arena_bytes"], desc["arena_align"])
        self._argv = (ctypes.c_void_p * (len(self._inputs) + len(self._outputs) + 1))()
        self._argv[-1] = self._arena.ctypes.data
        self._lock = threading.Lock()

    def __call__(self, *args):
        leaves, tree = pytree.flatten(args)
        if tree != self._in_tree:
            raise TypeError(f"{self.describe['name']}: the arguments' structure {tree} is not the exported step's "
                            f"{self._in_tree}")
        inputs = [self._input(k, x) for k, x in enumerate(leaves)]
        outs = [inputs[into] if into is not None else np.empty(shape, dtype) for shape, dtype, into in self._outputs]
        argv = self._argv
        with self._lock:
            for k, a in enumerate(inputs + outs):
                argv[k] = a.ctypes.data
            rc = self._fn(argv)
        if rc:
            raise IndexError(self._message(rc, inputs))
        return self._out(outs)

    def _input(self, k, x):
        """Leaf k as the library takes it: of its shape and dtype exactly, C order (and writable
        where donated), copied only when it is not so already."""
        name, shape, dtype = self._inputs[k]
        a = np.asarray(x)
        if a.shape != shape or a.dtype != dtype:
            raise TypeError(f"{self.describe['name']}: argument {name} is {a.dtype}{list(a.shape)}, the exported "
                            f"step takes {dtype}{list(shape)}")
        if not a.flags.c_contiguous or (k in self._donated and not a.flags.writeable):
            a = np.array(a, order="C")
        return a

    def _message(self, rc, inputs):
        e = self.describe["errors"][rc - 1]
        k = e["input"]
        return out_of_range(e["axis_size"], e["op"], e["src"], inputs[k] if k is not None else None)


def _check_cpu(target, so):
    """Refuse a library built for another machine or for instruction sets this CPU lacks."""
    built = target["triple"].split("-")[0]
    here = platform.machine().lower()
    here = _MACHINES.get(here, here)
    if built != here:
        raise LibraryError(f"burjit.load: {so.name} was built for {built}, this machine is {here}")
    if here != "x86_64":
        return
    flags = _cpu_flags()
    if flags is None:  # no /proc/cpuinfo (not Linux): the instruction sets cannot be checked
        return
    needed = [f[1:] for f in target["features"].split(",") if f.startswith("+") and f[1:] in X86_FEATURES]
    missing = [f for f in needed if X86_FEATURES[f] not in flags]
    if missing:
        raise LibraryError(f"burjit.load: {so.name} was built for {target['cpu']} and uses instructions this CPU "
                           f"lacks ({', '.join(missing)}); export the step again on (or for) this machine")


def _cpu_flags():
    """This CPU's feature flags, as Linux lists them, or None where it does not."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return None
