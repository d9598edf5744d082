"""Where a step's object code comes from: this process's memory, the disk cache, or the compiler.

A native step is its own objects (its entry, its step function) plus one object per
distinct kernel (lowering.py). Kernel objects are cached one by one, keyed by their IR text with
the host and the code generator's sources (cache.key), so steps, batch sizes and programs that
share a kernel compile it once. The step's own cache entry holds its own objects and its
kernels' keys, so a warm step loads without building any IR. What is missing is compiled in
one batch, spread over the compile servers (engine.compile_objects). A corrupt or foreign kernel
entry is a miss, recompiled; a step entry whose kernels are gone is a step miss.
"""

import itertools
import json

from . import cache, engine

DRIVER = (1, 0)  # (optimisation, codegen level) of a step function with straight-line code
ENTRY = (1, 0, False)  # of the entry, without the vectorisers: its loops over the inputs branch, and
#                  vectorising the overlap checks (run when a donated input moved) cost 2x the LLVM time
CALLS = (0, 0)   # of a step function that mostly calls kernels: O1 cost a compile server twice the time on
#                  a GPT's 782 calls (54-67 ms vs 30 ms at O0) and nothing it does there shows in a step
CALLS_INLINE = 16  # a step function computing more values than this itself (lowering.inline) is optimised
KERNEL = (2, 3)  # measured on BurTorch's GPT: O3 took 35% longer than O2 and ran no faster
_MEMORY = {}  # kernel key -> object code, for every step this process builds
_MEMORY_BYTES = 32 << 20
_held = 0


def kernel_key(text):
    return cache.key(("kernel", text, engine.host_identity()))


def cached_step(key, symbols):
    """([driver object], [kernel report]) of the step stored under key, or None on a miss.

    The driver objects are the step's own code (its entry, its step function), which hold
    `symbols`. Each report is {symbol, calls, object_bytes, compile_s, source} plus its object
    under "object"."""
    entry = cache.load(key)
    if entry is None:
        return None
    head, _, rest = entry.partition(b"\n")
    try:
        head = json.loads(head)
        kernels = [(str(symbol), str(k), int(calls)) for symbol, k, calls in head["kernels"]]
        ends = [int(n) for n in head["drivers"]]
    except (ValueError, TypeError, KeyError):  # not an entry this code wrote
        return None
    drivers = [rest[a:b] for a, b in zip([0] + ends, ends)]
    if ends[-1:] != [len(rest)] or not all(engine.loadable(d, ()) for d in drivers) \
            or not engine.loadable(b"".join(drivers), symbols):
        return None
    reports = []
    for symbol, k, calls in kernels:
        obj, source = _cached_kernel(k, symbol)
        if obj is None:
            return None
        reports.append(dict(symbol=symbol, calls=calls, object_bytes=len(obj), compile_s=0.0, source=source, key=k,
                            object=obj))
    return drivers, reports


class StepBuild:
    """Object code for a step whose IR is being emitted: `driver` and `kernel` take the step's
    own modules and each distinct kernel as lowering emits them and send the ones no cache holds
    to the compile servers at once, so they compile while the rest of the step is emitted;
    `finish` waits for them and stores the step. A context manager (engine.compiling's)."""

    def __init__(self):
        self.batch = engine.compiling({DRIVER[1], ENTRY[1], CALLS[1], KERNEL[1]})
        self.reports = []
        self.jobs = []  # per job submitted: its kernel report, or None for a driver module

    def driver(self, text, levels):
        """Compile one of the step's own modules at `levels` (optimisation, codegen[, vectorise])."""
        self.jobs.append(None)
        self.batch.submit(text, *levels)

    def __enter__(self):
        self.batch.__enter__()
        return self

    def __exit__(self, *exc):
        return self.batch.__exit__(*exc)

    def kernel(self, symbol, text):
        k = kernel_key(text)
        obj, source = _cached_kernel(k, symbol)
        self.reports.append(dict(symbol=symbol, object_bytes=0, compile_s=0.0, source=source, key=k, object=obj))
        if obj is None:
            self.jobs.append(self.reports[-1])
            self.batch.submit(text, *KERNEL)
        elif source == "memory" and not cache.path(k).exists():
            cache.store(k, obj)  # compiled under another cache directory: the step entry needs it here

    def finish(self, key, calls):
        """([driver object] in the order given, [kernel report] as cached_step gives) once all
        have compiled; stores them."""
        drivers = []
        for r, (obj, seconds) in zip(self.jobs, self.batch.results()):
            if r is None:
                drivers.append(obj)
                continue
            r.update(object=obj, compile_s=seconds, source="compiled")
            cache.store(r["key"], obj)
            _remember(r["key"], obj)
        for r in self.reports:
            r.update(object_bytes=len(r["object"]), calls=calls[r["symbol"]])
        head = {"kernels": [[r["symbol"], r["key"], r["calls"]] for r in self.reports],
                "drivers": list(itertools.accumulate(map(len, drivers)))}
        cache.store(key, json.dumps(head).encode() + b"\n" + b"".join(drivers))
        return drivers, self.reports


def _cached_kernel(k, symbol):
    """(object, "memory" | "disk") of kernel key k, or (None, None)."""
    obj = _MEMORY.get(k)
    if obj is not None:
        return obj, "memory"
    obj = cache.load(k)
    if obj is None or not engine.loadable(obj, (symbol,)):
        return None, None
    _remember(k, obj)
    return obj, "disk"


def _remember(k, obj):
    """Keep a kernel's object in memory, dropping the oldest past _MEMORY_BYTES."""
    global _held
    _MEMORY[k] = obj
    _held += len(obj)
    while _held > _MEMORY_BYTES:
        _held -= len(_MEMORY.pop(next(iter(_MEMORY))))
