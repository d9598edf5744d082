"""einsum against numpy.einsum on every backend, its gradients against finite differences,
its errors (naming the user's line) and its lowering: a pair of operands is one matmul."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import burjit
from burjit import ops as F
from test_grad_fd import check

CASES = [
    ("ij,jk", [(2, 3), (3, 4)]), ("ij,jk->ki", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (3, 4, 2)]), ("ijk,jil->kl", [(2, 3, 4), (3, 2, 5)]),
    ("i,i", [(4,), (4,)]), ("i,j", [(2,), (3,)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("ij,ij->ij", [(2, 3), (2, 3)]), ("ij,jk", [(2, 1), (3, 4)]), ("bA,ab", [(2, 3), (3, 2)]),
    ("ij->", [(2, 3)]), ("ji", [(2, 3)]), ("ii->", [(3, 3)]), ("iij->j", [(2, 2, 3)]), ("...,...", [(2,), ()]),
    ("abc,cd->", [(2, 3, 4), (4, 2)]), (" ij , jk -> ik ", [(2, 0), (0, 3)]),
]


@pytest.mark.parametrize("spec,shapes", CASES, ids=[c[0].replace(" ", "") for c in CASES])
def test_values_match_numpy(spec, shapes, backend):
    rng = np.random.default_rng(0)
    for dtype, tol in (("float64", 1e-12), ("float32", 2e-6)):
        xs = [rng.standard_normal(s).astype(dtype) for s in shapes]
        got = burjit.compile(lambda *a: F.einsum(spec, *a), backend=backend)(*xs)
        want = np.einsum(spec, *xs)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("spec,shapes", [("ij,jk", [(2, 3), (3, 2)]), ("bij,bkj->bki", [(2, 2, 3), (2, 2, 3)]),
                                         ("ij,jk,k->i", [(2, 3), (3, 2), (2,)]), ("iij->ji", [(2, 2, 3)])])
def test_gradients(spec, shapes):
    rng = np.random.default_rng(1)
    check(lambda *a: F.einsum(spec, *a), lambda *a: np.einsum(spec, *a),
          [rng.standard_normal(s) for s in shapes], "native")


def _ops(step, *args):
    graph = step.graph(*args)
    return [graph[n]["op"] for n in graph.nx.nodes]


@pytest.mark.parametrize("spec,shapes", [("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
                                         ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]), ("ijk,kj->i", [(2, 3, 4), (4, 3)])])
def test_two_operands_are_one_matmul(spec, shapes):
    xs = [np.ones(s) for s in shapes]
    ops = _ops(burjit.compile(lambda a, b: F.einsum(spec, a, b), backend="reference"), *xs)
    assert ops.count("matmul") == 1 and "mul" not in ops, ops


def test_integer_operands_alone_stay_integers_and_pairs_become_float64():
    x = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(burjit.compile(lambda a: F.einsum("ij->j", a))(x), x.sum(0))
    got = burjit.compile(lambda a: F.einsum("ij,kj", a, a))(x)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, x @ x.T)


@pytest.mark.parametrize("spec,shapes,message", [
    ("ij,jk", [(2, 3), (4, 4)], "index 'j' has size 3 in operand 0 and 4 in operand 1"),
    ("ij,jk", [(2, 3)], r"'ij,jk' names 2 operand\(s\), got 1"),
    ("ijk,jk", [(2, 3), (3, 4)], r"operand 0 has shape \(2, 3\), subscripts 'ijk' name 3 axes"),
    ("ij,jk->il", [(2, 3), (3, 4)], "output index 'l' is in no operand"),
    ("ij,jk->ii", [(2, 3), (3, 4)], "output index 'i' repeats"),
    ("i1", [(2, 3)], "bad subscripts 'i1'"),
    ("...ij,jk->ik", [(2, 2, 3), (3, 4)], "the output 'ik' has no '...'"),
    ("ii", [(2, 3)], "index 'i' repeats in operand 0"),
    ("...i,...i", [(2, 3), (4, 3)], "a '...' axis has size 2 in operand 0 and 4 in operand 1"),
])
def test_errors_name_the_line(spec, shapes, message):
    def f(*xs):
        return F.einsum(spec, *xs)  # the line
    with pytest.raises(burjit.ShapeError, match=message) as e:
        burjit.compile(f, backend="reference")(*[np.ones(s) for s in shapes])
    assert "test_einsum.py:" in str(e.value) and "# the line" in str(e.value)


@given(data=st.data())
def test_property_drawn_specs_match_numpy(data):
    """Two operands over drawn letters (repeats, sums, broadcasts of size 1 included) and a drawn
    output of letters that appear once in total or are kept, on the native backend."""
    sizes = dict(zip("abcde", data.draw(st.lists(st.integers(1, 3), min_size=5, max_size=5))))
    subs = [data.draw(st.lists(st.sampled_from("abcde"), max_size=3)) for _ in range(2)]
    used = sorted(set(subs[0]) | set(subs[1]))
    out = data.draw(st.permutations(used).map(lambda p: p[:data.draw(st.integers(0, len(p)))]))
    spec = f"{''.join(subs[0])},{''.join(subs[1])}->{''.join(out)}"
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal([sizes[i] for i in s]) for s in subs]
    np.testing.assert_allclose(burjit.compile(lambda a, b: F.einsum(spec, a, b))(*xs), np.einsum(spec, *xs),
                               rtol=1e-12, atol=1e-12, err_msg=spec)
