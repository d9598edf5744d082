"""End to end: a tiny GPT learns, checkpoints round-trip bit for bit, and the examples run."""

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import burjit
from burjit import nn, optim
from burjit.pytree import flatten

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def _example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tiny():
    model = nn.GPT(vocab_size=6, block_size=8, n_layer=1, n_head=2, d_model=16)
    opt = optim.adamw(1e-2)
    params = model.init(0)
    return model, opt, params, opt.init(params)


def _train_step(model, opt, backend):
    def step(p, s, x, y):
        loss, g = burjit.value_and_grad(model.loss)(p, x, y)
        p, s = opt.update(p, g, s)
        return p, s, loss
    return burjit.compile(step, backend=backend, donate_argnums=(0, 1))


def test_a_few_hundred_steps_learn_a_pattern(backend):
    # "012345" repeated, with a random phase per row: the next token is always predictable.
    model, opt, params, state = _tiny()
    step = _train_step(model, opt, backend)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(200):
        seq = (rng.integers(0, 6, (4, 1)) + np.arange(9)) % 6
        params, state, loss = step(params, state, seq[:, :-1], seq[:, 1:])
        losses.append(float(loss))
    assert losses[0] > 1.5                     # ~ln 6 at init
    assert np.mean(losses[-10:]) < 0.1 * losses[0]
    assert len(step._cache) == 1
    # A token outside the vocabulary fails the step and leaves every parameter as it was.
    before = [a.copy() for a in flatten((params, state))[0]]
    with pytest.raises(IndexError):
        step(params, state, np.full((4, 8), 6), seq[:, 1:])
    assert all(np.array_equal(a, b) for a, b in zip(before, flatten((params, state))[0]))


def test_training_steps_agree_with_the_reference_backend(backend):
    """The whole float32 step (forward, backward, update) on this backend tracks the numpy oracle.

    SGD, not Adam: Adam turns rounding noise in exactly-zero gradients (the key bias: softmax
    ignores a constant added to every score) into full-size steps of random sign.
    """
    runs = {}
    for b in {backend, "reference"}:
        model, _, params, _ = _tiny()
        opt = optim.sgd(0.5, momentum=0.9)
        state = opt.init(params)
        step = _train_step(model, opt, b)
        rng = np.random.default_rng(1)
        losses = []
        for _ in range(5):
            seq = rng.integers(0, 6, (2, 9))
            params, state, loss = step(params, state, seq[:, :-1], seq[:, 1:])
            losses.append(float(loss))
        runs[b] = losses, flatten(params)[0]
    np.testing.assert_allclose(runs[backend][0], runs["reference"][0], rtol=1e-5)
    for a, b in zip(runs[backend][1], runs["reference"][1]):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_checkpoint_round_trips_bit_exactly(tmp_path):
    model, opt, params, state = _tiny()
    step = _train_step(model, opt, "reference")
    x = np.arange(16).reshape(2, 8) % 6
    for _ in range(3):
        params, state, _ = step(params, state, x, (x + 1) % 6)
    path = tmp_path / "ck.npz"
    nn.save(path, (params, state), {"vocab": "abc", "step": 3})
    fresh = _tiny()
    (p2, s2), meta = nn.load(path, like=(fresh[2], fresh[3]))
    assert meta == {"vocab": "abc", "step": 3} == nn.load_meta(path)
    for a, b in zip(flatten((params, state))[0], flatten((p2, s2))[0]):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    other = nn.GPT(vocab_size=6, block_size=8, n_layer=2, n_head=2, d_model=16).init(0)
    with pytest.raises(ValueError, match="blocks/1"):
        nn.load(path, like=(other, state))


TINY = {"block_size": 8, "n_layer": 1, "n_head": 2, "d_model": 16}


def _gpt_char_flags(tmp_path, ck):
    data = tmp_path / "text.txt"
    data.write_text("the cat sat on the mat. " * 40)
    return ["--data", str(data), "--checkpoint", ck, "--batch-size", "4", "--sample-chars", "20",
            "--prompt", "the "] + [a for k, v in TINY.items() for a in ("--" + k.replace("_", "-"), str(v))]


def test_gpt_char_trains_resumes_and_samples(tmp_path, capsys):
    gpt_char = _example("gpt_char")
    ck = str(tmp_path / "ck")  # no .npz: the checkpoint is written exactly where it was asked for
    flags = _gpt_char_flags(tmp_path, ck)
    gpt_char.main(flags + ["--steps", "30"])
    out = capsys.readouterr().out
    assert "steps 30: loss" in out and f"saved {ck}\n" in out and "\nthe " in out
    assert sorted(os.listdir(tmp_path)) == ["ck", "text.txt"]
    gpt_char.main(flags + ["--steps", "5", "--resume"])
    assert nn.load_meta(ck)["step"] == 35
    with pytest.raises(SystemExit, match="does not exist"):
        gpt_char.main(flags + ["--resume", "--checkpoint", str(tmp_path / "missing.npz")])
    (tmp_path / "junk.npz").write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit, match="cannot read"):
        gpt_char.main(flags + ["--resume", "--checkpoint", str(tmp_path / "junk.npz")])


def test_gpt_char_k_steps_per_call_train_the_same_parameters(tmp_path, capsys):
    """--steps-per-call 4 (a scan over 4 batches per call, the last call 3) ends where one
    step per call does."""
    gpt_char = _example("gpt_char")
    runs = []
    for k in ("1", "4"):
        ck = str(tmp_path / f"ck{k}")
        gpt_char.main(_gpt_char_flags(tmp_path, ck) + ["--steps", "11", "--steps-per-call", k, "--sample-chars", "0"])
        assert "steps 11: loss" in capsys.readouterr().out
        runs.append(dict(np.load(ck)))
    assert runs[0].keys() == runs[1].keys()
    for name, a in runs[0].items():
        if a.dtype.kind in "fi":  # parameters, optimizer state (the metadata is text)
            np.testing.assert_allclose(a, runs[1][name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_gpt_char_names_a_bad_byte_in_the_data_without_a_traceback(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\u00e9 ".encode("latin-1") * 50)
    run = subprocess.run([sys.executable, os.path.join(EXAMPLES, "gpt_char.py"), "--data", str(bad)],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert f"{bad} is not UTF-8 text: byte 0xe9 at offset 3" in run.stderr


@pytest.mark.parametrize("meta, message", [
    ([1, 2], "its metadata lacks vocab, step or config: not a gpt_char checkpoint"),
    ({"vocab": ".", "config": TINY}, "its metadata lacks vocab, step or config"),
    ({"vocab": 7, "step": 0, "config": TINY}, "metadata 'vocab' must be a non-empty string"),
    ({"vocab": "aa", "step": 0, "config": TINY}, "metadata 'vocab' must be .* distinct characters, not 'aa'"),
    ({"vocab": ". acehmnost", "step": "3", "config": TINY}, "metadata 'step' must be an integer >= 0, not '3'"),
    ({"vocab": ". acehmnost", "step": 0, "config": {"block_size": 8}}, "metadata 'config' must be an object"),
    ({"vocab": ". acehmnost", "step": 0, "config": dict(TINY, n_layer=True)},
     "metadata 'config.n_layer' must be an integer >= 1, not True"),
    ({"vocab": ". acehmnost", "step": 0, "config": dict(TINY, d_model=15)},
     "metadata 'config.d_model' 15 must be divisible by metadata 'config.n_head' 2"),
], ids=["list", "no-step", "vocab-type", "vocab-repeats", "step-type", "config-keys", "config-bool",
        "config-divisible"])
def test_gpt_char_resume_names_the_bad_metadata_field(tmp_path, meta, message):
    ck = str(tmp_path / "ck")
    nn.save(ck, {}, meta)  # metadata is checked before any array is read
    with pytest.raises(SystemExit, match=f"--resume: {re.escape(ck)}: {message}"):
        _example("gpt_char").main(_gpt_char_flags(tmp_path, ck) + ["--resume", "--steps", "1"])


def test_shipped_text_encodes():
    gpt_char = _example("gpt_char")
    text = gpt_char.load_text(gpt_char.DEFAULT_DATA)
    assert len(text) > 100_000
    assert len(gpt_char.encode(text, sorted(set(text)))) == len(text)


def test_micrograd_moons_demo_separates_the_moons():
    assert _example("micrograd_mlp").main([]) >= 0.95


def test_cnn_digits_example_learns():
    """conv2d, max_pool2d, argmax, a warmup-cosine schedule and AdamW's default mask, end to end."""
    assert _example("cnn_digits").main(["--steps", "150"]) >= 0.9
