"""BurTorch's mini GPT: block 8, d_model 24, 6 heads, 6 layers, vocab 65, one SGD step (lr 3e-4) on
random tokens, batch 1, 16 and 64, float32 and float64.

The architecture of Karpathy's "Let's build GPT" that BurTorch reproduces: token + position
embeddings; per pre-LN block, causal attention with per-head key/query/value Linear(24, 4)
without bias (as one bias-free Linear(24, 72), the same model), an output projection with bias,
an MLP 24 -> 96 -> 24 with ReLU and biases; a final LayerNorm, a vocab head with bias; every
weight ~ N(0, 0.02). burjit runs it as burjit.nn.GPT(qkv_bias=False, activation="relu",
head_bias=True), the peers as workloads/gpt.py's twin.

Parameters, 46,337: embeddings 65*24 + 8*24 = 1,752; per block LN 48 + q/k/v 3*24*24 = 1,728
+ projection 24*24+24 = 600 + LN 48 + MLP (24*96+96) + (96*24+24) = 4,728, so 7,152, times 6
= 42,912; final LN 48; head 24*65+65 = 1,625.
"""

import numpy as np

from ..frameworks import named_leaves
from . import gpt

SKIP = gpt.SKIP
DTYPES = ("float32", "float64")
CONFIG = dict(vocab_size=65, block_size=8, n_layer=6, n_head=6, d_model=24, qkv_bias=False,
              activation="relu", head_bias=True)
N_PARAMS = 46337
LR = 3e-4
PUBLISHED = ("BurTorch paper (its authors' machine, float32): batch 1 0.525 ms per step vs PyTorch "
             "12.18 ms; batch 64 31.7 ms vs PyTorch 22.2 ms")


def cases(quick):
    return [{"batch": b} for b in ((1,) if quick else (1, 16, 64))]


def make(case, dtype):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, CONFIG["vocab_size"], (case["batch"], CONFIG["block_size"] + 1))
    work = gpt.train(CONFIG, dtype, (tokens[:, :-1].copy(), tokens[:, 1:].copy()), LR)  # fresh arrays, as a loader's
    n = sum(a.size for a in named_leaves(work.params).values())
    assert n == N_PARAMS, f"{n} parameters, BurTorch's GPT has {N_PARAMS}"
    return work
