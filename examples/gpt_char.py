"""Train a miniature GPT on characters, end to end in one compiled burjit step, then sample.

    python examples/gpt_char.py                       # under a minute on 2 cores (native backend): loss 4.3 -> ~1.5
    python examples/gpt_char.py --steps 500 --resume  # continue from gpt_char.npz
    python examples/gpt_char.py --steps 0 --resume --sample-chars 1000   # only sample

The forward pass, the gradients, gradient clipping and the AdamW update are traced once
into one graph and compiled; parameters and optimizer state are updated in place. The
checkpoint (.npz) holds parameters, optimizer state, model config and vocabulary, so
--resume continues exactly where training stopped (Ctrl-C saves too).
"""

import argparse
import os
import sys
import time
import zipfile

import numpy as np
from tqdm import tqdm

import burjit
from burjit import nn, optim

DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "kjv_genesis_exodus.txt")
MODEL_FLAGS = ("block_size", "n_layer", "n_head", "d_model")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--data", default=DEFAULT_DATA, help="UTF-8 text file to train on")
    ap.add_argument("--steps", type=int, default=1000, help="training steps to run (0: only sample)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=64, help="context length in characters")
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip")
    ap.add_argument("--seed", type=int, default=0, help="seeds init, batches and sampling")
    ap.add_argument("--checkpoint", default="gpt_char.npz", help="where to save (and --resume from)")
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    ap.add_argument("--sample-chars", type=int, default=300, help="characters to sample at the end")
    ap.add_argument("--prompt", default="And God said", help="text the sample starts from")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--backend", default=None, help="burjit backend (default: native if available)")
    args = ap.parse_args(argv)
    for name in ("steps", "sample_chars"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    for name in ("batch_size",) + MODEL_FLAGS:
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.d_model % args.n_head:
        ap.error(f"--d-model {args.d_model} must be divisible by --n-head {args.n_head}")
    if args.temperature <= 0:
        ap.error("--temperature must be > 0")
    return args


def load_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        sys.exit(f"cannot read the training text: {e}")
    if not text:
        sys.exit(f"{path} is empty")
    return text


def encode(text, vocab):
    pos = {c: i for i, c in enumerate(vocab)}
    missing = sorted(set(text) - set(pos))
    if missing:
        sys.exit(f"characters {''.join(missing)!r} are not in the model's vocabulary")
    return np.array([pos[c] for c in text], np.int64)


def batches(data, batch_size, block_size, rng):
    """Endless random (x, y) windows, y being x shifted by one character."""
    offsets = np.arange(block_size)
    while True:
        starts = rng.integers(0, len(data) - block_size, batch_size)[:, None]
        yield data[starts + offsets], data[starts + offsets + 1]


def make_step(model, opt, clip, backend):
    def step(params, state, x, y):
        loss, grads = burjit.value_and_grad(model.loss)(params, x, y)
        params, state = opt.update(params, optim.clip_by_global_norm(grads, clip), state)
        return params, state, loss
    return burjit.compile(step, backend=backend, donate_argnums=(0, 1))


def sample(model, params, vocab, prompt, n, temperature, rng, backend):
    """Append n characters to prompt, one at a time, from softmax(logits / temperature).

    The context always has block_size slots, so one compiled program serves every length:
    a short context sits left-aligned and the rest is padding, which the causal mask keeps
    from influencing the position we read.
    """
    T = model.block_size
    logits_fn = burjit.compile(model, backend=backend)
    tokens = list(encode(prompt, vocab)) or [0]
    for _ in range(n):
        ctx = tokens[-T:]
        window = np.zeros((1, T), np.int64)
        window[0, :len(ctx)] = ctx
        z = logits_fn(params, window)[0, len(ctx) - 1].astype(np.float64) / temperature
        p = np.exp(z - z.max())
        tokens.append(int(rng.choice(len(vocab), p=p / p.sum())))
    return "".join(vocab[t] for t in tokens)


def main(argv=None):
    args = parse_args(argv)
    text = load_text(args.data)
    meta = {"vocab": "".join(sorted(set(text))), "step": 0,
            "config": {k: getattr(args, k) for k in MODEL_FLAGS}}
    if args.resume:
        if not os.path.exists(args.checkpoint):
            sys.exit(f"--resume: {args.checkpoint} does not exist (train once without --resume first)")
        try:
            meta = nn.load_meta(args.checkpoint)
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            sys.exit(f"--resume: cannot read {args.checkpoint}: {e}")
        if not {"vocab", "step", "config"} <= set(meta) or set(meta["config"]) != set(MODEL_FLAGS):
            sys.exit(f"--resume: {args.checkpoint} is not a gpt_char checkpoint")
        changed = [k for k in MODEL_FLAGS if getattr(args, k) != meta["config"][k]]
        if changed:
            print(f"note: using the checkpoint's {', '.join(changed)} (model shape is fixed by the checkpoint)")
    vocab, cfg = meta["vocab"], meta["config"]
    data = encode(text, vocab)
    if len(data) < cfg["block_size"] + 2:
        sys.exit(f"{args.data} has {len(data)} characters; it needs more than --block-size + 1")
    split = int(0.9 * len(data)) if len(data) > 10 * (cfg["block_size"] + 1) else len(data)
    train, val = data[:split], data[split:]

    model = nn.GPT(len(vocab), **cfg)
    opt = optim.adamw(args.lr, weight_decay=args.weight_decay)
    params = model.init(args.seed)
    state = opt.init(params)
    if args.resume:
        try:
            (params, state), meta = nn.load(args.checkpoint, like=(params, state))
        except ValueError as e:
            sys.exit(f"--resume: {e}")
    n_params = sum(a.size for a in burjit.pytree.flatten(params)[0])
    print(f"{len(data):,} characters, vocabulary {len(vocab)}, model {n_params:,} parameters, "
          f"backend {args.backend or burjit.jit.default_backend()}")

    step = make_step(model, opt, args.clip, args.backend)
    rng = np.random.default_rng([args.seed, meta["step"]])  # a resumed run draws new batches
    data_iter = batches(train, args.batch_size, cfg["block_size"], rng)
    done, t0, first = 0, None, None
    try:
        with tqdm(range(args.steps), unit="step", dynamic_ncols=True, disable=not args.steps) as bar:
            for _ in bar:
                x, y = next(data_iter)
                params, state, loss = step(params, state, x, y)
                loss = float(loss)
                if first is None:
                    first, t0 = loss, time.perf_counter()  # timing starts after the compile
                done += 1
                bar.set_postfix(loss=f"{loss:.3f}")
    except KeyboardInterrupt:
        print("\ninterrupted: saving what was trained")
    if done:
        meta["step"] = int(state["step"])  # the optimizer's own count stays right after a Ctrl-C
        nn.save(args.checkpoint, (params, state), meta)
        ms = 1e3 * (time.perf_counter() - t0) / max(done - 1, 1)
        print(f"steps {meta['step']}: loss {first:.3f} -> {loss:.3f}, {ms:.1f} ms/step after compile; "
              f"saved {args.checkpoint}")
    if len(val) > cfg["block_size"]:
        eval_loss = burjit.compile(model.loss, backend=args.backend)
        vx, vy = next(batches(val, 32, cfg["block_size"], np.random.default_rng(0)))
        print(f"held-out loss {float(eval_loss(params, vx, vy)):.3f}")
    if args.sample_chars:
        print("-" * 60)
        print(sample(model, params, vocab, args.prompt, args.sample_chars, args.temperature, rng, args.backend))


if __name__ == "__main__":
    main()
