"""Firing rates recorded on chosen steps only: counting spikes costs a reduction in every neuron forward."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from search_space.neurons import set_firing_rate_recording


@contextmanager
def recording_firing_rates(network: nn.Module, enabled: bool) -> Iterator[None]:
    """Within, ``network``'s spiking neurons record their firing rates if ``enabled``; after it, none records."""
    if not enabled:
        yield
        return
    set_firing_rate_recording(network, True)
    try:
        yield
    finally:
        set_firing_rate_recording(network, False)
