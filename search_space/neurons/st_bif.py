"""``st_bif``: our fused ST-BIF neuron (``kernels.st_bif.STBIFNeuron``), the default kind."""
from __future__ import annotations

from torch import nn

from kernels.st_bif import STBIFNeuron
from search_space.errors import UserInputError
from search_space.neurons.base import SpikingNeuron, register_neuron


@register_neuron("st_bif")
def st_bif(
    timesteps: int,
    q_threshold: float = 1.0,
    level: int = 8,
    sym: bool = True,
    learn_threshold: bool = True,
    surrogate: str = "sigmoid",
    backend: str = "auto",
) -> nn.Module:
    try:
        neuron = STBIFNeuron(
            q_threshold=q_threshold, level=level, sym=sym, learn_threshold=learn_threshold,
            surrogate=surrogate, backend=backend,
        )
    except ValueError as error:  # kernels raise plain ValueError (they may not import search_space)
        raise UserInputError(f"neuron st_bif: {error}; fix it in conf/neuron/st_bif.yaml") from None
    return SpikingNeuron(neuron, timesteps, capturable=True)
