"""Run under mpiexec by test_distributed.py: data-parallel training equals one process's full batch.

    mpiexec -n N python tests/mpi_program.py train mlp|gpt [micro-batches per shard]
    mpiexec -n N python tests/mpi_program.py edges
    mpiexec -n N python tests/mpi_program.py fail [raise|index]
(with $BURJIT_COLLECTIVES=host the steps run split at their collectives, burjit/staged.py)

`train`: each rank trains on its shard with pmean'd gradients (distributed.train_step: one
compiled step; with micro-batches, accumulated inside it, then one pmean); rank 0 checks that every rank
holds bit-identical parameters and that they equal full-batch training in one process within
1e-12 (float64), then prints "OK ...". `fail`: the last rank raises (or its compiled step
refuses an index) while the others wait in an allreduce; abort_on_error must end the job with
that rank's message.
"""

import os
import sys

import numpy as np

import burjit
from burjit import distributed as dist
from burjit import nn, optim, staged
from burjit.pytree import flatten


def _model(name):
    """(loss(params, x, y), params on rank 0, optimizer, global batches(step) -> (x, y))."""
    rng = np.random.default_rng(0)
    if name == "mlp":
        layers = [nn.Linear(3, 16, dtype="float64"), nn.Linear(16, 1, dtype="float64")]

        def loss(p, x, y):
            return burjit.ops.mean((layers[1](p[1], burjit.ops.tanh(layers[0](p[0], x))) - y) ** 2.0)
        params = [layer.init(rng) for layer in layers]
        xs = rng.standard_normal((40, 12, 3))
        return loss, params, optim.sgd(0.1, momentum=0.9), lambda t: (xs[t], np.sin(xs[t].sum(1, keepdims=True)))
    model = nn.GPT(vocab_size=7, block_size=6, n_layer=1, n_head=2, d_model=8, dtype="float64")
    seqs = (rng.integers(0, 7, (40, 12, 1)) + np.arange(7)) % 7
    # SGD, not AdamW: Adam's g / sqrt(v) turns last-bit differences of near-zero gradients into
    # 1e-11 after 40 steps (measured), which would hide the 1e-16 of the averaging itself
    return model.loss, model.init(0), optim.sgd(0.3, momentum=0.9), lambda t: (seqs[t, :, :-1], seqs[t, :, 1:])


def _trainers(loss, opt):
    grads = burjit.compile(burjit.value_and_grad(loss))

    def update(p, s, g):
        return opt.update(p, g, s)
    return grads, burjit.compile(update, donate_argnums=(0, 1))


def _vector(tree):
    return np.concatenate([x.ravel() for x in flatten(tree)[0]])


def train(name, steps=40, micro=1):
    loss, params, opt, batch = _model(name)
    params = dist.broadcast(params if dist.rank() == 0 else None)
    state = opt.init(params)
    grads, update = _trainers(loss, opt)
    step = dist.train_step(loss, opt, micro)
    for t in range(steps):
        params, state, _ = step(params, state, *batch(t))
    reduces = [n for n in step.compiled.graph().nx.nodes if step.compiled.graph()[n]["op"] == "allreduce"]
    assert len(reduces) == 1, f"{len(reduces)} allreduce nodes for {micro} micro-batches"  # float64 only
    split = isinstance(step.compiled.lower().executable, staged.Staged)
    assert split == (staged.mode() == "host") and (not split or len(step.compiled.lower().executable.stages()) == 2)
    mine = _vector(params)
    every = dist.comm().gather(mine, root=0)
    if dist.rank() != 0:
        return
    assert all(np.array_equal(x.view(np.uint64), mine.view(np.uint64)) for x in every), "ranks differ"
    ref = _model(name)[1]
    ref_state, start = opt.init(ref), _vector(ref)  # a copy: the update is donated
    for t in range(steps):
        _, g = grads(ref, *batch(t))
        ref, ref_state = update(ref, ref_state, g)
    want = _vector(ref)
    diff, moved = float(np.max(np.abs(want - mine))), float(np.max(np.abs(want - start)))
    assert diff <= 1e-12 and moved > 1e-3, (diff, moved)
    print(f"OK train {name} micro={micro} ranks={dist.size()} collectives={staged.mode()} max|ranks - one process|={diff:.3g} "
          f"(parameters moved {moved:.3g})")


def edges():
    r, n = dist.rank(), dist.size()
    got = dist.psum({"i": np.array([r, 1], np.int64), "f": np.float64(r), "h": np.ones(2, np.float32)})
    assert got["i"].tolist() == [n * (n - 1) // 2, n] and got["f"] == n * (n - 1) / 2
    assert got["h"].dtype == np.float32 and got["h"].tolist() == [n, n]
    assert float(dist.pmean(np.float64(r))) == (n - 1) / 2
    try:
        dist.pmean(np.arange(3))
    except TypeError as e:
        assert "int64" in str(e)
    else:
        raise AssertionError("pmean of ints accepted")
    in_step(r, n)
    tree = dist.broadcast({"a": np.arange(3.0) + r, "b": [np.int32(7 + r)]} if r == 0 else None)
    assert tree["a"].tolist() == [0.0, 1.0, 2.0] and tree["b"][0] == 7 and tree["b"][0].dtype == np.int32
    part = dist.shard({"x": np.arange(6 * n).reshape(3 * n, 2), "y": np.arange(3 * n)})
    assert part["y"].tolist() == list(range(3 * r, 3 * r + 3)) and part["x"].shape == (3, 2)
    for bad, says in (({"x": np.ones(n + 1)} if n > 1 else None, "does not split evenly"),
                      ({"x": np.ones(2 * n), "y": np.ones(4 * n)}, "same leading axis")):
        if bad is None:
            continue
        try:
            dist.shard(bad)
        except ValueError as e:
            assert says in str(e), e
        else:
            raise AssertionError(f"shard accepted {bad}")
    if r == 0:
        print(f"OK edges ranks={n} collectives={staged.mode()}")


def in_step(r, n):
    """psum/pmean inside compiled steps: one allreduce node per dtype, the same values on the
    native and reference backends, inside a loop too; no gradient through them."""
    def f(x, y):
        s = dist.psum({"a": x * 2.0, "b": y, "c": burjit.ops.sum(x)})
        return s, dist.pmean(x)
    x, y = np.arange(6.0).reshape(2, 3) + r, np.arange(3, dtype=np.int64) * (r + 1)
    step = burjit.compile(f)
    for backend in ("native", "reference") + (("mlir",) if _mlir_tools() and staged.mode() == "native" else ()):
        s, m = burjit.compile(f, backend=backend)(x, y)
        base = np.arange(6.0).reshape(2, 3)
        assert np.array_equal(s["a"], 2 * (n * base + n * (n - 1) / 2)) and s["b"].dtype == np.int64, (backend, s)
        assert s["b"].tolist() == (np.arange(3) * n * (n + 1) // 2).tolist() and m.tolist() == (base + (n - 1) / 2).tolist()
        assert float(s["c"]) == n * 15 + 6 * n * (n - 1) / 2
    ops = [step.graph(x, y)[k]["op"] for k in step.graph(x, y).nx.nodes]
    assert ops.count("allreduce") == 3, ops  # float64 tree, int64 tree, pmean's own tree
    looped = burjit.compile(lambda v: burjit.fori_loop(0, 3, lambda i, c: dist.psum(c) / n + 1.0, v))
    if staged.mode() == "native":
        assert looped(np.full(2, float(r))).tolist() == [(n - 1) / 2 + 3.0] * 2
        if _mlir_tools():
            on_mlir = burjit.compile(lambda v: burjit.fori_loop(0, 3, lambda i, c: dist.psum(c) / n + 1.0, v),
                                     backend="mlir")
            assert on_mlir(np.full(2, float(r))).tolist() == [(n - 1) / 2 + 3.0] * 2
    else:
        _refused(lambda: looped(np.full(2, float(r))), "inside a loop needs the native collective")
        plan = step.lower(x, y).executable.plan
        kinds = ["allreduce" if isinstance(p, staged.Collective) else "stage" for p in plan]
        assert kinds == ["stage", "allreduce", "allreduce", "allreduce", "stage"], kinds
    _refused(lambda: burjit.compile(burjit.grad(lambda x: dist.pmean(burjit.ops.sum(x * x))))(np.ones(2)),
             "pmean the gradients")


def _mlir_tools():
    """Whether the mlir backend can run here (CI requires it: $BURJIT_REQUIRE_MLIR=1)."""
    from burjit.codegen import mlir_backend
    try:
        return bool(mlir_backend.tools())
    except mlir_backend.MissingTools:
        if os.environ.get("BURJIT_REQUIRE_MLIR") == "1":
            raise
        return False


def _refused(call, says):
    try:
        call()
    except burjit.TracingError as e:
        assert "mpi_program.py" in str(e) and says in str(e), e
    else:
        raise AssertionError(f"accepted, where it should refuse with {says!r}")


def fail(how):
    dist.abort_on_error()
    last = dist.rank() == dist.size() - 1
    if how == "raise":
        if last:
            raise ValueError(f"rank {dist.rank()}: a bad batch")
        dist.pmean(np.ones(3))  # would wait forever for the failed rank without the abort
        return
    # "index": the last rank's shard holds a token out of range; its native step refuses it
    # while the other rank waits inside its own native step's MPI_Allreduce
    loss, params, opt, batch = _model("gpt")
    x, y = batch(0)
    x[-1, 0] = 99 if last else x[-1, 0]
    step = dist.train_step(loss, opt)
    step(params, opt.init(params), x, y)


if __name__ == "__main__":
    dist.init()
    modes = {"train": lambda: train(sys.argv[2], micro=int(sys.argv[3]) if len(sys.argv) > 3 else 1),
             "edges": edges, "fail": lambda: fail(sys.argv[2] if len(sys.argv) > 2 else "raise")}
    modes[sys.argv[1]]()
