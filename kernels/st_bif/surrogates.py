"""Surrogate gradients of the spike, chosen by name.

The spike is a Heaviside step H(z); training replaces its derivative by a smooth or boxed
surrogate σ′(z). Each surrogate carries its primitive σ (a soft step, used by the tests to
check σ′ against autograd) and its width/steepness α. The Triton kernels implement the same
derivatives, selected by name as a constexpr, with α passed alongside.
"""
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor


@dataclass(frozen=True)
class Surrogate:
    """A soft step σ(z; α) and its derivative σ′(z; α), where z = 0 is the firing edge."""

    name: str
    alpha: float
    primitive: Callable[[Tensor, float], Tensor]
    derivative: Callable[[Tensor, float], Tensor]


def _sigmoid_primitive(z: Tensor, alpha: float) -> Tensor:
    return torch.sigmoid(alpha * z)


def _sigmoid_derivative(z: Tensor, alpha: float) -> Tensor:
    sig = torch.sigmoid(alpha * z)
    return alpha * sig * (1 - sig)


def _atan_primitive(z: Tensor, alpha: float) -> Tensor:
    return torch.atan(math.pi / 2 * alpha * z) / math.pi + 0.5


def _atan_derivative(z: Tensor, alpha: float) -> Tensor:
    return (alpha / 2) / (1 + (math.pi / 2 * alpha * z) ** 2)


def _rectangular_primitive(z: Tensor, alpha: float) -> Tensor:
    return torch.clamp(z / alpha + 0.5, 0, 1)


def _rectangular_derivative(z: Tensor, alpha: float) -> Tensor:
    # A box of width α and height 1/α around the edge (strict, like the kernel).
    return (z.abs() < alpha / 2).to(z.dtype) / alpha


SURROGATES: dict[str, Surrogate] = {
    s.name: s
    for s in (
        Surrogate("sigmoid", 4.0, _sigmoid_primitive, _sigmoid_derivative),
        Surrogate("atan", 2.0, _atan_primitive, _atan_derivative),
        Surrogate("rectangular", 1.0, _rectangular_primitive, _rectangular_derivative),
    )
}


def get_surrogate(name: str) -> Surrogate:
    """The surrogate called `name`; ValueError naming the known ones otherwise."""
    if name not in SURROGATES:
        raise ValueError(
            f"unknown surrogate {name!r}: expected one of {sorted(SURROGATES)}; "
            "pass one of these names as `surrogate`"
        )
    return SURROGATES[name]
