"""A QANN's ST-BIF SNN, trainable at a fixed number of steps T: spike-domain fine-tuning with BPTT.

``convert_to_snn`` gives an SNN whose logits summed over time equal the QANN's once every neuron is silent.
Cut off after T steps, neurons that still hold charge never deliver it. Training that SNN at T, with BPTT through
the ST-BIF neuron's surrogate gradient (its fused multi-step kernel on CUDA), adapts the weights, the thresholds
and the batch norms' affine maps to the answer after T steps.

Every batch norm is folded into a trainable per-channel affine map, so training and evaluation run the same
network (no batch statistics over a mixture of time steps). A map right after a bias-free conv scales that conv's
weights (a parametrization, trained as its own parameter) instead of every step of the conv's output: the same
function and gradients to rounding, without a pass over T steps of activations each way and the copy the backward
keeps. The auxiliary head is dropped (its loss would read a head that is never deployed).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.utils import parametrize

from search_space.errors import UserInputError
from search_space.neurons import SpikingNeuron
from search_space.qann import (
    REPORTED_TIMESTEPS,
    _BiasAtFirstStep,
    _full_fp32,
    _InjectOnceStem,
    _my_batches,
    _ShiftAtFirstStep,
    _snn_logits,
    conv_norm_pairs,
    convert_to_snn,
    set_timesteps,
)


def _buffers_to_parameters(module: nn.Module, names: Iterable[str]) -> None:
    for name in names:
        value = module._buffers.pop(name)
        # a scale folded into its conv stays None, a plain attribute
        setattr(module, name, None if value is None else nn.Parameter(value.detach().clone()))


class _ScaledWeight(nn.Module):
    """A conv's weight times the per-output-channel scale of the batch norm after it, the scale a parameter."""

    def __init__(self, scale: Tensor) -> None:
        super().__init__()
        self.scale = nn.Parameter(scale.detach().clone())

    def forward(self, weight: Tensor) -> Tensor:
        return weight * self.scale.to(weight.dtype).view((-1,) + (1,) * (weight.dim() - 1))


def _fold_scales_into_convs(snn: nn.Module) -> None:
    """Each (bias-free conv, first-step shift) pair of a Sequential: the shift's scale moves into the conv's weight."""
    for module in list(snn.modules()):
        for conv, norm in conv_norm_pairs(module):
            parametrize.register_parametrization(conv, "weight", _ScaledWeight(norm.scale))
            norm.scale = None


def _fold_stem_norm(stem: nn.Sequential) -> None:
    """The stem's conv + eval-mode BatchNorm as one conv with a bias (the stem runs once, at t = 0)."""
    conv, norm = stem[0], stem[1]
    std = torch.sqrt(norm.running_var + norm.eps)
    weight = norm.weight if norm.affine else torch.ones_like(std)
    bias = norm.bias if norm.affine else torch.zeros_like(std)
    scale = (weight / std).detach()
    shift = (bias - norm.running_mean * weight / std).detach()
    if conv.bias is not None:
        shift = shift + conv.bias.detach() * scale
    folded = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                       conv.dilation, conv.groups, bias=True).to(conv.weight.device, conv.weight.dtype)
    with torch.no_grad():
        folded.weight.copy_(conv.weight * scale.view(-1, 1, 1, 1))
        folded.bias.copy_(shift)
    stem[0], stem[1] = folded, nn.Identity()


def trainable_snn(qann: nn.Module, timesteps: int, surrogate: str = "sigmoid", *,
                  fold_scales: bool = True) -> nn.Module:
    """The ST-BIF SNN of ``qann`` (``convert_to_snn``, binary spikes) with every weight, threshold and folded
    batch-norm map a trainable parameter; its forward returns ``(logits summed over T, None)`` as the QANN's.
    ``fold_scales``: a norm's scale after a bias-free conv scales the conv's weights (off: a pass of its own)."""
    snn = convert_to_snn(qann, timesteps, fold_norms=False)  # each norm's scale stays a parameter of its own
    if fold_scales:
        _fold_scales_into_convs(snn)
    if getattr(snn, "auxiliary_head", None) is not None:
        snn.auxiliary_head = None
    for module in snn.modules():
        if isinstance(module, SpikingNeuron):
            neuron = module.neuron
            neuron.surrogate = surrogate
            _buffers_to_parameters(neuron, ["q_threshold"])
        elif isinstance(module, _ShiftAtFirstStep):
            _buffers_to_parameters(module, ["scale", "shift"])
        elif isinstance(module, _BiasAtFirstStep):
            _buffers_to_parameters(module, ["bias"])
        elif isinstance(module, _InjectOnceStem):
            _fold_stem_norm(module.stem)
    left = [name for name, module in snn.named_modules() if isinstance(module, nn.modules.batchnorm._BatchNorm)]
    if left:
        raise UserInputError(f"the SNN keeps batch norms outside the cells ({left[:3]}): it cannot be fine-tuned")
    for param in snn.parameters():
        param.requires_grad_(True)
    return snn.train()


def with_early_readout(snn: nn.Module, early: int) -> nn.Module:
    """``snn`` trained for its answer after ``early`` of its T steps too: in training its forward returns ``(logits
    after T steps, logits after early steps)``, the second in the auxiliary head's slot, so a Retrainer with
    auxiliary weight w minimizes CE(T) + w·CE(early) and one SNN answers at either T. Evaluation is unchanged."""
    if isinstance(early, bool) or not isinstance(early, int) or not 1 <= early < snn.timesteps:
        raise UserInputError(f"snn_finetune.early_timesteps={early!r} must be an integer from 1 to "
                             f"snn_finetune.timesteps - 1 = {snn.timesteps - 1}, or null")
    kept: dict[str, Tensor] = {}

    def keep_pooled(module: nn.Module, args: tuple, pooled: Tensor) -> None:
        kept["pooled"] = pooled

    def add_early_logits(network: nn.Module, args: tuple, output: tuple[Tensor, Tensor | None]):
        if not network.training:
            return output
        steps = kept.pop("pooled").flatten(1).unflatten(0, (network.timesteps, -1))
        return output[0], network.classifier.linear(steps[:early].sum(0))  # the bias once, as at T

    snn.global_pooling.register_forward_hook(keep_pooled)
    snn.register_forward_hook(add_early_logits)
    return snn


def with_neurons(snn: nn.Module, replace: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """A copy of ``snn`` in which every spiking neuron runs ``replace(neuron)`` (given the copy's own multi-step
    neuron): the same network around another neuron, for comparing neurons or their backends on one network."""
    twin = copy.deepcopy(snn)
    for parent in list(twin.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, SpikingNeuron):
                setattr(parent, name, SpikingNeuron(replace(child.neuron), child.timesteps,
                                                    capturable=child.capturable))
    return twin


def with_neuron_backend(snn: nn.Module, backend: str) -> nn.Module:
    """A copy of ``snn`` whose ST-BIF neurons run on ``backend`` (torch: the reference; triton: the fused kernel)."""
    def on_backend(neuron: nn.Module) -> nn.Module:
        neuron.backend = backend
        return neuron

    return with_neurons(snn, on_backend)


@dataclass
class SpikingAccuracy:
    """A spiking network's test accuracy after each of ``accuracy_at``'s steps."""

    accuracy_at: dict[int, float]
    silent: bool                  # no neuron fired at the last step run
    timesteps_to_silence: int     # the last step at which any neuron fired (the steps run if never silent)


@torch.no_grad()
@_full_fp32()
def accuracy_against_timesteps(snn: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], *,
                               device: torch.device | str, timesteps: Iterable[int] = REPORTED_TIMESTEPS,
                               sharded: bool = False,
                               before_batch: Callable[[], None] = lambda: None) -> SpikingAccuracy:
    """Runs ``snn`` (a converted or fine-tuned SNN) once for the largest of ``timesteps`` steps and reads its
    accuracy after each of them from the summed readout. ``sharded``: each rank runs ``rank::world`` of the
    batches and the counts are summed, so every rank returns the whole set's figures. ``snn``'s own number of
    steps is left as it was."""
    steps = sorted(set(timesteps))
    if not steps or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in steps):
        raise UserInputError(f"timesteps={list(timesteps)!r} must be positive integers, e.g. [1, 2, 4, 8]")
    device = torch.device(device)
    batches = list(batches)
    was_training, before = snn.training, snn.stem.timesteps
    sharded = sharded and dist.is_initialized() and dist.get_world_size() > 1
    longest = steps[-1]
    set_timesteps(snn.eval(), longest)
    try:
        hits, total, last = dict.fromkeys(steps, 0), 0, 0
        dtype = next(snn.parameters()).dtype
        for i in _my_batches(len(batches), sharded, before_batch):
            x, y = batches[i][0].to(device, dtype), batches[i][1].to(device)
            logits, active = _snn_logits(snn, x, longest, steps[:-1])
            for k in steps:
                hits[k] += int((logits[k].argmax(1) == y).sum())
            total, last = total + len(y), max(last, active)
        counts = [*hits.values(), total, last]
        if sharded:
            summed = torch.tensor(counts[:-1], dtype=torch.float64, device=device)
            latest = torch.tensor([last], dtype=torch.float64, device=device)
            dist.all_reduce(summed)
            dist.all_reduce(latest, op=dist.ReduceOp.MAX)
            counts = [int(c) for c in summed.tolist()] + [int(latest.item())]
    finally:
        set_timesteps(snn, before)
        snn.train(was_training)
    *hit_counts, total, last = counts
    return SpikingAccuracy({k: n / max(total, 1) for k, n in zip(steps, hit_counts)},
                           silent=last < longest, timesteps_to_silence=last if last < longest else longest)
