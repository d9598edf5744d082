"""burjit.tree: containers keep their types, key paths, registered nodes, dataclasses with
static fields in the cache key; and compiled steps taking keyword arguments and static_argnames."""

import collections
import dataclasses

import numpy as np
import pytest

import burjit
from burjit import ops as F
from burjit import tree

Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass
class Layer:
    w: np.ndarray
    b: np.ndarray
    act: str = dataclasses.field(default="relu", metadata={"static": True})


class Box:
    """A custom node: its value is a child, its label goes into the structure."""

    def __init__(self, value, label):
        self.value, self.label = value, label


tree.register(Box, lambda b: ([b.value], b.label), lambda label, children: Box(children[0], label))


def _example():
    return {"layer": Layer(np.ones((2, 2)), np.zeros(2)), "pair": Pair(np.arange(3.0), None),
            "od": collections.OrderedDict([("z", np.ones(1)), ("a", np.full(1, 2.0))]), "box": Box(np.ones(3), "x")}


def test_flatten_keeps_types_order_and_paths():
    t = _example()
    pairs, treedef = tree.flatten_with_path(t)
    assert [p for p, _ in pairs] == [("box", 0), ("layer", "w"), ("layer", "b"), ("od", "z"), ("od", "a"),
                                     ("pair", 0)]  # dicts sorted, an OrderedDict in its order
    back = tree.unflatten(treedef, [x * 2 for _, x in pairs])
    assert type(back["layer"]) is Layer and back["layer"].act == "relu" and type(back["pair"]) is Pair
    assert type(back["od"]) is collections.OrderedDict and list(back["od"]) == ["z", "a"]
    assert type(back["box"]) is Box and back["box"].label == "x" and back["pair"].b is None
    assert np.array_equal(back["layer"].w, 2 * t["layer"].w)
    assert tree.structure(t) == treedef and len(tree.leaves(t)) == 6
    assert tree.structure(dataclasses.replace(t["layer"], act="tanh")) != tree.structure(t["layer"])
    assert tree.structure(Box(1, "y")) != tree.structure(Box(1, "x"))


def test_map_and_map_with_path():
    t = _example()
    doubled = tree.map(lambda x, y: x + y, t, t)
    assert np.array_equal(doubled["od"]["a"], [4.0])
    named = tree.map_with_path(lambda path, x: "/".join(map(str, path)), t)
    assert named["layer"].b == "layer/b" and named["box"].value == "box/0"
    with pytest.raises(ValueError, match="different structures"):
        tree.map(lambda x, y: x, {"a": 1}, {"b": 1})


def test_unhashable_static_part_is_refused():
    with pytest.raises(TypeError, match="not hashable"):
        tree.flatten(Box(np.ones(1), ["a", "list"]))


def test_a_step_takes_and_returns_dataclasses_and_retraces_on_static_fields(backend):
    @burjit.compile(backend=backend)
    def forward(layer, x):
        h = x @ layer.w + layer.b
        return F.relu(h) if layer.act == "relu" else F.tanh(h), collections.OrderedDict(h=h)

    rng = np.random.default_rng(0)
    layer, x = Layer(rng.standard_normal((2, 2)), rng.standard_normal(2)), rng.standard_normal((3, 2))
    for _ in range(2):  # the second call takes the fast path, which must flatten a dataclass too
        y, extra = forward(layer, x)
        h = x @ layer.w + layer.b
        np.testing.assert_allclose(y, np.maximum(h, 0), rtol=1e-12)
        assert type(extra) is collections.OrderedDict
        layer = Layer(layer.w + 1, layer.b)
    y, _ = forward(dataclasses.replace(layer, act="tanh"), x)
    np.testing.assert_allclose(y, np.tanh(x @ layer.w + layer.b), rtol=1e-12)
    assert len(forward._cache) == 2


def test_gradients_come_back_as_the_parameters_type():
    loss = lambda layer, x: F.sum(F.tanh(x @ layer.w + layer.b))  # noqa: E731
    layer, x = Layer(np.eye(2), np.ones(2)), np.ones((1, 2))
    g = burjit.compile(burjit.grad(loss))(layer, x)
    assert type(g) is Layer and g.act == "relu"
    np.testing.assert_allclose(g.b, 1 - np.tanh(2.0) ** 2, rtol=1e-12)


def test_keyword_arguments_and_static_argnames(backend):
    @burjit.compile(backend=backend, static_argnames="act")
    def f(w, x, scale=2.0, act="relu"):
        return w + (F.relu(x) if act == "relu" else F.tanh(x)) * scale

    w, x = np.zeros(2), np.array([-1.0, 1.0])
    assert np.array_equal(f(w, x), [0.0, 2.0])
    assert np.array_equal(f(w, x), [0.0, 2.0])  # fast path now: keyword calls must still bind
    assert np.array_equal(f(w, x=x), [0.0, 2.0])
    assert np.array_equal(f(x=x, w=w, scale=np.array(3.0)), [0.0, 3.0])
    np.testing.assert_allclose(f(w, x, act="tanh"), 2 * np.tanh(x))
    with pytest.raises(TypeError, match="f: got an unexpected keyword argument 'y'"):
        f(w, x, y=1)
    with pytest.raises(ValueError, match="has no parameter 'b'"):
        burjit.compile(lambda a: a, static_argnames="b")


def test_keyword_only_parameters_and_var_keywords(backend):
    """They are traced like positions (arrays inputs, Python scalars static), static_argnames
    names them too, and grad's argnums and donation still count positions."""
    calls = []

    @burjit.compile(backend=backend, static_argnames=("mode", "extra"))
    def f(x, *rest, lr=0.5, mode="add", **kw):
        calls.append(mode)
        y = x + lr * sum(rest) if mode == "add" else x * lr
        return y + sum(kw.get(k, 0.0) for k in sorted(kw) if k != "extra") + len(kw.get("extra", ""))

    x, r = np.ones(2), np.array([1.0, 2.0])
    assert np.array_equal(f(x, r), [1.5, 2.0])
    assert np.array_equal(f(x, r, lr=np.array(2.0)), [3.0, 5.0])  # an array: traced, one entry for all values
    assert np.array_equal(f(x, r, lr=np.array(1.0)), [2.0, 3.0])
    assert np.array_equal(f(x, r, mode="scale"), [0.5, 0.5])  # a str, static by name
    assert np.array_equal(f(x, r, r, b=np.ones(2), extra="ab"), [5.0, 6.0])  # **kwargs, one static
    assert calls == ["add", "add", "scale", "add"]
    p = np.ones(3)
    step = burjit.compile(lambda p, g, *, lr: p - lr * g, backend=backend, donate_argnums=-1)
    assert step(np.ones(3), p, lr=np.array(0.5)) is p  # -1: the last position, not the keywords
    assert np.array_equal(p, [0.5] * 3)
    plain = burjit.compile(lambda p, g, *, lr=0.25: p - lr * g, backend=backend, donate_argnums=1)
    for _ in range(2):  # no keywords given: the second call takes the fast path
        assert plain(np.ones(3), p) is p
    assert np.array_equal(p, [1 - 0.25 * (1 - 0.25 * 0.5)] * 3)
    if backend == "native":  # the backend with a fast path
        assert type(plain).__call__ is not burjit.jit.CompiledFunction.__call__
    assert np.array_equal(plain(np.ones(3), np.ones(3), lr=np.array(1.0)), [0.0] * 3)  # then a keyword again
    with pytest.raises(burjit.TracingError, match="keyword arguments: unsupported leaf of type str"):
        f(x, r, b="no")
    g = burjit.compile(burjit.grad(lambda x, *, w: F.sum(x * w)))(np.ones(2), w=np.array([3.0, 4.0]))
    assert np.array_equal(g, [3.0, 4.0])
    with pytest.raises(ValueError, match="has no parameter 'c'"):
        burjit.compile(lambda a, *, k: a, static_argnames="c")


def test_donation_counts_a_keyword_argument_at_its_position():
    step = burjit.compile(lambda p, g: p - 0.5 * g, donate_argnums=0)
    p = np.ones(3)
    out = step(g=np.ones(3), p=p)
    assert out is p and np.array_equal(p, [0.5] * 3)


def test_register_refuses_what_would_break_later():
    class Bad:
        def __init__(self, aux):
            self.aux = aux

    with pytest.raises(TypeError, match="node_type must be a class"):
        tree.register(Bad(1), lambda b: ((), None), lambda a, c: None)
    with pytest.raises(ValueError, match="dict is a pytree node already"):
        tree.register(dict, lambda d: ((), None), lambda a, c: {})
    with pytest.raises(ValueError, match="Box is a pytree node already"):
        tree.register(Box, lambda b: ((), None), lambda a, c: None)
    with pytest.raises(TypeError, match="must be callables, got function and NoneType"):
        tree.register(Bad, lambda b: ((), None), None)
    tree.register(Bad, lambda b: b.aux, lambda aux, children: Bad(aux))
    with pytest.raises(TypeError, match=r"Bad's flatten must return \(children, aux\), got int"):
        tree.flatten(Bad(3))
    with pytest.raises(TypeError, match=r"a Bad's static part .* is not hashable"):
        burjit.compile(lambda b: 1.0)(Bad(([np.ones(1)], [1])))
    leaves, td = tree.flatten(Bad(((np.ones(1),), "ok")))  # a well-formed pair is accepted
    assert len(leaves) == 1 and tree.unflatten(td, leaves).aux == "ok"
