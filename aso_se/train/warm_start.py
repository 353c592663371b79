"""A retrain that starts from more than its initialization: another run's weights, and quantizer thresholds set
from the activations they will see.

Few-level QANNs lose accuracy when trained from scratch; quantization-aware training usually starts from a trained
network of more levels (or its ReLU twin) instead. Its thresholds must then fit that network's activations, whose
scale no fixed ``neuron.q_threshold`` knows: LSQ's initialization reads them off one batch.
"""
from __future__ import annotations

import math
from typing import Mapping

import torch
from torch import Tensor, nn

from search_space.errors import UserInputError
from search_space.neurons.st_bif_qann import QuantizedActivation

THRESHOLD_INITS = ("config", "lsq")


def copy_weights(network: nn.Module, source: Mapping[str, Tensor], *, source_name: str) -> list[str]:
    """Copies into ``network`` every tensor of ``source`` (a state dict) whose name and shape match its own, and
    returns the names of its own tensors left as initialized (a ReLU source has no thresholds, for one)."""
    own = network.state_dict()
    matched = {name: tensor for name, tensor in source.items() if name in own and own[name].shape == tensor.shape}
    if not matched:
        raise UserInputError(f"init_from={source_name}: none of its weights fits this network (another genotype or "
                             "model size?); train with its genotype and model, or drop init_from")
    network.load_state_dict(matched, strict=False)
    return sorted(set(own) - set(matched))


def lsq_threshold(inputs: Tensor, pos_max: int) -> float:
    """LSQ's initial step for ``inputs``: 2·mean|x| / sqrt(pos_max), the largest count an unsigned neuron sends."""
    return 2.0 * inputs.detach().abs().float().mean().item() / math.sqrt(max(pos_max, 1))


@torch.no_grad()
def calibrate_thresholds(network: nn.Module, inputs: Tensor) -> int:
    """Sets each quantizer's θ from its own input in one training-mode forward of ``inputs``, in network order, so
    that each sees inputs quantized by the thresholds already set; batch-norm running statistics are left as they
    were. Returns how many thresholds it set."""
    quantizers = [module for module in network.modules() if isinstance(module, QuantizedActivation)]
    if not quantizers:
        return 0

    def set_threshold(module: QuantizedActivation, args: tuple[Tensor, ...]) -> None:
        theta = lsq_threshold(args[0], module.pos_max)
        if theta > 0:  # an input of zeros (a pruned path) keeps its configured θ
            module.q_threshold.fill_(theta)

    buffers = {name: buffer.clone() for name, buffer in network.named_buffers()}
    was_training = network.training
    hooks = [module.register_forward_pre_hook(set_threshold) for module in quantizers]
    try:
        network.train()
        network(inputs)
    finally:
        for hook in hooks:
            hook.remove()
        network.train(was_training)
        for name, buffer in network.named_buffers():
            buffer.copy_(buffers[name])
    return len(quantizers)
