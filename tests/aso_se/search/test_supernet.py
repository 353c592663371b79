"""The supernet sums each node's terms at once; it must equal summing FastMixedOp edges one by one."""
from __future__ import annotations

import pytest
import torch

from aso_se.search.arch_params import active_weights
from aso_se.search.mixed_op import sum_terms, weighted_sum
from aso_se.search.supernet import SearchCell, node_terms
from tests.aso_se.helpers import sample_ops, tiny_supernet


@pytest.mark.parametrize("count", [1, 2, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weighted_sum_equals_the_sum_of_products_forward_and_backward(count: int, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(count)
    terms = [torch.randn(3, 5, 7, 9, generator=generator, dtype=dtype, requires_grad=True) for _ in range(count)]
    weights = torch.rand(count, generator=generator, dtype=dtype, requires_grad=True)
    grad_out = torch.randn(3, 5, 7, 9, generator=generator, dtype=dtype)

    def run(combine):
        out = combine()
        grads = torch.autograd.grad(out, [*terms, weights], grad_out)
        return out, grads

    got, got_grads = run(lambda: weighted_sum(terms, weights))
    want, want_grads = run(lambda: sum_terms(w * t for w, t in zip(weights, terms)))
    assert got.shape == want.shape and got.dtype == dtype
    # fp32: the weights' gradients are dot products over 945 elements, summed in another order by a matmul
    tolerance = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(got, want, **tolerance)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, **tolerance)


def edge_by_edge(cell: SearchCell, s0: torch.Tensor, s1: torch.Tensor, weights, active_ops) -> torch.Tensor:
    """The cell computed as DARTS does: each edge's ``sum(w * op(x))`` over its FastMixedOp terms (``none`` too:
    it adds zeros), then a sum per node."""

    def edge(index: int, h: torch.Tensor) -> torch.Tensor:
        return sum_terms(w * term.value for w, term in zip(weights[index], cell.edges[index](h, active_ops[index])))

    states = [cell.preprocess0(s0), cell.preprocess1(s1)]
    offset = 0
    for _ in range(cell.steps):
        states.append(sum_terms(edge(offset + j, h) for j, h in enumerate(states)))
        offset += len(states) - 1
    return torch.cat(states[-cell.multiplier:], dim=1)


@pytest.mark.parametrize("k,none_wins", [(1, False), (2, False), (None, False), (1, True)],
                         ids=["top-1", "top-2", "all ops", "top-1, only none"])
@pytest.mark.parametrize("cell_index,kind", [(0, "normal"), (1, "reduce")])
def test_a_cell_equals_its_edges_summed_one_by_one(k: int | None, none_wins: bool, cell_index: int,
                                                   kind: str) -> None:
    supernet = tiny_supernet("st_bif", layers=3, in_channels=4)
    none = supernet.search_space.primitives.index("none")
    with torch.no_grad():  # α far from uniform: `none` wins some edges (with none_wins: every edge, every node)
        for alpha in supernet.arch_parameters():
            alpha.normal_(generator=torch.Generator().manual_seed(7))
            alpha[:, none] += 100.0 if none_wins else 0.0
    cell = supernet.cells[cell_index].cell
    sample = sample_ops(supernet, k, seed=3)[0 if kind == "normal" else 1]
    C = cell.preprocess0.op[1].in_channels
    generator = torch.Generator().manual_seed(11)
    s0 = torch.randn(4, C, 8, 8, generator=generator)
    s1 = torch.randn(4, cell.preprocess1.op[1].in_channels, 8, 8, generator=generator)
    alpha = supernet.arch[kind].alpha

    def run(forward):
        state = {key: value.clone() for key, value in cell.state_dict().items()}
        edge_weights = supernet.arch[kind].edge_weights(sample, arch_grad=True)
        out = forward(edge_weights)
        parameters = [alpha, *cell.parameters()]
        grads = torch.autograd.grad(out, parameters, torch.ones_like(out), allow_unused=True)
        cell.load_state_dict(state)  # both forwards see the same BatchNorm statistics
        return out, grads

    nodes = node_terms(supernet.arch[kind].edge_weights(sample, arch_grad=False), sample, cell.steps, none)
    assert any(op == none for ops in sample.active_ops for op in ops)
    assert all(op != none for node in nodes for _, _, op in node.terms) != none_wins  # dropped unless alone
    got, got_grads = run(lambda w: cell(s0, s1, node_terms(w, sample, cell.steps, none)))
    want, want_grads = run(lambda w: edge_by_edge(cell, s0, s1, active_weights(w, sample), sample.active_ops))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if none_wins:  # every node is zeros: a cell that outputs nothing, as DARTS's MixedOp would
        assert not got.abs().sum()
    else:
        assert any(g is not None and g.abs().sum() > 0 for g in got_grads)
    for g, w in zip(got_grads, want_grads):
        if g is None or w is None:  # a parameter of an op no node ran (`none`'s zeros give it no gradient)
            assert g is None or not g.abs().sum()
            assert w is None or not w.abs().sum()
        else:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
