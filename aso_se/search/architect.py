"""The α step: first-order (DARTS-1st / GDAS) or second-order (DARTS's unrolled gradient).

Both take loss closures that run one forward of the supernet with a FIXED sample (drawn once
for the step), so every pass of one α step sees the same ops, and both fill ``alpha.grad``
only: α's gradient is taken with ``torch.autograd.grad`` so the backward skips the weight
gradients it does not need.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

LossFn = Callable[[], Tensor]


def _grads(loss: Tensor, params: Sequence[nn.Parameter]) -> list[Tensor]:
    """d loss / d params, zeros for params the loss does not use (ops that were not sampled)."""
    return list(torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True))


def first_order_arch_step(arch_loss: LossFn, alphas: Sequence[nn.Parameter]) -> None:
    """Sets ``alpha.grad`` to d arch_loss / d α at the current weights."""
    for alpha, grad in zip(alphas, _grads(arch_loss(), alphas)):
        alpha.grad = grad


@torch.no_grad()
def _add_(params: Sequence[nn.Parameter], deltas: Sequence[Tensor], scale: Tensor | float) -> None:
    torch._foreach_add_(list(params), [delta * scale for delta in deltas])


def second_order_arch_step(
    arch_loss: LossFn, train_loss: LossFn, alphas: Sequence[nn.Parameter], weights: Sequence[nn.Parameter],
    weights_optimizer: Optimizer,
) -> None:
    """DARTS's unrolled α gradient, with its finite-difference Hessian-vector product::

        w'    = w - ξ (momentum·buf + ∇w L_train(w) + wd·w)        (one virtual SGD step)
        ∇α    = ∇α L_arch(w', α) - ξ (∇α L_train(w⁺) - ∇α L_train(w⁻)) / 2ε
        w±    = w ± ε ∇w' L_arch(w', α),   ε = 0.01 / ‖∇w' L_arch‖

    ξ, momentum, weight decay: ``weights_optimizer``'s SGD keys (missing = 0). The weights are changed in
    place and restored exactly (no model copy, so grown supernets need nothing special); the extra
    forwards update BatchNorm statistics, as in DARTS. Sets ``alpha.grad``.
    """
    group = weights_optimizer.param_groups[0]
    lr, momentum, weight_decay = group["lr"], group.get("momentum", 0.0), group.get("weight_decay", 0.0)
    weights = list(weights)
    backup = [w.detach().clone() for w in weights]
    # The virtual step w -> w'.
    steps = _grads(train_loss(), weights)
    with torch.no_grad():
        for step, w in zip(steps, weights):
            buffer = weights_optimizer.state.get(w, {}).get("momentum_buffer")
            step.add_(w, alpha=weight_decay)
            if buffer is not None:
                step.add_(buffer, alpha=momentum)
        _add_(weights, steps, -lr)
    grads = _grads(arch_loss(), [*alphas, *weights])
    alpha_grads, weight_grads = grads[: len(alphas)], grads[len(alphas):]
    # ∇α L_train at w ± ε·dw, then back to w exactly.
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in weight_grads]))
    epsilon = 0.01 / norm.clamp_min(1e-12)
    with torch.no_grad():
        torch._foreach_copy_(weights, backup)
    _add_(weights, weight_grads, epsilon)
    grads_plus = _grads(train_loss(), alphas)
    _add_(weights, weight_grads, -2 * epsilon)
    grads_minus = _grads(train_loss(), alphas)
    with torch.no_grad():
        torch._foreach_copy_(weights, backup)
        for alpha, grad, plus, minus in zip(alphas, alpha_grads, grads_plus, grads_minus):
            alpha.grad = grad - lr * (plus - minus) / (2 * epsilon)
