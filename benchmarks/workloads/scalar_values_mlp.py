"""micrograd's moons MLP (2-16-16-1, ReLU, SVM hinge loss + L2) written the way micrograd's users
write it: one scalar per value, neuron by neuron, Python sums (scalar_mlp runs the same model on
arrays). At batch 32 a graph of 66,452 traced scalar nodes, forward and backward: the scalar tiers'
ground.
"""

from . import Train
from . import scalar_mlp

SIZES = scalar_mlp.SIZES
_UNROLLED = ("a tracing compiler given ~60k scalar ops: jax.jit took 29.6 s and 3.88 GB at batch 4 (python -m "
             "benchmarks --quick --only scalar_values_mlp, 2026-12-04); batch 32 risks the machine's memory")
SKIP = {name: _UNROLLED for name in ("jax", "torch.compile", "tf.function", "tflite", "mlx.compile")}


def values_loss(xp, p, batch):
    x, y = batch
    layers = [([xp.unstack(row) for row in xp.unstack(p[f"w{i}"])], xp.unstack(p[f"b{i}"]))
              for i in range(len(SIZES) - 1)]
    margins = []
    for sample, label in zip(xp.unstack(x), xp.unstack(y)):
        h = xp.unstack(sample)
        for i, (w, b) in enumerate(layers):
            h = [sum((w[j][k] * h[j] for j in range(len(h))), b[k]) for k in range(len(b))]
            if i < len(layers) - 1:
                h = [xp.relu(v) for v in h]
        margins.append(xp.relu(1.0 - label * h[0]))
    reg = sum(v * v for w, _ in layers for row in w for v in row)
    return sum(margins) * (1.0 / len(margins)) + scalar_mlp.ALPHA * reg


def cases(quick):
    return [{"batch": 4 if quick else 32}]


def make(case, dtype):
    arrays = scalar_mlp.make(case, dtype)
    return Train(values_loss, arrays.params, arrays.batch, arrays.lr)
