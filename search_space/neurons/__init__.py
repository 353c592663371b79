"""Every activation the search space can use, one file per kind, behind one registry and one factory.

A new kind is a module here with a builder decorated ``@register_neuron("<kind>")``, imported below,
plus ``conf/neuron/<kind>.yaml`` and a test. Kinds: ``st_bif``, ``lif``, ``relu``, ``st_bif_qann``.
"""
from search_space.neurons import lif, relu, st_bif, st_bif_qann  # noqa: F401  (each registers its kind)
from search_space.neurons.base import (
    NEURON_KINDS,
    NeuronBuilder,
    NeuronFactory,
    NeuronFactoryFn,
    SpikingNeuron,
    firing_rates,
    make_neuron,
    neuron_parameters,
    recording_firing_rates,
    register_neuron,
    set_firing_rate_recording,
)
from search_space.neurons.st_bif_qann import QuantizedActivation

__all__ = [
    "NEURON_KINDS", "NeuronBuilder", "NeuronFactory", "NeuronFactoryFn", "QuantizedActivation", "SpikingNeuron",
    "firing_rates", "make_neuron", "neuron_parameters", "recording_firing_rates", "register_neuron",
    "set_firing_rate_recording",
]
