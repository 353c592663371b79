"""ST-BIF's quantizer as a trainable activation (the QANN of `neuron=st_bif_qann`): public API.

`quantize(x, θ, neg_min, pos_max, theta_grad_scale)` = θ·clip(floor(x/θ + 0.5), neg_min, pos_max)
(reference.py), differentiable in x (straight-through inside the clip range) and θ (LSQ's gradient times
`theta_grad_scale`). "auto" runs one Triton kernel each way on CUDA and the torch reference elsewhere
and under torch.compile (which fuses it); "triton" on CPU tensors needs TRITON_INTERPRET=1.
"""
import torch
from torch import Tensor

from kernels.backend import BACKENDS, use_triton

from .function import QuantizeFunction
from .reference import quantize_reference, round_half_up

__all__ = ["BACKENDS", "quantize", "quantize_reference", "round_half_up"]

_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _use_triton(x: Tensor, backend: str) -> bool:
    if torch.compiler.is_compiling():
        return False
    fits = x.dtype in _TRITON_DTYPES
    problem = None if fits else f"the Triton quantizer takes float16/bfloat16/float32, got {x.dtype}"
    return use_triton(backend, "quantizer", x.device, problem)


def quantize(
    x: Tensor, theta: Tensor, neg_min: int, pos_max: int, theta_grad_scale: float = 1.0, *, backend: str = "auto"
) -> Tensor:
    """θ·clip(floor(x/θ + 0.5), neg_min, pos_max), same shape and dtype as x; θ a one-element tensor."""
    return QuantizeFunction.apply(x, theta, neg_min, pos_max, theta_grad_scale, _use_triton(x, backend))
