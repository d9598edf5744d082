"""The `mlir` backend: the step's MLIR (mlir.py) lowered by upstream MLIR's tools, JIT-compiled by llvmlite.

A second, independent code generator for the same planned graph, so the differential tests
check native's codegen against code nobody here wrote. `mlir-opt` lowers linalg to loops and
every dialect to the LLVM dialect (PIPELINE), `mlir-translate` gives LLVM IR, which llvmlite
optimises and loads like a native kernel. The tools are found in $BURJIT_MLIR_TOOLS (a
directory), on PATH (also as Debian's `mlir-opt-19`), or in /usr/lib/llvm-*/bin.

The calling convention is MLIR's C interface: a pointer per buffer to its memref descriptor
(allocated pointer, aligned pointer, offset, sizes..., strides...). Contracts as native's: an index out of range (the step's
status word, mlir.py) raises IndexError after the step, which restores the donated inputs it
wrote in place (copied aside before the call, only for steps with gathers or scatters);
BURJIT_POISON_ARENA=1 fills the arena with 0xFF before each call. An allreduce calls this
process's MPI_Allreduce (bound by address when the step loads), its handles written into the
module's WORDS global: this backend caches nothing across processes.
"""

import ctypes
import glob
import os
import shutil
import subprocess
import tempfile

import numpy as np
from llvmlite import binding as llvm

from burjit import arena
from burjit.errors import out_of_range
from burjit.passes import pipeline
from burjit.passes.memplan import ALIGN

from . import engine, mlir

# lower-affine twice: expand-strided-metadata makes affine.apply of a row offset (loop bodies, mlir.py)
PIPELINE = ("--convert-linalg-to-loops", "--lower-affine", "--convert-scf-to-cf", "--convert-math-to-libm",
            "--convert-math-to-llvm", "--expand-strided-metadata", "--lower-affine", "--finalize-memref-to-llvm",
            "--convert-arith-to-llvm", "--convert-cf-to-llvm", "--convert-func-to-llvm",
            "--reconcile-unrealized-casts")
INSTALL = ("install MLIR's tools (Debian/Ubuntu: apt-get install mlir-19-tools) or set BURJIT_MLIR_TOOLS to "
           "the directory holding mlir-opt and mlir-translate")


class MissingTools(RuntimeError):
    pass


def tools():
    """(mlir-opt, mlir-translate) paths; MissingTools says how to install them."""
    found = []
    for name in ("mlir-opt", "mlir-translate"):
        where = os.environ.get("BURJIT_MLIR_TOOLS")
        if where:
            path = shutil.which(name, path=where)
            if path is None:
                raise MissingTools(f"BURJIT_MLIR_TOOLS={where} holds no {name}: {INSTALL}")
        else:
            path = shutil.which(name) or shutil.which(f"{name}-19") or next(
                iter(sorted(glob.glob(f"/usr/lib/llvm-*/bin/{name}"), reverse=True)), None)
            if path is None:
                raise MissingTools(f"the mlir backend needs {name}: {INSTALL}")
        found.append(path)
    return tuple(found)


def run_tool(tool, args, text):
    done = subprocess.run([tool, *args], input=text, capture_output=True, text=True)
    if done.returncode:
        with tempfile.NamedTemporaryFile("w", suffix=".mlir", delete=False) as f:
            f.write(text)
        raise RuntimeError(f"{os.path.basename(tool)} failed on the step's MLIR (kept in {f.name}):\n"
                           f"{done.stderr[-3000:]}")
    return done.stdout


def llvm_ir(text):
    """LLVM IR text of an MLIR module of upstream dialects, through mlir-opt and mlir-translate."""
    opt, translate = tools()
    return run_tool(translate, ["--mlir-to-llvmir"], run_tool(opt, PIPELINE, text))


class MLIRExecutable:
    TIER = "straight"  # scalar programs as ordinary nodes: a region as one straight-line function took
                       # LLVM's O2 391 s for 12k ops (mlir.py emits regions for native's step.mlir())

    def __init__(self, graph):
        self.graph = graph = pipeline.prepare(graph)
        emitted = mlir.module(graph)
        self._mlir, self._errors = emitted.module_text, emitted.errors
        self._ll = llvm_ir(self._mlir)
        module = engine.parse(self._ll)
        module.triple, module.data_layout = engine.triple_and_layout()
        engine.optimise(module, 2)
        words = []
        if emitted.ranks is not None:  # this process's MPI: the function by its address, handles into WORDS
            from burjit import distributed
            words = distributed.native_handles(emitted.ranks)
            llvm.add_symbol("MPI_Allreduce", words[0])
        symbols = ["_mlir_ciface_step"] + ([mlir.WORDS] if words else [])
        self._loaded = engine.Loaded([engine.emit_object(module)], symbols)
        if words:
            (ctypes.c_uint64 * len(words)).from_address(self._loaded.addresses[mlir.WORDS])[:] = words
        self._arena = arena.zeroed(emitted.top, ALIGN)  # the plan's bytes, then what the loops reserve
        self._status = np.zeros((), np.int32)
        self._poison = os.environ.get("BURJIT_POISON_ARENA") == "1"
        # donated inputs the step writes in place: kept aside while a computed index may still fail
        self._written = sorted({k for k in graph.aliases.values()}) if self._errors else []
        self._fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * (len(graph.inputs) + len(graph.outputs) + 2))(
            self._loaded.addresses["_mlir_ciface_step"])

    def __call__(self, inputs):
        g = self.graph
        inputs = [x if isinstance(x, np.ndarray) else np.asarray(x) for x in inputs]
        outs = [np.empty(g[n]["shape"], g[n]["dtype"]) for n in g.outputs]
        if self._poison:
            self._arena.fill(0xFF)
        kept = [inputs[k].copy() for k in self._written]
        self._status[()] = 0
        buffers = inputs + outs + [self._arena, self._status]
        words = np.array([v for a in buffers for v in _descriptor(a)], np.int64)
        at, args = words.ctypes.data, []
        for a in buffers:
            args.append(at)
            at += 8 * (3 + 2 * a.ndim)
        self._fn(*args)
        if self._status:
            for k, old in zip(self._written, kept):
                np.copyto(inputs[k], old)
            self._raise(int(self._status) - 1, inputs)
        for j, k in g.aliases.items():
            outs[j] = inputs[k]
        return outs

    def _raise(self, error, inputs):
        g, n, loops = self._errors[error]
        table, idx = g.operands(n)
        size = g[table]["shape"][0] if g[n]["op"] == "take" else g[n]["attrs"]["n"]
        given = inputs[g.inputs.index(idx)] if g is self.graph and g[idx]["op"] == "input" else None
        raise IndexError(out_of_range(size, g[n]["op"], g[n].get("src"), given)
                         + "".join(f", in the loop at {src}" for src in loops))

    def mlir(self):
        """The MLIR this backend compiled (mlir.py)."""
        return self._mlir

    def llvm_ir(self):
        """The LLVM IR mlir-translate made of it (before llvmlite's optimisation)."""
        return self._ll


def _descriptor(a):
    """MLIR's memref descriptor of array a, as 64-bit words: allocated and aligned pointers,
    offset, sizes, strides in elements (mlir.py's function is emitted with its C interface,
    which takes a pointer to one per buffer)."""
    return [a.ctypes.data, a.ctypes.data, 0, *a.shape, *(s // a.itemsize for s in a.strides)]
