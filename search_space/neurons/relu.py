"""``relu``: the ANN mode, a plain ``nn.ReLU`` (stateless, so it works for any T; use T = 1)."""
from __future__ import annotations

from torch import nn

from search_space.neurons.base import register_neuron


@register_neuron("relu")
def relu(timesteps: int) -> nn.Module:
    del timesteps  # stateless: every step is independent
    return nn.ReLU(inplace=False)
