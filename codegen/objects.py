"""Where a step's object code comes from: this process's memory, the disk cache, or the compiler.

A native step is a driver object (its step function and its entry, two modules each optimised
at its own level, then linked) plus one object per distinct kernel (lowering.py). Kernel
objects are cached one by one, keyed by their IR text with the host and the code generator's
sources (cache.key), so steps, batch sizes and programs that share a kernel compile it once.
The step's own entry holds the driver's object code and its kernels' keys, so a warm step loads
without building any IR. What is missing is compiled in
one batch, spread over the compile servers (engine.compile_objects). A corrupt or foreign kernel
entry is a miss, recompiled; a step entry whose kernels are gone is a step miss.
"""

import json

from . import cache, engine

# (optimisation level, vectorise) of each kind of module; codegen levels: KERNEL_CODEGEN, DRIVER_CODEGEN
STRAIGHT = (1, True)   # a step function with straight-line code
CALLS = (0, True)      # a step function that mostly calls kernels: O1 cost twice the LLVM time on a GPT's
#                        782 calls (54-67 ms vs 30 ms at O0) and nothing it does there shows in a step
CALLS_INLINE = 16      # a step function computing more values than this itself (lowering.inline) is STRAIGHT
ENTRY = (1, False)     # the entry, without the vectorisers: its loops over the inputs branch, and
#                        vectorising the overlap checks (run when a donated input moved) doubled its LLVM time
DRIVER_CODEGEN = 0     # fast instruction selection: the driver is calls, argv loads and little arithmetic
KERNEL = (2, True)     # measured on BurTorch's GPT: O3 took 35% longer than O2 and ran no faster
KERNEL_CODEGEN = 3
_MEMORY = {}  # kernel key -> object code, for every step this process builds
_MEMORY_BYTES = 32 << 20
_held = 0


def kernel_key(text):
    return cache.key(("kernel", text, engine.host_identity()))


def cached_step(key, symbols):
    """(driver object, [kernel report]) of the step stored under key, or None on a miss.

    Each report is {symbol, calls, object_bytes, compile_s, source} plus its object under "object"."""
    entry = cache.load(key)
    if entry is None:
        return None
    head, _, driver = entry.partition(b"\n")
    try:
        kernels = [(str(symbol), str(k), int(calls)) for symbol, k, calls in json.loads(head)]
    except (ValueError, TypeError):  # not an entry this code wrote
        return None
    if not engine.loadable(driver, symbols):
        return None
    reports = []
    for symbol, k, calls in kernels:
        obj, source = _cached_kernel(k, symbol)
        if obj is None:
            return None
        reports.append(dict(symbol=symbol, calls=calls, object_bytes=len(obj), compile_s=0.0, source=source, key=k,
                            object=obj))
    return driver, reports


class StepBuild:
    """Object code for a step whose IR is being emitted: `kernel` takes each distinct kernel as
    lowering emits it and sends the ones no cache holds to the compile servers at once, so they
    compile while the rest of the step is emitted; `finish` adds the driver and stores the step.
    A context manager (engine.compiling's)."""

    def __init__(self):
        self.batch = engine.compiling({DRIVER_CODEGEN, KERNEL_CODEGEN})
        self.reports = []

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
            self.batch.submit(text, KERNEL[0], KERNEL_CODEGEN, KERNEL[1])
        elif source == "memory" and not cache.path(k).exists():
            cache.store(k, obj)  # compiled under another cache directory: the step entry needs it here

    def finish(self, key, driver, calls):
        """(driver object, [kernel report] as cached_step gives) once all have compiled; stores them.
        driver: [(IR text, (optimisation level, vectorise))], the step's modules, linked into one
        object (one job: a compile server of its own cost a small step more than its LLVM time),
        queued ahead of the kernels still waiting: compiled last, it would be the whole wait."""
        (text, (level, vectorise)), *more = driver
        self.batch.submit(text, level, DRIVER_CODEGEN, vectorise, [(t, *levels) for t, levels in more], first=True)
        *built, (driver, _) = self.batch.results()
        for r, (obj, seconds) in zip([r for r in self.reports if r["object"] is None], built):
            r.update(object=obj, compile_s=seconds, source="compiled")
            cache.store(r["key"], obj)
            _remember(r["key"], obj)
        for r in self.reports:
            r.update(object_bytes=len(r["object"]), calls=calls[r["symbol"]])
        cache.store(key, json.dumps([[r["symbol"], r["key"], r["calls"]] for r in self.reports]).encode() + b"\n" + driver)
        return driver, self.reports


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
