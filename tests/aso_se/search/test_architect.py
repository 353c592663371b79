"""The α gradients: first-order, and DARTS's unrolled second-order against exact double backprop."""
from __future__ import annotations

import torch
from torch import nn

from aso_se.search.architect import first_order_arch_step, second_order_arch_step


class Toy(nn.Module):
    """A smooth two-parameter-group model: prediction = sum_j softmax(α)_j tanh(x @ w)_j."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(3, 4, generator=generator, dtype=torch.float64))
        self.alpha = nn.Parameter(torch.randn(4, generator=generator, dtype=torch.float64))

    def loss(self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
        w = self.w if w is None else w
        prediction = (torch.tanh(x @ w) * torch.softmax(self.alpha, dim=0)).sum(-1)
        return ((prediction - y) ** 2).mean()


def batches() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(16, 3, generator=generator, dtype=torch.float64)
    y = torch.randn(16, generator=generator, dtype=torch.float64)
    return (x[:8], y[:8]), (x[8:], y[8:])


def test_first_order_is_the_plain_gradient() -> None:
    model = Toy()
    _, (x, y) = batches()
    first_order_arch_step(lambda: model.loss(x, y), [model.alpha])
    (expected,) = torch.autograd.grad(model.loss(x, y), model.alpha)
    torch.testing.assert_close(model.alpha.grad, expected)
    assert model.w.grad is None  # the weights' gradient is not even computed


def test_second_order_matches_the_exact_unrolled_gradient() -> None:
    model = Toy()
    (x_train, y_train), (x_val, y_val) = batches()
    xi, weight_decay = 0.1, 0.01
    optimizer = torch.optim.SGD([model.w], lr=xi, weight_decay=weight_decay)
    w_before = model.w.detach().clone()
    second_order_arch_step(
        lambda: model.loss(x_val, y_val), lambda: model.loss(x_train, y_train), [model.alpha], [model.w], optimizer
    )
    assert torch.equal(model.w.detach(), w_before)  # the weights are restored exactly
    # Exact: d/dα L_val(w - ξ(∇w L_train(w, α) + wd·w), α), through the virtual step.
    (grad_w,) = torch.autograd.grad(model.loss(x_train, y_train), model.w, create_graph=True)
    unrolled = model.w - xi * (grad_w + weight_decay * model.w)
    (expected,) = torch.autograd.grad(model.loss(x_val, y_val, unrolled), model.alpha)
    (first_order,) = torch.autograd.grad(model.loss(x_val, y_val), model.alpha)
    torch.testing.assert_close(model.alpha.grad, expected, rtol=1e-4, atol=1e-7)
    assert (expected - first_order).abs().max() > 100 * (model.alpha.grad - expected).abs().max()


def test_second_order_uses_the_momentum_buffer() -> None:
    model = Toy()
    (x_train, y_train), (x_val, y_val) = batches()
    optimizer = torch.optim.SGD([model.w], lr=0.1, momentum=0.9)
    model.loss(x_train, y_train).backward()
    optimizer.step()  # creates the momentum buffer
    buffer = optimizer.state[model.w]["momentum_buffer"].clone()
    second_order_arch_step(
        lambda: model.loss(x_val, y_val), lambda: model.loss(x_train, y_train), [model.alpha], [model.w], optimizer
    )
    (grad_w,) = torch.autograd.grad(model.loss(x_train, y_train), model.w, create_graph=True)
    unrolled = model.w - 0.1 * (grad_w + 0.9 * buffer)
    (expected,) = torch.autograd.grad(model.loss(x_val, y_val, unrolled), model.alpha)
    torch.testing.assert_close(model.alpha.grad, expected, rtol=1e-4, atol=1e-7)
