"""What compiling costs the training process: memory kept per compile, peak RSS, compile time,
with the compile server (the default on Linux) and with BURJIT_COMPILE_IN_PROCESS=1.

    python -m benchmarks.compile_memory [--compiles 100] [--rounds 2]

Each measurement is a fresh process with an empty cache: `kept` is the RSS growth over
`--compiles` fresh compiles of small distinct steps, each deleted after one call (after a first
batch that warms LLVM up), `small` the mean time of one such compile and call; `gpt` is BurTorch's
mini GPT (6 layers, d 24, batch 1, float32) value and gradient: its first call and the process's
peak RSS (VmHWM) at the end. Rounds alternate the two modes.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import gc, json, os, sys, time
import numpy as np
import burjit
from burjit import nn, ops as F

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def compiles(start, n):
    for k in range(start, start + n):
        step = burjit.compile(lambda x, k=k: F.tanh(x) * float(k) + F.exp(x))
        step(np.ones(5))
        del step
    gc.collect()

n = int(sys.argv[1])
compiles(0, n)  # LLVM's one-time set-up
before, t = rss(), time.perf_counter()
compiles(n, n)
small, kept = (time.perf_counter() - t) / n, (rss() - before) / n
model = nn.GPT(vocab_size=65, block_size=8, n_layer=6, n_head=6, d_model=24, qkv_bias=False,
               activation="relu", head_bias=True)
p, idx = model.init(0), np.random.default_rng(0).integers(0, 65, (1, 8))
t = time.perf_counter()
burjit.compile(lambda p, i: burjit.value_and_grad(model.loss)(p, i, i))(p, idx)
gpt = time.perf_counter() - t
peak = next(int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps(dict(kept=kept, small=small, gpt=gpt, peak=peak)))
"""

MODES = {"compile server": {}, "in process": {"BURJIT_COMPILE_IN_PROCESS": "1"}}


def measure(mode, compiles):
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, **MODES[mode], "BURJIT_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-c", CHILD, str(compiles)], env=env, check=True,
                             capture_output=True, text=True).stdout
    return json.loads(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compiles", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    opts = ap.parse_args(argv)
    print(f"{'mode':16} {'kept/compile':>13} {'small compile':>14} {'gpt first call':>15} {'peak RSS':>9}")
    for _ in range(opts.rounds):
        for mode in MODES:
            r = measure(mode, opts.compiles)
            print(f"{mode:16} {r['kept'] / 1e3:10.1f} KB {r['small'] * 1e3:11.1f} ms {r['gpt']:13.2f} s "
                  f"{r['peak'] / 2**20:6.0f} MB", flush=True)


if __name__ == "__main__":
    main()
