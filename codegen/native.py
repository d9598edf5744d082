"""The native backend: graph -> one JIT-compiled step, called as a Python builtin.

`build(graph)` lowers the graph (after `pipeline.prepare` fills in a default schedule and
memory plan) to a driver and its distinct kernels, takes their object code from the caches or
compiles what is missing in the compile servers (objects.py, forked.py), links them in one
MCJIT engine and returns a NativeExecutable. A call allocates the
outputs (np.empty, or the donated input arrays) and makes one call of the step's METH_FASTCALL
entry with the input list, the output list and the preallocated arena (abi.py); steps that
need Python around the call (constant indices out of range, donated buffers to restore,
unknown object layouts) take the ctypes path of _CheckedExecutable. Threads sharing a step
(and its arena) run it one at a time: the lean call is one builtin that holds the GIL, the
checked path holds the executable's lock. The entry checks every input itself (type, shape,
dtype, C order; writable and overlapping nothing if donated) and runs nothing for one that is
off, so `fast_path` hands jit.py a call that needs no Python check per leaf; numpy scalars go
in as they are, read in place.

Environment (read at build time):
  BURJIT_DUMP_DIR       write <key>.ll, <key>.opt.ll, <key>.s and <key>.mlir for every step built
  BURJIT_POISON_ARENA=1 fill the arena with 0xFF bytes (NaN / -1) at call start and each arena
                        value's bytes just before the kernel that defines it, so a memory plan
                        that overlaps two live values gives visibly wrong results
  BURJIT_COMPILE_IN_PROCESS=1  optimise and emit in this process, not in the compile servers
  BURJIT_COMPILE_WORKERS=n     compile servers at work at once (default: this process's CPUs)
  BURJIT_CHECK_KERNELS=1       build every kernel call's IR and check it against its identity's
  BURJIT_TIER           auto | straight | tape: how scalar groups run (tape.py)
  BURJIT_CACHE_DIR      where compiled object code is cached (default ~/.cache/burjit; who may
                        write it: see cache.py)
"""

import ctypes
import math
import os
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from burjit import arena
from burjit.errors import out_of_range
from burjit.graph import collector_paused
from burjit.primitives import ITEMSIZE
from burjit.passes import pipeline
from burjit.passes.memplan import ALIGN

from . import abi, cache, engine, mlir, objects
from .lowering import ENTRY, SYMBOL, Lowering

_STEP = ctypes.PYFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)  # holds the GIL: calls share one arena


class _Lowered:
    """A graph planned and lowered, with its loop bodies (each a _Lowered of its own, bodies.py)
    and an arena: what a step and a loop body share. `key` names everything its code depends on."""

    def __init__(self, graph, offsets=None):
        with collector_paused():  # plain data until IR emission (a tape's records, say)
            self.graph = graph = pipeline.prepare(graph)
            self.bodies = {n: _Lowered(_body_graph(graph, n)) for n in _loops(graph)}
            self.lowering = low = Lowering(graph, poison=os.environ.get("BURJIT_POISON_ARENA") == "1",
                                           offsets=offsets, bodies={n: b.lowering for n, b in self.bodies.items()})
            self.key = cache.key((*_key_parts(graph, low), [b.key for b in self.bodies.values()]))
        self._arena = arena.zeroed(low.arena_bytes, ALIGN)
        for gi, at in low.record_slots.items():  # the tapes' records and runs: arrays the lowering keeps alive
            self._arena[at:at + 16].view(np.uint64)[:] = low.tapes[gi].records.ctypes.data, low.tapes[gi].runs.ctypes.data
        for n, at in low.loop_slots.items():  # each loop body's arena (bodies.py)
            self._arena[at:at + 8].view(np.uint64)[:] = self.bodies[n]._arena.ctypes.data
        if low.collectives:  # the MPI function and handles of this process (lowering.py)
            from burjit import distributed
            words = distributed.native_handles(graph[low.collectives[0]]["attrs"]["ranks"])
            self._arena[low.handles_offset:low.handles_offset + 8 * len(words)].view(np.uint64)[:] = words

    def _message(self, rc, inputs):
        node, size, k = self.lowering.errors[rc - 1]
        a = self.graph[node]
        if k == "loop":  # error `size` of the loop's body, whose inputs Python never sees
            return f"{self.bodies[node]._message(size, None)}, in the loop at {a['src']}"
        return out_of_range(size, a["op"], a.get("src"),
                            np.asarray(inputs[k]) if k is not None and inputs is not None else None)

    def memory_plan(self):
        plan, low = self.graph.meta["memory"], self.lowering
        report = dict(plan.report())
        report.update(arena_allocated=low.arena_bytes, staging_bytes=low.staging_bytes, scratch_bytes=low.scratch_bytes,
                      tape_bytes=low.tape_bytes,
                      kernels=len(self.graph.meta["schedule"]), locations=dict(plan.location),
                      bodies={n: b.memory_plan() for n, b in self.bodies.items()},  # arenas every iteration reuses
                      loops={n: _loop_report(self.graph, n, b) for n, b in self.bodies.items()})
        return report


class NativeExecutable(_Lowered):
    def __init__(self, graph):
        super().__init__(graph, abi.OFFSETS)
        graph, low = self.graph, self.lowering
        self._ir = {}
        symbols = (SYMBOL, ENTRY) if low.offsets else (SYMBOL,)
        found = objects.cached_step(self.key, symbols)
        self.from_cache = found is not None
        emit_s = llvm_s = 0.0
        if found is None:
            with objects.StepBuild() as build:
                t0 = time.perf_counter()
                parts = self._emitted(build.kernel)
                t1 = time.perf_counter()
                driver, kernels = build.finish(self.key, parts, low.calls)
            emit_s, llvm_s = t1 - t0, time.perf_counter() - t1
        else:
            driver, kernels = found
        self._loaded = engine.Loaded([driver] + [k.pop("object") for k in kernels], symbols)
        for k in kernels:
            del k["key"]
        self._kernels = kernels
        self._stats = dict(from_cache=self.from_cache, ir_s=emit_s, llvm_s=llvm_s,
                           object_bytes=len(driver) + sum(k["object_bytes"] for k in kernels),
                           kernels=len(graph.meta["schedule"]), kernel_functions=len(kernels),
                           kernels_compiled=sum(k["source"] == "compiled" for k in kernels),
                           tapes=[dict(group=gi, records=len(t.records), runs=len(t.runs) - 1 if t.per_run else None,
                                       pairs=t.fused, registers=t.registers) for gi, t in sorted(low.tapes.items())])
        self._step = _STEP(self._loaded.addresses[SYMBOL])
        if os.environ.get("BURJIT_DUMP_DIR"):
            try:
                self.dump(os.environ["BURJIT_DUMP_DIR"])
            except OSError as e:  # a debugging aid must not stop the step
                warnings.warn(f"BURJIT_DUMP_DIR: dump skipped: {e}", RuntimeWarning, stacklevel=2)
        self._prepare_calls()

    # -- calling --------------------------------------------------------------------------------
    def _prepare_calls(self):
        g, low = self.graph, self.lowering
        self._argv = (ctypes.c_void_p * (low.arena_slot + 1))()
        self._argv[low.arena_slot] = self._arena.ctypes.data
        self._status = self._arena[low.status_offset:low.status_offset + 4].view(np.int32)
        kinds = [np.dtype(g[n]["dtype"]) for n in g.inputs]  # the entry checks inputs against these
        self._arena[low.expect_offset:low.verified_offset].view(np.uint64)[:] = [v for d in kinds for v in (id(d), id(d.type))]
        self._new_outputs = _output_maker(g)
        self._lock = threading.Lock()
        if low.static_error or low.backup or not low.offsets:
            self.__class__ = _CheckedExecutable
        else:
            self._call = abi.builtin(self._loaded.addresses[ENTRY], ENTRY, self._loaded)
            self._lean = self.fast_path()

    def __call__(self, inputs):
        """Run the step: the lean path (no staging, no constant-index error, object layouts known),
        or the portable one for inputs the entry does not take as they are."""
        if type(inputs) is not list:
            inputs = list(inputs)
        outs = self._lean(inputs)
        return outs if outs is not None else _CheckedExecutable.__call__(self, inputs)

    def fast_path(self, prelude=None):
        """A function: the list of inputs (arrays, or numpy scalars where 0-d) -> the outputs
        list, or None, nothing run, if an input is not of the type, shape, dtype and layout the
        step was built for (the entry checks them all: lowering.py); an index out of range raises
        IndexError. One generated function, as every Python call layer costs about what the
        native step of a small graph does: with prelude = (names, params, lines, result, refused)
        it takes `params` instead, its lines making the inputs list `i` (or returning), and
        returns the expression `result` over the outputs `o`, or `refused` if the entry refuses
        an input."""
        env, outs = _outputs_display(self.graph)
        env.update(C=self._call, A=self._arena, fail=self._failed)
        params, lines, result, refused = "i", [], "o", "None"
        if prelude is not None:
            env.update(prelude[0])
            params, lines, result, refused = prelude[1:]
        lines = lines + [f"o = {outs}", "r = C(i, o, A)", "if r is o:", f"    return {result}", "if r is i:",
                         "    fail(i)", f"return {refused}"]
        exec(f"def run({params}):\n    " + "\n    ".join(lines) + "\n", env)  # noqa: S102 (names and ints only)
        return env["run"]

    def _failed(self, inputs):
        raise IndexError(self._message(int(self._status[0]), inputs))

    # -- inspection -----------------------------------------------------------------------------
    def _emitted(self, on_kernel=None):
        """[(IR text as lowering writes it, (optimisation level, vectorise))] of the step's own
        modules (objects.StepBuild.finish): its step function, then its entry if it has one;
        on_kernel(symbol, IR text) is told of each distinct kernel as it is emitted."""
        if "emitted" not in self._ir:
            low, target = self.lowering, engine.triple_and_layout()
            step = str(low.module(*target, on_kernel=on_kernel))
            parts = [(step, objects.STRAIGHT if low.inline > objects.CALLS_INLINE else objects.CALLS)]
            entry = low.entry_module(*target)
            if entry is not None:
                parts.append((str(entry), objects.ENTRY))
            self._ir["emitted"] = parts
        return self._ir["emitted"]

    def _module(self, optimized, entry=True):
        """One llvmlite.binding module of the whole step: its own modules and its kernels, each
        optimised as it is compiled (or as emitted), linked together; without the Python entry
        if not `entry` (export.py)."""
        own = self._emitted() if entry else self._emitted()[:1]
        parts = own + [(text, objects.KERNEL) for text in self.lowering.kernels.values()]
        mods = [engine.parse(text) for text, _ in parts]
        if optimized:
            for mod, (_, (level, vectorise)) in zip(mods, parts):
                engine.optimise(mod, level, vectorise)
        return engine.link(mods)

    def llvm_ir(self, optimized=True):
        name = "opt" if optimized else "raw"
        if name not in self._ir:
            self._ir[name] = str(self._module(optimized))
        return self._ir[name]

    def asm(self):
        if "asm" not in self._ir:
            self._ir["asm"] = engine.emit_assembly(self._module(optimized=True))
        return self._ir["asm"]

    def mlir(self):
        """The step after passes as MLIR in upstream dialects, over the same buffers (mlir.py)."""
        return mlir.step_mlir(self.graph)

    def stats(self):
        """What building the step cost: seconds emitting IR (kernels compile meanwhile) and then
        waiting for LLVM (both 0 on a step cache hit),
        object bytes, kernels scheduled, the distinct kernel functions they call and how many of
        those were compiled for this step; under "per_kernel", each function's symbol, calls,
        object bytes, compile seconds and source ("compiled", or cached in "memory" or on "disk");
        under "tapes", each scalar group run on the tape tier (its group, records, runs of one
        opcode or None if dispatched per record, records that are fused pairs, registers). A loop
        body's kernels are among the kernels (its step function is in the driver)."""
        return dict(self._stats, per_kernel=[dict(k) for k in self._kernels])

    def export(self, path, leaves):
        """Write the step as a C library (export.py): `leaves` describes its inputs and outputs."""
        from . import export
        return export.write(self, path, leaves)

    def dump(self, directory):
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{self.key[:16]}.ll").write_text(self.llvm_ir(optimized=False))
        (d / f"{self.key[:16]}.opt.ll").write_text(self.llvm_ir(optimized=True))
        (d / f"{self.key[:16]}.s").write_text(self.asm())
        (d / f"{self.key[:16]}.mlir").write_text(self.mlir())


class _CheckedExecutable(NativeExecutable):
    """The general call path: constant-index errors, restoring donated buffers, no list ABI.

    Python fills the shared argv before the call and may switch threads between any two of
    its bytecodes, so the whole call holds the executable's lock (the lean path is one builtin
    call, atomic under the GIL)."""

    fast_path = None  # no entry checks inputs here: calls go through jit's _signature

    def __call__(self, inputs):
        low = self.lowering
        if low.static_error:
            raise IndexError(low.static_error)
        with self._lock:
            outs = self._new_outputs(inputs)
            argv, n_in = self._argv, low.n_in
            for k, a in enumerate(inputs):
                argv[k] = a.ctypes.data
            for j, o in enumerate(outs):
                argv[n_in + j] = o.ctypes.data
            saved = [(k, inputs[k].copy()) for k in low.backup]
            rc = self._step(argv)
            if rc:
                for k, old in saved:
                    np.copyto(inputs[k], old)
                raise IndexError(self._message(rc, inputs))
            return outs


def _output_maker(graph):
    """inputs -> the list of output arrays: fresh np.empty ones, donated inputs where aliased."""
    env, outs = _outputs_display(graph)
    return eval(f"lambda i: {outs}", env)  # noqa: S307 (names and ints only)


def _outputs_display(graph):
    """(names, a list display of the output arrays over the inputs list `i`). One display: a
    comprehension over specs costs more than the allocations."""
    env, items, run = {"E": np.empty}, [], None  # run: [first input, count] of consecutive aliased outputs
    for j, n in enumerate(graph.outputs):
        if j in graph.aliases:
            k = graph.aliases[j]
            if run and run[0] + run[1] == k:
                run[1] += 1
            else:
                run = [k, 1]
                items.append(run)
        else:
            run = None
            env[f"s{j}"], env[f"d{j}"] = graph[n]["shape"], np.dtype(graph[n]["dtype"])
            items.append(f"E(s{j}, d{j})")
    # a run of donated parameters is one slice of the inputs: a GPT's 74 subscripts cost ~1 us
    items = [x if isinstance(x, str) else f"i[{x[0]}]" if x[1] == 1 else f"*i[{x[0]}:{x[0] + x[1]}]" for x in items]
    return env, f"[{', '.join(items)}]"


def _key_parts(graph, low):
    plan = graph.meta["memory"]
    literals = sorted((n, graph[n]["attrs"]["value"]._key) for n in graph.nx.nodes if graph[n]["op"] == "literal")
    return (graph.fingerprint(), [tuple(g) for g in graph.meta["schedule"]], sorted(plan.location.items()),
            plan.arena_bytes, literals, low.poison, low.offsets, graph.meta.get("donated"),
            [(gi, t.per_run, t.table) for gi, t in sorted(low.tapes.items())], engine.host_identity())


def _loop_report(graph, node, body):
    """What loop `node` holds in memory: its vector (final carry, stacked outputs and, once
    reverse mode needs them, the carry entering every iteration) and its body's arena."""
    spec = graph[node]["attrs"]["body"]
    stored = spec.leaves[spec.stored:] if spec.stored is not None else []
    return dict(role=spec.role, src=graph[node].get("src"), iterations=spec.length,
                vector_bytes=graph.nbytes(node), body_arena_bytes=body.lowering.arena_bytes,
                stored_carry_bytes=sum(math.prod(shape) * ITEMSIZE[d] for _, shape, d in stored))


def _loops(graph):
    return [n for n, a in graph.nx._node.items() if a["op"] == "loop"] if graph.meta.get("loops") else []


def _body_graph(graph, node):
    """The body graph of loop `node`, under the tier of the step it is in."""
    body = graph[node]["attrs"]["body"].graph
    body.meta.setdefault("tier", graph.meta.get("tier"))
    return body


def build(graph):
    return NativeExecutable(graph)
