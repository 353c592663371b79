"""Gradients handed back in their tensor's layout: the cell's states, so batch norms keep channels_last kernels."""
import pytest
import torch
from torch import nn

from search_space.grad_layout import grad_in_input_layout
from search_space.network import build_network
from search_space.neurons import NeuronFactory

CL = torch.channels_last


@pytest.mark.parametrize("layout", [CL, torch.contiguous_format])
def test_identity_forward_and_gradient_in_the_input_layout(layout):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 7, 6).contiguous(memory_format=layout).requires_grad_()
    y = grad_in_input_layout(x)
    assert torch.equal(y, x)
    other = CL if layout is torch.contiguous_format else torch.contiguous_format
    big = torch.randn(3, 10, 7, 6).contiguous(memory_format=other)
    upstream = big[:, 2:7]  # a channel slice: strided in either layout, as the cell's concatenation hands back
    (y * upstream).sum().backward()
    assert torch.equal(x.grad, upstream)
    assert x.grad.is_contiguous(memory_format=layout)


def test_no_grad_or_constant_input_passes_through_untouched():
    x = torch.randn(2, 3, 4, 4)
    assert grad_in_input_layout(x) is x
    with torch.no_grad():
        w = torch.randn(2, 3, 4, 4, requires_grad=True)
        assert grad_in_input_layout(w) is w


def _bn_grad_layouts(network: nn.Module, x: torch.Tensor) -> list[bool]:
    seen = []
    def record(module, grad_input, grad_output):
        seen.append(grad_output[0].is_contiguous(memory_format=CL))
    hooks = [module.register_full_backward_hook(record)
             for module in network.modules() if isinstance(module, nn.BatchNorm2d)]
    logits, logits_aux = network(x)
    (logits.square().mean() + logits_aux.square().mean()).backward()
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("sums", ["torch", "triton"])  # node sums: PyTorch's ops, or the kernels reading slices
@pytest.mark.parametrize("kind", ["st_bif_qann", "relu"])
def test_every_batch_norm_of_a_channels_last_network_gets_a_channels_last_gradient(kind, sums):
    torch.manual_seed(0)
    network = build_network("DARTS_V2", neuron=NeuronFactory(kind, timesteps=1), channels=8, layers=5,
                            num_classes=10, auxiliary=True).to(memory_format=CL).train()
    network.drop_path_prob = 0.2
    for cell in network.cells:
        cell.drop_path_backend = sums
    x = torch.randn(4, 3, 32, 32).contiguous(memory_format=CL)
    layouts = _bn_grad_layouts(network, x)
    assert len(layouts) == sum(isinstance(m, nn.BatchNorm2d) for m in network.modules()) > 40
    assert all(layouts), f"{layouts.count(False)} of {len(layouts)} batch norms got a gradient in another layout"
