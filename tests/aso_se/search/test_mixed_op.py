"""FastMixedOp: with every op active it is DARTS's MixedOp, term for term; nodes leave `none` out."""
from __future__ import annotations

import copy
from typing import Callable, Iterable

import pytest
import torch
from torch import nn

from aso_se.search.arch_params import ArchSample
from aso_se.search.mixed_op import FastMixedOp, Term, sum_terms, weighted_sum
from aso_se.search.supernet import node_terms
from search_space.neurons import NeuronFactory
from search_space.ops import DARTS_PRIMITIVES, OPS


class DartsMixedOp(nn.Module):
    """quark0/darts model_search.MixedOp, literally."""

    def __init__(self, ops: list[nn.Module]) -> None:
        super().__init__()
        self._ops = nn.ModuleList(ops)

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return sum(w * op(x) for w, op in zip(weights, self._ops))


def edge_ops(neuron: str, stride: int) -> list[nn.Module]:
    torch.manual_seed(0)
    factory = NeuronFactory(neuron, timesteps=2)
    return [OPS[name](4, stride, False, factory) for name in DARTS_PRIMITIVES]


def mixed(terms: Iterable[Term], weights: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """An edge's value from its terms: DARTS's ``sum(w * op(x))`` over its active ops."""
    return sum_terms(w * term.value for w, term in zip(weights, terms))


def run(
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], parameters: Iterable[nn.Parameter],
    x: torch.Tensor, weights: torch.Tensor,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x, weights = x.clone().requires_grad_(), weights.clone().requires_grad_()
    out = forward(x, weights)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(grad_out)
    return out, [x.grad, weights.grad] + [p.grad for p in parameters]


@pytest.mark.parametrize("neuron", ["relu", "st_bif", "lif"])
@pytest.mark.parametrize("stride", [1, 2])
def test_all_ops_active_equals_darts_mixed_op(neuron: str, stride: int) -> None:
    ops = edge_ops(neuron, stride)
    darts, fast = DartsMixedOp(copy.deepcopy(ops)), FastMixedOp(copy.deepcopy(ops))
    x = torch.randn(4, 4, 8, 8, generator=torch.Generator().manual_seed(2))  # T*B = 2*2
    weights = torch.softmax(torch.randn(len(ops), generator=torch.Generator().manual_seed(3)), dim=0)
    expected, expected_grads = run(darts, darts.parameters(), x, weights)
    actual, actual_grads = run(lambda x, w: mixed(fast(x, range(len(ops))), w.unbind()), fast.parameters(), x, weights)
    assert torch.equal(actual, expected)
    assert len(actual_grads) == len(expected_grads)
    for got, want in zip(actual_grads, expected_grads):
        assert (got is None and want is None) or torch.equal(got, want)


def test_only_the_active_ops_run() -> None:
    ops = edge_ops("st_bif", 1)
    calls: list[int] = []
    for index, op in enumerate(ops):
        op.register_forward_hook(lambda module, args, out, index=index: calls.append(index))
    fast = FastMixedOp(ops)
    x = torch.randn(4, 4, 8, 8)
    weights = torch.softmax(torch.randn(len(ops)), dim=0)
    out = mixed(fast(x, (4, 1)), (weights[4], weights[1]))
    torch.testing.assert_close(out, weights[4] * ops[4](x) + weights[1] * ops[1](x))
    assert calls == [4, 1, 4, 1]  # two ops in the edge, then the two reference calls


@pytest.mark.parametrize("stride", [1, 2])
def test_none_is_left_out_of_the_sum_unless_it_is_alone(stride: int) -> None:
    """A node's terms (``node_terms``) leave ``none`` out unless it is all the node has; its edges run just those."""
    ops = edge_ops("st_bif", stride)
    none = DARTS_PRIMITIVES.index("none")
    calls: list[int] = []
    for index, op in enumerate(ops):
        op.register_forward_hook(lambda module, args, out, index=index: calls.append(index))
    fast = FastMixedOp(ops)
    x = torch.randn(4, 4, 8, 8, generator=torch.Generator().manual_seed(4))
    weights = torch.softmax(torch.randn(len(ops), generator=torch.Generator().manual_seed(5)), dim=0)

    def node(*active_ops: tuple[int, ...]) -> torch.Tensor:
        """One node over edges from the same state with ``active_ops``, summed as the supernet sums it."""
        chosen = torch.tensor([list(ops) + [-1] * (2 - len(ops)) for ops in active_ops])
        sample = ArchSample(noise=torch.zeros(len(active_ops), len(DARTS_PRIMITIVES)), chosen=chosen,
                            active_ops=active_ops, temperature=1.0)
        (terms,) = node_terms(weights.expand(len(active_ops), -1), sample, steps=1, none_op=none)
        values = [value for _, _, ops in terms.inputs for value, _ in fast(x, ops)]
        return weighted_sum(values, terms.weights)

    out = node((none, 4), (none,))
    assert calls == [4]
    assert torch.equal(out, weights[none] * ops[none](x) + weights[4] * ops[4](x))
    alone = node((none,), (none,))
    assert calls == [4, none, 4, none]
    assert torch.equal(alone, torch.zeros_like(out))


def test_weighted_sum_of_channels_last_terms_keeps_their_layout():
    torch.manual_seed(0)
    terms = [torch.randn(2, 5, 4, 3, dtype=torch.float64) for _ in range(3)]
    weights = torch.rand(3, dtype=torch.float64, requires_grad=True)
    last = [t.contiguous(memory_format=torch.channels_last).requires_grad_() for t in terms]
    plain = [t.clone().requires_grad_() for t in terms]
    got, want = weighted_sum(last, weights), weighted_sum(plain, weights)
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    upstream = torch.randn_like(want)
    grads_got = torch.autograd.grad(got, [*last, weights], upstream)
    grads_want = torch.autograd.grad(want, [*plain, weights], upstream)
    for g, w in zip(grads_got, grads_want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def stacked_product(terms, weights):
    """The node sum written out as autograd ops (what ``weighted_sum`` computed before its one autograd node)."""
    return (weights @ torch.stack(terms).flatten(1)).view_as(terms[0])


def test_weighted_sum_under_autocast_computes_in_its_dtype_as_the_written_out_product():
    generator = torch.Generator().manual_seed(6)
    terms = [torch.randn(3, 4, 5, 6, generator=generator).bfloat16().requires_grad_() for _ in range(4)]
    weights = torch.rand(4, generator=generator, requires_grad=True)
    upstream = torch.randn(3, 4, 5, 6, generator=generator).bfloat16()
    results = []
    for combine in (weighted_sum, stacked_product):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = combine(terms, weights)
        results.append((out, torch.autograd.grad(out, [*terms, weights], upstream)))
    (got, got_grads), (want, want_grads) = results
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for g, w in zip(got_grads, want_grads):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-2, atol=1e-2)


def test_weighted_sum_gives_only_the_gradients_asked_for():
    generator = torch.Generator().manual_seed(7)
    terms = [torch.randn(2, 3, 4, 4, generator=generator) for _ in range(3)]
    terms[1].requires_grad_()
    weights = torch.rand(3, generator=generator)  # a weight step's detached edge weights
    out = weighted_sum(terms, weights)
    (grad,) = torch.autograd.grad(out, terms[1], torch.ones_like(out))
    torch.testing.assert_close(grad, torch.full_like(grad, weights[1].item()))
    alpha = torch.rand(3, generator=generator, requires_grad=True)  # an α step: the weights' gradient alone
    out = weighted_sum([t.detach() for t in terms], alpha)
    (grad,) = torch.autograd.grad(out, alpha, torch.ones_like(out))
    torch.testing.assert_close(grad, torch.stack([t.sum() for t in terms]), rtol=1e-5, atol=1e-4)
