"""The host CPU as an LLVM target: optimise IR, emit object code, link objects in MCJIT.

Compilation and loading are separate steps so the disk caches can store the object bytes in
between, and so compilation can run in the compile servers (forked.py), several modules at once. One target machine
serves the whole process; its identity (triple, CPU, features) is part of every cache key.
Parsing, optimising, emitting and loading hold forked.LOCK, so the server is never forked mid-call.
"""

import functools
import time

import llvmlite
import llvmlite.binding as llvm

from . import forked
from .forked import LOCK


@functools.lru_cache(maxsize=None)
def target_machine(codegen=3):
    """The process-wide target machine for optimising and emitting code at codegen level `codegen`
    (instruction selection and register allocation: 0 is fast, for code that is not hot)."""
    return new_target_machine(codegen)


def new_target_machine(codegen=3, library=False):
    """library: code for a shared library (position independent, the default code model) instead
    of this process's JIT."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=host_features(), opt=codegen,
                                        reloc="pic" if library else "default",
                                        codemodel="default" if library else "jitdefault")


@functools.lru_cache(maxsize=None)
def triple_and_layout():
    """(triple, data layout) strings for modules built for the host."""
    tm = target_machine()
    return tm.triple, str(tm.target_data)


@functools.lru_cache(maxsize=None)
def host_features():
    return llvm.get_host_cpu_features().flatten()


def host_identity():
    """Everything about the host and toolchain that object code depends on."""
    target_machine()
    return (llvm.get_process_triple(), llvm.get_host_cpu_name(), host_features(), llvmlite.__version__)


def vector_bytes():
    """Width of the widest vector register the host has."""
    features = host_features().split(",")
    return 64 if "+avx512f" in features else 32 if "+avx" in features else 16


def parse(ir_text):
    with LOCK:
        target_machine()
        module = llvm.parse_assembly(ir_text)
        module.verify()
        return module


def optimise(module, level=3, vectorise=True):
    """Run the new pass manager's O`level` pipeline (with the loop and SLP vectorisers unless
    vectorise is False) for the host CPU, in place."""
    with LOCK:
        tm = target_machine()
        pto = llvm.create_pipeline_tuning_options(speed_level=level)
        pto.loop_vectorization = vectorise
        pto.slp_vectorization = vectorise
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(module, pb)
        return module


def link(modules):
    """The first module with the others linked into it (they are consumed)."""
    with LOCK:
        for mod in modules[1:]:
            modules[0].link_in(mod)
        return modules[0]


def emit_object(module, codegen=3):
    with LOCK:
        return target_machine(codegen).emit_object(module)


def emit_library_object(module):
    """Object code of `module` for a shared library (export.py)."""
    with LOCK:
        return new_target_machine(library=True).emit_object(module)


def emit_assembly(module):
    with LOCK:
        return target_machine().emit_assembly(module)


def _optimised_object(ir_text, level=3, codegen=3, vectorise=True, more=()):
    """Object code of raw IR text optimised at O`level`, with the modules `more`, [(IR text,
    level, vectorise)], each optimised at its own level and linked into it."""
    modules = [optimise(parse(text), lv, vec) for text, lv, vec in [(ir_text, level, vectorise), *more]]
    return emit_object(link(modules), codegen)


def compiling(codegen_levels=(3,)):
    """A batch of compile jobs: `submit(raw IR text, optimisation level, codegen level[,
    vectorise[, more]][, first=True to queue it ahead of the others])` (_optimised_object's
    arguments), then `results()` -> [(object code, seconds)] in order. In forked compile
    servers, as many at once as there are cores, where they are available (forked.py), so the
    optimiser's memory never joins this process's and the caller goes on while they work; else
    each job here, at submit.
    Use it as a context manager; `codegen_levels` are the levels its jobs use."""
    for codegen in codegen_levels:
        target_machine(codegen)  # made once here, so every server inherits them instead of making its own
    return forked.Batch(_optimised_object) if forked.available() else _InProcess()


class _InProcess:
    def __init__(self):
        self.answers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def submit(self, *job, first=False):
        t0 = time.perf_counter()
        self.answers.append((_optimised_object(*job), time.perf_counter() - t0))

    def results(self):
        return self.answers


def compile_objects(jobs):
    """[(object code, seconds)] for [(raw IR text, optimisation level, codegen level)] (compiling)."""
    with compiling({codegen for *_, codegen in jobs}) as batch:
        for job in jobs:
            batch.submit(*job)
        return batch.results()


def compile_object(ir_text, level=3, codegen=3):
    """Object code for the host from raw IR text (compile_objects of one module)."""
    return compile_objects([(ir_text, level, codegen)])[0][0]


def _header(obj):
    """The bytes that name an object file's format and machine: for ELF the ident (class, byte
    order, version, OS ABI) with e_type and e_machine; else the first 8 (Mach-O: magic, CPU type)."""
    return (obj[:8], obj[16:20]) if obj[:4] == b"\x7fELF" else (obj[:8], b"")


@functools.lru_cache(maxsize=None)
def _host_header():
    return _header(emit_object(parse("")))


def loadable(obj, symbols):
    """True if obj is object code of the kind this process emits (format, class, machine) and
    names every symbol: MCJIT aborts the process on foreign relocations, so nothing else may reach it."""
    return _header(obj) == _host_header() and all(b"\0" + s.encode() + b"\0" in obj for s in symbols)


class Loaded:
    """Object files linked into one MCJIT engine (calls between them resolve by symbol name);
    keeps the engine (and the code) alive.

    An engine owns the target machine it is given (and frees it with itself), so each gets its own.
    """

    def __init__(self, objects, symbols):
        with LOCK:
            self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), new_target_machine())
            for obj in objects:
                self.engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            self.engine.finalize_object()
            self.addresses = {s: self.engine.get_function_address(s) for s in symbols}
        missing = [s for s, a in self.addresses.items() if not a]
        if missing:
            raise RuntimeError(f"symbols {missing} not found in object code")
