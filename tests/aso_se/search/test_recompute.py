"""RecomputedCell: a recomputing supernet computes exactly what the plain one does."""
from __future__ import annotations

import pytest
import torch

from tests.aso_se.helpers import sample_ops, tiny_supernet


def step(supernet: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, generator_seed: int) -> torch.Tensor:
    sample = sample_ops(supernet, k=2, seed=generator_seed)
    logits = supernet(images, sample)
    torch.nn.functional.cross_entropy(logits, labels).backward()
    return logits.detach()


@pytest.mark.parametrize("neuron", ["st_bif", "lif", "relu"])
def test_recomputing_supernet_equals_plain(neuron: str, digits) -> None:
    images, labels = digits
    plain = tiny_supernet(neuron, recompute=False, seed=0)
    recomputing = tiny_supernet(neuron, recompute=True, seed=0)
    recomputing.load_state_dict(plain.state_dict())
    recomputed = []
    for wrapper in recomputing.cells:  # count cell forwards: it must really recompute
        wrapper.cell.register_forward_pre_hook(lambda *args: recomputed.append(1))
    for seed in (0, 1):  # two steps: BatchNorm statistics feed the second
        expected = step(plain, images[:8], labels[:8], seed)
        actual = step(recomputing, images[:8], labels[:8], seed)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    assert len(recomputed) == 2 * 2 * len(recomputing.cells)
    plain_grads = {name: p.grad for name, p in plain.named_parameters()}
    for name, param in recomputing.named_parameters():
        assert (param.grad is None) == (plain_grads[name] is None), name
        if param.grad is not None:
            torch.testing.assert_close(param.grad, plain_grads[name], rtol=1e-6, atol=1e-7, msg=name)
    # Running statistics and counters updated once per forward, not again by the recomputation.
    plain_state = plain.state_dict()
    for name, value in recomputing.state_dict().items():
        assert torch.equal(value, plain_state[name]), name


def test_no_recomputation_without_autograd(digits) -> None:
    images, _ = digits
    supernet = tiny_supernet("st_bif", recompute=True)
    calls = []
    supernet.cells[0].cell.register_forward_pre_hook(lambda *args: calls.append(1))
    with torch.no_grad():
        supernet(images[:4])
    assert calls == [1]
