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

`train_step(loss_fn, opt)` builds that step. `psum`/`pmean` work on numpy trees, between
compiled steps; inside a traced step they raise a TracingError (graph nodes for the collective
are not built yet).

MPI is fail-stop: when a rank dies the launcher ends the job; a rank that raises should not
leave the others waiting in a collective, so `main()`-style scripts call `abort_on_error()`
(an uncaught exception prints that rank's traceback and aborts the whole job). A rank that
hangs hangs the job unless $MPIEXEC_TIMEOUT (seconds) is set for mpiexec.
"""

import os
import shutil
import sys

import numpy as np

from . import pytree
from .errors import TracingError
from .pytree import flatten, unflatten
from .tracer import Tracer, describe, user_src

_current = None  # the communicator in use (init), MPI.COMM_WORLD unless given
_known = {}  # psum, pmean or broadcast -> (flattener, unflattener, treedef) of the tree it took last


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError("burjit.distributed needs mpi4py and an MPI library: pip install -e \".[mpi]\" "
                          "(mpi4py and the mpich wheel), or pip install mpi4py over a system MPI") from e
    return MPI


def init(comm=None):
    """Start MPI (if not yet started) and use `comm` (default MPI.COMM_WORLD); returns it."""
    global _current
    _current = comm if comm is not None else _mpi().COMM_WORLD
    return _current


def comm():
    """The mpi4py communicator in use (init() on first use), for anything MPI beyond this module."""
    return _current if _current is not None else init()


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
        world.Abort(1)
    sys.excepthook = abort


def _host_leaves(tree, what):
    """(leaves as arrays, (flattener, rebuild: leaves -> a tree like `tree`, its treedef)). A
    gradient tree has the same structure every step, so the generated flattener and unflattener
    of the last one `what` took are tried first (a GPT's 72 leaves: pytree.flatten alone cost 85 us)."""
    known = _known.get(what)
    leaves = known[0](tree) if known is not None else None
    if leaves is None:
        leaves, td = flatten(tree)
        known = _known[what] = (pytree.flattener(td), pytree.unflattener(td), td)
    if not all(type(x) is np.ndarray for x in leaves):
        for x in leaves:
            if isinstance(x, Tracer):
                raise TracingError(f"{describe(user_src())}\n  {what} inside a compiled step is not supported "
                                   "yet: return the gradients from the step and call it between steps")
        leaves = [np.asarray(x) for x in leaves]
    return leaves, known


def broadcast(tree, root=0):
    """Rank root's tree (numpy arrays and scalars), on every rank as new arrays; the other
    ranks' `tree` is ignored (None will do). The structure, shapes and dtypes travel first (one
    small message), then the values, one packed buffer per dtype."""
    world = comm()
    if world.Get_rank() == root:
        leaves, known = _host_leaves(tree, "broadcast")
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


def train_step(loss_fn, opt):
    """step(params, opt_state, *batch) -> (params, opt_state, mean loss): the gradient of
    loss_fn(params, *batch) on this rank's shard of the global batch, averaged over the ranks
    with the loss (one pmean, one allreduce), then opt's update; both halves compiled, the
    parameters and optimizer state donated. Other frameworks' DistributedOptimizer, as two
    compiled steps around the collective (pmean does not run inside a compiled step yet)."""
    from .autodiff import value_and_grad
    from .jit import compile
    grads = compile(value_and_grad(loss_fn))
    update = compile(lambda p, s, g: opt.update(p, g, s), donate_argnums=(0, 1))

    def step(params, opt_state, *batch):
        loss, g = grads(params, *shard(batch))
        loss, g = pmean((loss, g))
        return (*update(params, opt_state, g), loss)
    return step


def _allreduce(tree, what, mean):
    world = comm()
    leaves, (_, rebuild, _) = _host_leaves(tree, what)
    groups = _by_dtype(leaves)
    for dtype in groups:
        if dtype.kind not in ("f" if mean else "iuf"):
            raise TypeError(f"{what}: a leaf of dtype {dtype} (psum takes numbers, pmean floats)")
    for group in groups.values():
        buf = _pack(leaves, group)
        world.Allreduce(_mpi().IN_PLACE, buf)
        if mean:
            buf /= world.Get_size()
        _unpack(buf, leaves, group)
    return rebuild(leaves)


def _by_dtype(leaves):
    """{dtype: leaf positions}, in first-seen order (the same on every rank)."""
    groups = {}
    for i, x in enumerate(leaves):
        groups.setdefault(x.dtype, []).append(i)
    return groups


def _pack(leaves, group):
    return np.concatenate([leaves[i].ravel() for i in group])


def _unpack(buf, leaves, group):
    at = 0
    for i in group:
        x = leaves[i]
        leaves[i] = buf[at:at + x.size].reshape(x.shape)
        at += x.size
