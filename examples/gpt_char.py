"""Train a miniature GPT on characters, end to end in one compiled burjit step, then sample.

    python examples/gpt_char.py                       # under a minute on 2 cores (native backend): loss 4.3 -> ~1.5
    python examples/gpt_char.py --steps 500 --resume  # continue from gpt_char.npz
    python examples/gpt_char.py --steps 0 --resume --sample-chars 1000   # only sample
    python examples/gpt_char.py --steps-per-call 32   # 32 steps per compiled call (burjit.scan)

The forward pass, the gradients, gradient clipping and the AdamW update are traced once
into one graph and compiled; parameters and optimizer state are updated in place. With
--steps-per-call K one call runs K steps over K pre-sampled batches (burjit.scan), the same
numbers with one Python call per K steps; the progress bar moves once per call. The
checkpoint (an .npz written by burjit.nn.save at exactly the --checkpoint path) holds
parameters, optimizer state, model config and vocabulary, so --resume continues exactly
where training stopped (Ctrl-C saves too; a failed save keeps the previous checkpoint).
"""

import argparse
import os
import sys
import time

import numpy as np
from tqdm import tqdm

import burjit
from burjit import nn, optim
from burjit import ops as F

DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "kjv_genesis_exodus.txt")
MODEL_FLAGS = ("block_size", "n_layer", "n_head", "d_model")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--data", default=DEFAULT_DATA, help="UTF-8 text file to train on")
    ap.add_argument("--steps", type=int, default=1000, help="training steps to run (0: only sample)")
    ap.add_argument("--steps-per-call", type=int, default=1, help="training steps one compiled call runs")
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
    if args.batch_size < 1 or args.steps_per_call < 1:
        ap.error("--batch-size and --steps-per-call must be >= 1")
    problem = config_problem(vars(args), lambda k: "--" + k.replace("_", "-"))
    if problem:
        ap.error(problem)
    if args.temperature <= 0:
        ap.error("--temperature must be > 0")
    return args


def config_problem(cfg, spell):
    """What is wrong with a model config (None if nothing), the field k spelled spell(k): the
    same rules for the command line and for a checkpoint's stored config."""
    for k in MODEL_FLAGS:
        if type(cfg[k]) is not int or cfg[k] < 1:  # type(): a JSON true is no layer count
            return f"{spell(k)} must be an integer >= 1, not {cfg[k]!r}"
    if cfg["d_model"] % cfg["n_head"]:
        return f"{spell('d_model')} {cfg['d_model']} must be divisible by {spell('n_head')} {cfg['n_head']}"
    return None


def meta_problem(meta):
    """What is wrong with a checkpoint's metadata (None if nothing), naming the field: a
    hand-edited file should fail with a sentence, not a traceback from deep in the model."""
    if not isinstance(meta, dict) or not {"vocab", "step", "config"} <= set(meta):
        return "its metadata lacks vocab, step or config: not a gpt_char checkpoint"
    vocab, step, cfg = meta["vocab"], meta["step"], meta["config"]
    if not isinstance(vocab, str) or not vocab or len(set(vocab)) != len(vocab):
        return f"metadata 'vocab' must be a non-empty string of distinct characters, not {vocab!r:.80}"
    if type(step) is not int or step < 0:
        return f"metadata 'step' must be an integer >= 0, not {step!r}"
    if not isinstance(cfg, dict) or set(cfg) != set(MODEL_FLAGS):
        return f"metadata 'config' must be an object with exactly {', '.join(MODEL_FLAGS)}, not {cfg!r}"
    return config_problem(cfg, lambda k: f"metadata 'config.{k}'")


def load_text(path):
    """The training text; decoded from bytes so a bad byte is reported at its offset in the file."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        sys.exit(f"cannot read the training text: {e}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        sys.exit(f"{path} is not UTF-8 text: byte {raw[e.start]:#04x} at offset {e.start} ({e.reason}); "
                 "--data must be a UTF-8 file")
    if not text:
        sys.exit(f"{path} is empty")
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as text mode reads


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


def make_steps(model, opt, clip, backend):
    """The compiled training call: (params, state, xs, ys) -> (params, state, losses), one step
    per batch of the stacked xs, ys."""
    def step(params, state, x, y):
        loss, grads = burjit.value_and_grad(model.loss)(params, x, y)
        params, state = opt.update(params, optim.clip_by_global_norm(grads, clip), state)
        return params, state, loss

    def steps(params, state, xs, ys):
        if len(xs) == 1:  # shapes are known while tracing: one step needs no loop around it
            params, state, loss = step(params, state, xs[0], ys[0])
            return params, state, F.reshape(loss, (1,))
        (params, state), losses = burjit.scan(lambda c, b: _pair(step(*c, *b)), (params, state), (xs, ys))
        return params, state, losses
    return burjit.compile(steps, backend=backend, donate_argnums=(0, 1))


def _pair(out):
    params, state, loss = out
    return (params, state), loss


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
        except (OSError, ValueError) as e:
            sys.exit(f"--resume: cannot read {args.checkpoint}: {e}")
        problem = meta_problem(meta)
        if problem:
            sys.exit(f"--resume: {args.checkpoint}: {problem}")
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

    steps = make_steps(model, opt, args.clip, args.backend)
    rng = np.random.default_rng([args.seed, meta["step"]])  # a resumed run draws new batches
    data_iter = batches(train, args.batch_size, cfg["block_size"], rng)
    done, first, compiled, timed = 0, None, set(), [0.0, 0]  # timed: seconds and steps of calls that compiled nothing
    try:
        with tqdm(total=args.steps, unit="step", dynamic_ncols=True, disable=not args.steps) as bar:
            while done < args.steps:
                xs, ys = zip(*(next(data_iter) for _ in range(min(args.steps_per_call, args.steps - done))))
                t = time.perf_counter()
                params, state, losses = steps(params, state, np.stack(xs), np.stack(ys))
                loss, n = float(losses[-1]), len(losses)
                if n in compiled:  # a call count of steps seen before: it compiled nothing
                    timed[0] += time.perf_counter() - t
                    timed[1] += n
                compiled.add(n)
                first = float(losses[0]) if first is None else first
                done += n
                bar.update(n)
                bar.set_postfix(loss=f"{loss:.3f}")
    except KeyboardInterrupt:
        print("\ninterrupted: saving what was trained")
    if done:
        meta["step"] = int(state["step"])  # the optimizer's own count stays right after a Ctrl-C
        nn.save(args.checkpoint, (params, state), meta)
        speed = f"{1e3 * timed[0] / timed[1]:.3g} ms/step after compile" if timed[1] else "no call after the compile"
        print(f"steps {meta['step']}: loss {first:.3f} -> {loss:.3f}, {speed}; saved {args.checkpoint}")
    if len(val) > cfg["block_size"]:
        eval_loss = burjit.compile(model.loss, backend=args.backend)
        vx, vy = next(batches(val, 32, cfg["block_size"], np.random.default_rng(0)))
        print(f"held-out loss {float(eval_loss(params, vx, vy)):.3f}")
    if args.sample_chars:
        print("-" * 60)
        print(sample(model, params, vocab, args.prompt, args.sample_chars, args.temperature, rng, args.backend))


if __name__ == "__main__":
    main()
