"""Data-parallel training over MPI: ranks, broadcast, shards and summed or averaged trees.

burjit scales out on MPI through mpi4py (optional: `pip install -e ".[mpi]"` brings mpi4py and
the `mpich` wheel; any system MPI works through the same calls). MPI's microsecond latency is
what keeps a collective from dominating steps of 2 us to 1 ms. One script serves both ways
of running it: under `mpiexec -n N python train.py` it is rank 0..N-1 of N, and plain
`python train.py` is an MPI singleton of size 1.

A data-parallel step: each rank takes its `shard` of the global batch, computes gradients with
its compiled step, and `pmean` averages them, every leaf packed into one buffer per dtype and
one Allreduce; every rank then applies the same update, so parameters that start equal (one
`broadcast` from rank 0) stay bit-identical. The averaged gradients are the full batch's (the
mean of equal-sized shards' means), so N ranks train as one process on the whole batch does.

`train_step(loss_fn, opt)` builds that step. `psum`/`pmean` take numpy trees between steps,
and traced trees inside one: there each dtype's leaves become one `allreduce` graph node (the
primitive in burjit/primitives.py) over their packed values, which the native step runs as a
call of MPI_Allreduce itself (codegen/lowering.py), through handles the executable writes into
its arena when it is built (`native_handles`): never baked into code, so the disk cache holds
across processes and MPI libraries (with $BURJIT_COLLECTIVES=host, the step is split at its
collectives instead and they run from Python between its compiled stages: burjit/staged.py).
Compiled steps' collectives run on a duplicate of the communicator (made by init,
collectively), so they never match a message of the user's own, and its errors abort the job:
a native step has no exception to raise mid-collective.

MPI is fail-stop: when a rank dies the launcher ends the job; a rank that raises should not
leave the others waiting in a collective, so `main()`-style scripts call `abort_on_error()`
(an uncaught exception prints that rank's traceback and aborts the whole job). A rank that
hangs hangs the job unless $MPIEXEC_TIMEOUT (seconds) is set for mpiexec.
"""

import os
import shutil
import sys
import time

import numpy as np

from . import pytree
from .errors import TracingError
from .pytree import flatten, unflatten
from .tracer import Tracer, describe, lift, user_src

_current = None  # (the communicator in use, MPI.COMM_WORLD unless given; the duplicate steps use)
# The words native_handles gives a step, in this order (codegen/lowering.py reads them by name).
NATIVE_WORDS = ("MPI_Allreduce", "comm", "MPI_SUM", "float32", "float64", "int32", "int64")
_known = {}  # psum, pmean or broadcast -> (flattener, unflattener, treedef) of the tree it took last


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError("burjit.distributed needs mpi4py and an MPI library: pip install -e \".[mpi]\" "
                          "(mpi4py and the mpich wheel), or pip install mpi4py over a system MPI") from e
    return MPI


def init(comm=None):
    """Start MPI (if not yet started) and use `comm` (default MPI.COMM_WORLD); returns it.
    Collective: every rank of comm calls it (the first use of this module does, if not called)."""
    global _current
    MPI = _mpi()
    comm = comm if comm is not None else MPI.COMM_WORLD
    own = comm.Dup()
    own.Set_errhandler(MPI.ERRORS_ARE_FATAL)
    _current = (comm, own)
    return comm


def comm():
    """The mpi4py communicator in use (init() on first use), for anything MPI beyond this module."""
    if _current is None:
        init()
    return _current[0]


def _steps_comm(ranks):
    """The communicator compiled steps' collectives use, checked to have the `ranks` they were traced for."""
    comm()
    own = _current[1]
    if own.Get_size() != ranks:
        raise RuntimeError(f"this step was traced for {ranks} ranks but the communicator in use has "
                           f"{own.Get_size()}; trace it again under the new communicator")
    return own


def allreduce_array(x, ranks):
    """x summed over the ranks, as a new array: the reference of the allreduce primitive."""
    out = np.empty_like(x)
    _steps_comm(ranks).Allreduce(np.ascontiguousarray(x), out)
    return out


def native_handles(ranks):
    """The NATIVE_WORDS, as ints, for a native step traced for `ranks` ranks: MPI_Allreduce's
    address, the steps' communicator, MPI_SUM and the MPI datatypes of float32, float64, int32
    and int64 (ints under MPICH, pointers under Open MPI: passed as 64-bit words either way)."""
    import ctypes
    MPI, own = _mpi(), _steps_comm(ranks)
    for lib in (MPI.__file__, None):  # mpi4py's module links libmpi, or an ABI build loaded it globally
        try:
            address = ctypes.cast(ctypes.CDLL(lib).MPI_Allreduce, ctypes.c_void_p).value
            break
        except (OSError, AttributeError):
            continue
    else:
        raise RuntimeError("burjit.distributed: MPI_Allreduce is not found in the MPI library mpi4py loaded; "
                           "BURJIT_COLLECTIVES=host runs a step's collectives from Python instead")
    types = (MPI.FLOAT, MPI.DOUBLE, MPI.INT32_T, MPI.INT64_T)
    return [address, own.handle, MPI.SUM.handle] + [t.handle for t in types]


def launcher():
    """The path of `mpiexec`, beside this Python first (where the mpich wheel puts it), or None."""
    path = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"
    return shutil.which("mpiexec", path=path)


def rank():
    return comm().Get_rank()


def size():
    return comm().Get_size()


def abort_on_error():
    """Make an uncaught exception on any rank print its traceback and abort the whole job
    (MPI_Abort) instead of leaving the other ranks blocked in their next collective."""
    world, hook = comm(), sys.excepthook

    def abort(kind, value, tb):
        hook(kind, value, tb)
        sys.stderr.flush()
        time.sleep(0.2)  # the launcher forwards our stderr from a pipe: Abort kills it before it drains
        world.Abort(1)
    sys.excepthook = abort


def _tree_leaves(tree, what):
    """(leaves, (flattener, rebuild: leaves -> a tree like `tree`, its treedef), traced): numpy
    leaves as arrays, or, if any leaf is traced, the leaves as they are. A gradient tree has the
    same structure every step, so the generated flattener and unflattener of the last one `what`
    took are tried first (a GPT's 72 leaves: pytree.flatten alone cost 85 us)."""
    known = _known.get(what)
    leaves = known[0](tree) if known is not None else None
    if leaves is None:
        leaves, td = flatten(tree)
        known = _known[what] = (pytree.flattener(td), pytree.unflattener(td), td)
    if all(type(x) is np.ndarray for x in leaves):
        return leaves, known, False
    if any(isinstance(x, Tracer) for x in leaves):
        return leaves, known, True
    return [np.asarray(x) for x in leaves], known, False


def broadcast(tree, root=0):
    """Rank root's tree (numpy arrays and scalars), on every rank as new arrays; the other
    ranks' `tree` is ignored (None will do). The structure, shapes and dtypes travel first (one
    small message), then the values, one packed buffer per dtype."""
    world = comm()
    if world.Get_rank() == root:
        leaves, known, traced = _tree_leaves(tree, "broadcast")
        if traced:
            raise TracingError(f"{describe(user_src())}\n  broadcast inside a compiled step is not supported: "
                               "broadcast the parameters once, before the first step")
        meta = world.bcast((known[2], [(x.shape, x.dtype.str) for x in leaves]), root=root)
    else:
        meta = world.bcast(None, root=root)
        leaves = [np.empty(shape, dtype) for shape, dtype in meta[1]]
    for group in _by_dtype(leaves).values():
        buf = _pack(leaves, group)
        world.Bcast(buf, root=root)
        _unpack(buf, leaves, group)
    return unflatten(meta[0], leaves)


def shard(batch):
    """This rank's equal slice of a global batch (a tree of arrays) along axis 0: views, not copies."""
    world = comm()
    leaves, td = flatten(batch)
    lengths = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
    if len(lengths) != 1 or None in lengths:
        raise ValueError(f"shard: every leaf needs the same leading axis (the batch); got leading sizes "
                         f"{sorted(lengths, key=str)}")
    (n,) = lengths
    k = world.Get_size()
    if n % k:
        raise ValueError(f"shard: a batch of {n} does not split evenly over {k} ranks; use a multiple of {k} "
                         f"(equal shards keep the averaged gradient the full batch's)")
    at = world.Get_rank() * (n // k)
    return unflatten(td, [np.asarray(x)[at:at + n // k] for x in leaves])


def psum(tree):
    """The elementwise sum of `tree` over all ranks (numpy leaves; one Allreduce per dtype)."""
    return _allreduce(tree, "psum", mean=False)


def pmean(tree):
    """The elementwise mean of `tree` (float leaves) over all ranks: psum, then / size()."""
    return _allreduce(tree, "pmean", mean=True)


def train_step(loss_fn, opt, micro_batches=1):
    """step(params, opt_state, *batch) -> (params, opt_state, mean loss): other frameworks'
    DistributedOptimizer as one compiled step, the parameters and optimizer state donated. It
    takes this rank's shard of the global batch, the gradient of loss_fn(params, *batch) on it
    (averaged over `micro_batches` equal slices of the shard, accumulated inside the step),
    one pmean of loss and gradients (one allreduce per dtype, however many micro-batches), then
    opt's update. `step.compiled` is the compiled step, for inspection."""
    from .autodiff import value_and_grad
    from .jit import compile
    grad = value_and_grad(loss_fn)

    @compile(donate_argnums=(0, 1))
    def update(params, opt_state, *batch):
        n = batch[0].shape[0] if batch else 0
        if n % micro_batches:
            raise ValueError(f"train_step: a shard of {n} does not split into {micro_batches} equal micro-batches")
        total = None
        for k in range(micro_batches):
            part = grad(params, *(x[k * n // micro_batches:(k + 1) * n // micro_batches] for x in batch))
            total = part if total is None else pytree.tree_map(lambda a, b: a + b, total, part)
        loss, g = pmean(pytree.tree_map(lambda a: a / micro_batches, total) if micro_batches > 1 else total)
        return (*opt.update(params, g, opt_state), loss)

    def step(params, opt_state, *batch):
        return update(params, opt_state, *shard(batch))
    step.compiled = update  # the compiled step, for inspection (graph(), stats(), ...)
    return step


def _allreduce(tree, what, mean):
    leaves, (_, rebuild, _), traced = _tree_leaves(tree, what)
    groups = _by_dtype(leaves)
    for dtype in groups:
        if dtype.kind not in ("f" if mean else "iuf"):
            raise TypeError(f"{what}: a leaf of dtype {dtype} (psum takes numbers, pmean floats)")
    if traced:
        return rebuild(_in_step(leaves, groups, mean))
    world = comm()
    for group in groups.values():
        buf = _pack(leaves, group)
        world.Allreduce(_mpi().IN_PLACE, buf)
        if mean:
            buf /= world.Get_size()
        _unpack(buf, leaves, group)
    return rebuild(leaves)


def _in_step(leaves, groups, mean):
    """The leaves summed (or averaged) over the ranks inside the step being traced: per dtype,
    the leaves flattened into one vector, one allreduce node, the vector cut back into leaves."""
    from . import ops as F
    from .tracer import bind
    n, leaves = size(), [lift(x) for x in leaves]
    for group in groups.values():
        flat = [F.reshape(leaves[i], (-1,)) for i in group]
        total = bind("allreduce", [flat[0] if len(flat) == 1 else F.concatenate(flat)], ranks=n)
        _unpack(total / n if mean else total, leaves, group)
    return leaves


def _by_dtype(leaves):
    """{dtype: leaf positions}, in first-seen order (the same on every rank)."""
    groups = {}
    for i, x in enumerate(leaves):
        groups.setdefault(np.dtype(x.dtype), []).append(i)
    return groups


def _pack(leaves, group):
    return np.concatenate([leaves[i].ravel() for i in group])


def _unpack(buf, leaves, group):
    at = 0
    for i in group:
        x = leaves[i]
        leaves[i] = buf[at:at + x.size].reshape(x.shape)
        at += x.size
