"""``lif``: spikingjelly 2.0's ``LIFNode`` in multi-step mode.

spikingjelly 2.0 has no ``backend`` argument: ``lif_multi_step`` runs its Triton/CUDA kernels for
CUDA tensors and its torch reference for CPU tensors, so the backend follows the device.
"""
from __future__ import annotations

from typing import Callable

from spikingjelly.activation_based import neuron as sj_neuron
from spikingjelly.activation_based import surrogate as sj_surrogate
from torch import nn

from search_space.errors import UserInputError
from search_space.neurons.base import SpikingNeuron, register_neuron

# Surrogate names shared with kernels.st_bif, mapped to spikingjelly's objects.
LIF_SURROGATES: dict[str, Callable[[], sj_surrogate.SurrogateFunctionBase]] = {
    "sigmoid": sj_surrogate.Sigmoid,
    "atan": sj_surrogate.ATan,
    "rectangular": sj_surrogate.Rect,
}


@register_neuron("lif")
def lif(
    timesteps: int,
    tau: float = 2.0,
    v_threshold: float = 1.0,
    v_reset: float | None = 0.0,
    decay_input: bool = True,
    detach_reset: bool = False,
    surrogate: str = "sigmoid",
) -> nn.Module:
    if surrogate not in LIF_SURROGATES:
        raise UserInputError(
            f"unknown LIF surrogate {surrogate!r}: expected one of {sorted(LIF_SURROGATES)}; "
            "set neuron.surrogate to one of them"
        )
    if not tau > 1.0:
        raise UserInputError(f"LIF tau={tau} must be greater than 1; set neuron.tau, e.g. 2.0")
    neuron = sj_neuron.LIFNode(
        tau=float(tau),  # spikingjelly asserts a float
        decay_input=decay_input,
        v_threshold=v_threshold,
        v_reset=v_reset,
        surrogate_function=LIF_SURROGATES[surrogate](),
        detach_reset=detach_reset,
        step_mode="m",
    )
    return SpikingNeuron(neuron, timesteps, capturable=True)
