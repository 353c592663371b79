"""Fused, trainable multi-step ST-BIF neuron: public API.

`st_bif_multistep` runs the neuron over a whole sequence `[T, ...]` from its initial state
(q = 0.5, acc = 0); `st_bif_multistep_with_block_map` also hands back where its spikes are, for the
sparse conv that reads them; `STBIFNeuron` is the module for `[T, B, ...]` input. Backends as in
kernels/backend.py: "auto" runs the Triton kernels on CUDA and the torch reference elsewhere;
"triton" and "torch" force one ("triton" on CPU tensors needs TRITON_INTERPRET=1).
"""
from .dispatch import st_bif_multistep, st_bif_multistep_with_block_map
from .module import STBIFNeuron
from .surrogates import SURROGATES
from .validation import level_bounds

__all__ = ["STBIFNeuron", "SURROGATES", "level_bounds", "st_bif_multistep", "st_bif_multistep_with_block_map"]
