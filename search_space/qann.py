"""Train as a quantized ANN (QANN), run as an exact ST-BIF spiking network.

An ST-BIF neuron (threshold θ, q0 = 0.5, counts in [neg_min, pos_max]) fed a total input X and then
zeros until it stops firing has emitted θ·clip(floor(X/θ + 0.5), neg_min, pos_max): the quantizer of
`QuantizedActivation`. Convs, eval-mode BatchNorm with its shift added once, average pooling, sums and
the linear head commute with the sum over time, so `convert_to_snn` turns a QANN into an SNN whose
logits summed over time equal the QANN's. Max pooling runs in an exact spiking form (the difference of
the pooled running sums). `evaluate_snn` runs the SNN until no neuron fires.
"""
from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn

from kernels.sparse_conv import SparseConv2d
from kernels.st_bif import STBIFNeuron, level_bounds
from search_space.errors import UserInputError
from search_space.graded_st_bif import GradedSTBIF
from search_space.multistep import Stem
from search_space.neurons import QuantizedActivation, SpikingNeuron
from search_space.ops import Zero

log = logging.getLogger(__name__)

# Images × time steps per SNN forward (a batch runs in chunks of this // T images): activations of
# T·B image-steps at T = 256 would not fit in memory, and smaller chunks cost little throughput.
_IMAGE_STEPS_PER_CHUNK = 8192
# The steps at which SNN users compare networks: every evaluation reports its SNN's accuracy at these.
REPORTED_TIMESTEPS = (1, 2, 4, 6, 8, 16)


def _add_at_first_step(y: Tensor, shift: Tensor, timesteps: int) -> Tensor:
    """``y`` (``[T*B, C, ...]``) plus the per-channel ``shift`` at t = 0 only, added in place to y's first step
    (a copy of all T steps would cost a pass over the tensor): ``y`` must be a fresh output whose producer's backward
    does not read it (a product, a conv or a linear layer; autograd refuses otherwise)."""
    # in y's dtype: under autocast the fp32 shift would otherwise promote every step (and the neuron's input)
    y.unflatten(0, (timesteps, -1))[0].add_(shift.to(y.dtype).view((1, -1) + (1,) * (y.dim() - 2)))
    return y


class _ShiftAtFirstStep(nn.Module):
    """Eval-mode BatchNorm as an affine map whose shift enters at t = 0 only (``[T*B, C, ...]``)."""

    def __init__(self, norm: nn.modules.batchnorm._BatchNorm, timesteps: int) -> None:
        super().__init__()
        std = torch.sqrt(norm.running_var + norm.eps)
        weight = norm.weight if norm.affine else torch.ones_like(std)
        bias = norm.bias if norm.affine else torch.zeros_like(std)
        self.register_buffer("scale", (weight / std).detach().clone())
        self.register_buffer("shift", (bias - norm.running_mean * weight / std).detach().clone())
        self.timesteps = timesteps

    def fold_scale_into(self, conv: nn.Conv2d) -> None:
        """Scales the bias-free ``conv`` that feeds this map per output channel, leaving the shift alone: the same
        map to rounding, without a pass over every step of the conv's output (the evaluation is bandwidth-bound)."""
        with torch.no_grad():
            conv.weight.mul_(self.scale.to(conv.weight.dtype).view((-1,) + (1,) * (conv.weight.dim() - 1)))
        self.scale = None

    def forward(self, x: Tensor) -> Tensor:
        if self.scale is not None:
            x = x * self.scale.to(x.dtype).view((1, -1) + (1,) * (x.dim() - 2))
        return _add_at_first_step(x, self.shift, self.timesteps)


class _BiasAtFirstStep(nn.Module):
    """A conv or linear layer whose bias enters at t = 0 only: its bias-free map, then the bias once."""

    def __init__(self, layer: nn.Conv2d | nn.Linear, timesteps: int) -> None:
        super().__init__()
        self.register_buffer("bias", layer.bias.detach().clone())
        layer.bias = None  # the layer is the SNN's own copy
        self.layer, self.timesteps = layer, timesteps

    def forward(self, x: Tensor) -> Tensor:
        return _add_at_first_step(self.layer(x), self.bias, self.timesteps)


class _SpikingMaxPool(nn.Module):
    """Max pooling of spikes, exact over time: out_t = pool(S_t) − pool(S_{t−1}), S_t the running sum."""

    def __init__(self, pool: nn.MaxPool2d, timesteps: int) -> None:
        super().__init__()
        self.pool, self.timesteps = pool, timesteps

    def forward(self, x: Tensor) -> Tensor:
        running = x.unflatten(0, (self.timesteps, -1)).cumsum(0)
        pooled = self.pool(running.flatten(0, 1)).unflatten(0, (self.timesteps, -1))
        return torch.cat([pooled[:1], pooled[1:] - pooled[:-1]]).flatten(0, 1)


class _InjectOnceStem(nn.Module):
    """The stem's output (conv + eval BN) at t = 0 and zeros afterwards: the image enters once."""

    def __init__(self, stem: Stem, timesteps: int) -> None:
        super().__init__()
        self.stem, self.timesteps = stem, timesteps

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4:
            raise UserInputError("an SNN converted from a QANN takes static images [B, C, H, W], not event frames")
        first = nn.Sequential.forward(self.stem, x)
        return torch.cat([first, first.new_zeros((self.timesteps - 1) * first.shape[0], *first.shape[1:])])


class _SummedReadout(nn.Module):
    """The head of a network that averages features over T: applied to T·mean (the sum), bias once."""

    def __init__(self, linear: nn.Linear, timesteps: int) -> None:
        super().__init__()
        self.linear, self.timesteps = linear, timesteps

    def forward(self, features: Tensor) -> Tensor:
        return self.linear(features * self.timesteps)


# Leaf modules that commute with the sum over time once converted (BN, biases, max pooling and the
# quantizer are converted; the rest are linear maps of each step).
_CONVERTIBLE_LEAVES = (
    QuantizedActivation, nn.Conv2d, nn.Linear, nn.modules.batchnorm._BatchNorm, nn.MaxPool2d, nn.AvgPool2d,
    nn.AdaptiveAvgPool2d, nn.Identity, nn.Flatten, nn.Dropout, Zero,
)
# Convs whose output is linear in their weight per output channel: a following batch norm's scale folds into them.
_FOLDABLE_CONVS = (nn.Conv2d, SparseConv2d)
# The registered neuron kinds by the module they build, for error messages.
_KIND_OF_MODULE = {"STBIFNeuron": "st_bif", "LIFNode": "lif", "ReLU": "relu"}


def _unconvertible(model: nn.Module) -> list[str]:
    """The kinds of the activations (or the types of other leaves) that have no exact spiking form."""
    if isinstance(model, SpikingNeuron):  # a neuron's own submodules (surrogates) are not layers
        name = type(model.neuron).__name__
        return [_KIND_OF_MODULE.get(name, name)]
    children = list(model.children())
    if not children:
        name = type(model).__name__
        return [] if isinstance(model, _CONVERTIBLE_LEAVES) else [_KIND_OF_MODULE.get(name, name)]
    return sorted({found for child in children for found in _unconvertible(child)})


def convert_to_snn(qann: nn.Module, timesteps: int, spikes_per_step: int = 1, *, fold_norms: bool = True) -> nn.Module:
    """A new ST-BIF SNN with the QANN's weights, running ``timesteps`` steps (the QANN is untouched).

    Every QuantizedActivation becomes an ST-BIF neuron with its θ and bounds (the Triton kernel on CUDA,
    the torch reference on CPU; with ``spikes_per_step`` > 1 the graded neuron of graded_st_bif.py);
    eval-mode BatchNorm and conv/linear biases add their shift at t = 0 only; max pooling runs on running
    sums; the stem injects the image at t = 0; a linear head named ``classifier`` (fed features averaged
    over T) reads them summed over time instead. ``fold_norms``: a batch norm right after a bias-free conv scales
    that conv's weights instead of every step of its output (the same map to rounding, a pass less); off, each
    norm keeps its own scale (the trainable SNN learns it).
    """
    if isinstance(timesteps, bool) or not isinstance(timesteps, int) or timesteps < 1:
        raise UserInputError(f"timesteps={timesteps!r} must be a positive integer")
    if isinstance(spikes_per_step, bool) or not isinstance(spikes_per_step, int) or spikes_per_step < 1:
        raise UserInputError(f"spikes_per_step={spikes_per_step!r} must be a positive integer (1: binary spikes)")
    has_qann = any(isinstance(module, QuantizedActivation) for module in qann.modules())
    others = _unconvertible(qann)
    if not has_qann or others:
        raise UserInputError(
            f"only a network built with neuron=st_bif_qann converts to an exact SNN; this one has {others or 'no'} "
            "activations or layers without an exact spiking form: build and train it with neuron=st_bif_qann"
        )
    snn = copy.deepcopy(qann).eval()
    _convert_children(snn, timesteps, spikes_per_step, fold_norms)
    return set_timesteps(snn, timesteps)


def set_timesteps(snn: nn.Module, timesteps: int) -> nn.Module:
    """``snn`` (a converted SNN) set to run ``timesteps`` steps per forward; its weights are unchanged."""
    for module in snn.modules():
        if hasattr(module, "timesteps") and isinstance(module.timesteps, int):
            module.timesteps = timesteps
    return snn


def _convert_children(module: nn.Module, timesteps: int, spikes_per_step: int, fold_norms: bool) -> None:
    for name, child in module.named_children():
        replacement: nn.Module | None = None
        if isinstance(child, QuantizedActivation):
            # The Triton kernel takes fp16/bf16/fp32: a float64 network runs the reference neuron.
            backend = "torch" if child.q_threshold.dtype == torch.float64 else "auto"
            if spikes_per_step > 1:
                neuron = GradedSTBIF(child.q_threshold, *level_bounds(child.level, child.sym), spikes_per_step)
            else:
                neuron = STBIFNeuron(q_threshold=1.0, level=child.level, sym=child.sym, backend=backend)
            neuron.q_threshold = child.q_threshold.detach().clone()  # exactly the QANN's θ
            replacement = SpikingNeuron(neuron, timesteps, capturable=True)
        elif isinstance(child, nn.modules.batchnorm._BatchNorm):
            replacement = _ShiftAtFirstStep(child, timesteps)
        elif isinstance(child, nn.MaxPool2d):
            replacement = _SpikingMaxPool(child, timesteps)
        elif isinstance(child, Stem):  # conv bias and BN shift included: the stem's output enters once
            replacement = _InjectOnceStem(child, timesteps)
        elif isinstance(child, nn.Linear) and name == "classifier":
            replacement = _SummedReadout(child, timesteps)
        elif isinstance(child, (nn.Conv2d, nn.Linear)) and child.bias is not None:
            replacement = _BiasAtFirstStep(child, timesteps)
        if replacement is None:
            _convert_children(child, timesteps, spikes_per_step, fold_norms)
        else:
            setattr(module, name, replacement)
    if fold_norms:  # conv, then batch norm: the norm's scale into the conv
        for conv, norm in conv_norm_pairs(module):
            norm.fold_scale_into(conv)


def conv_norm_pairs(module: nn.Module) -> list[tuple[nn.Module, _ShiftAtFirstStep]]:
    """The (bias-free conv, converted batch norm with its scale) pairs that follow each other in ``module`` if it is a
    Sequential: the norm's scale can scale the conv's weights instead of every step of its output."""
    if not isinstance(module, nn.Sequential):
        return []
    return [(layer, following) for layer, following in zip(module, list(module)[1:])
            if isinstance(following, _ShiftAtFirstStep) and following.scale is not None
            and type(layer) in _FOLDABLE_CONVS and layer.bias is None]


@dataclass
class SNNEvaluation:
    """The QANN and its SNN on one data set."""

    qann_accuracy: float
    snn_accuracy: float
    snn_timesteps: int            # steps until the whole set was silent (the cap if it never was)
    logit_max_abs_diff: float     # max over the set of |QANN logits − SNN summed logits|
    prediction_agreement: float   # fraction of samples where both predict the same class
    silent: bool                  # False when the cap stopped the SNN first
    accuracy_at: dict[int, float] = field(default_factory=dict)  # after 1, 2, 4, ... steps and the last T


def _fraction(hits: Tensor) -> float:
    return hits.sum().item() / hits.numel()


def _logits(output: Tensor | tuple[Tensor, ...]) -> Tensor:
    return output[0] if isinstance(output, tuple) else output


@contextlib.contextmanager
def _full_fp32() -> Iterator[None]:
    """TF32 convs/matmuls round to 10 bits and would flip quantization boundaries between QANN and SNN."""
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


def _my_batches(count: int, sharded: bool, before_batch: Callable[[], None]) -> Iterator[int]:
    """This rank's batch indices (``rank::world`` when ``sharded``); ``before_batch()`` runs as often on
    every rank (once per batch of the longest shard), so a collective stop check in it stays in step."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if sharded else (0, 1)
    for index in range(rank, -(-count // world) * world, world):
        before_batch()
        if index < count:
            yield index


def _snn_logits(snn: nn.Module, x: Tensor, timesteps: int, prefixes: list[int]) -> tuple[dict[int, Tensor], int]:
    """The SNN's logits after each of ``prefixes`` steps and after ``timesteps``, and the last step
    (1-based, 0 if none) at which any neuron fired, running ``x`` in chunks of bounded size."""
    last_active, pooled = torch.zeros((), dtype=torch.long, device=x.device), []
    steps = torch.arange(1, timesteps + 1, device=x.device)

    def record(module: nn.Module, inputs: tuple[Tensor], out: Tensor) -> None:
        nonlocal last_active
        # Each step's largest |spike|: one read of the neuron's output in any memory order, no temporary
        # (a flatten of channels_last copies it, ne().any() writes a mask) - the evaluation is bandwidth-bound.
        per_step = out.unflatten(0, (timesteps, -1))
        largest = torch.linalg.vector_norm(per_step, ord=float("inf"), dim=tuple(range(1, per_step.dim())))
        last_active = torch.maximum(last_active, (steps * (largest > 0)).max())

    neurons = [m for m in snn.modules() if isinstance(m, SpikingNeuron)]
    handles = [m.register_forward_hook(record) for m in neurons]
    if prefixes:  # causal SNN, summed readout: the logits after k steps read the pooled features summed to k
        handles.append(snn.global_pooling.register_forward_hook(lambda m, i, out: pooled.append(out)))
    logits: dict[int, list[Tensor]] = {k: [] for k in [*prefixes, timesteps]}
    # Nothing reads firing rates here; counting them is one more read of every neuron's output.
    recording = [m.record_firing_rate for m in neurons]
    for neuron in neurons:
        neuron.record_firing_rate = False
    try:
        for chunk in x.split(max(1, _IMAGE_STEPS_PER_CHUNK // timesteps)):
            logits[timesteps].append(_logits(snn(chunk)))
            if prefixes:
                sums = pooled.pop().unflatten(0, (timesteps, -1)).flatten(2).cumsum(0)
                for k in prefixes:
                    logits[k].append(snn.classifier.linear(sums[k - 1]))  # the bias once, as at T = k
    finally:
        for handle in handles:
            handle.remove()
        for neuron, was_recording in zip(neurons, recording):
            neuron.record_firing_rate = was_recording
    return {k: torch.cat(parts) for k, parts in logits.items()}, int(last_active.item())


@torch.no_grad()
@_full_fp32()
def evaluate_snn(qann: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], *, device: torch.device | str = "cpu",
                 max_timesteps: int = 64, dtype: torch.dtype | None = None,
                 before_batch: Callable[[], None] = lambda: None, sharded: bool = False,
                 spikes_per_step: int = 1, first_timesteps: int | None = None) -> SNNEvaluation:
    """Runs the QANN and its SNN (fresh state each run, the image at t = 0) at growing T until a run's
    last step has no spike anywhere, or T reaches ``max_timesteps`` (a warning then).

    A network with ``global_pooling`` and a ``classifier`` head (search_space.network) is causal and
    reads the pooled features summed over time, so one run at T gives the logits after every k ≤ T:
    T grows 4, 16, 64, ... and ``accuracy_at`` holds every power of two ≤ the last T. Any other
    network reruns at T = 1, 2, 4, .... Each forward holds at most _IMAGE_STEPS_PER_CHUNK image-steps.

    Both run without TF32, in the network's dtype or ``dtype``: float64 (the torch reference neuron)
    makes them equal to rounding; in float32 (the Triton neuron on CUDA) the convs' rounding differs
    between the summed and the per-step inputs, and a neuron whose input sits on a rounding boundary
    can flip a level, so a few predictions of a large network may differ. The QANN is left as it was.
    ``before_batch()`` runs before every batch of every run and may raise to stop the evaluation.
    ``sharded`` (torch.distributed initialized): every rank passes the same batches and evaluates
    ``rank::world`` of them; the counts are summed over the ranks, which all return the same result.
    ``spikes_per_step`` > 1: graded spikes (graded_st_bif.py), fewer steps to the same final logits.
    ``first_timesteps``: the first run's T (None: 4, or 1 without prefixes); a network known to need ~60 steps
    skips the shorter runs with 64 (the same final run and accuracies, fewer steps in all).
    """
    for name, value in (("max_timesteps", max_timesteps), ("first_timesteps", first_timesteps)):
        if name == "first_timesteps" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserInputError(f"{name}={value!r} must be a positive integer, e.g. 64")
    if dtype is not None:
        qann = copy.deepcopy(qann).to(dtype)
    was_training = qann.training
    qann.eval()
    try:
        return _evaluate(qann, batches, torch.device(device), max_timesteps, before_batch,
                         sharded and dist.is_initialized() and dist.get_world_size() > 1, spikes_per_step,
                         first_timesteps)
    finally:
        qann.train(was_training)


def _evaluate(qann: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], device: torch.device,
              max_timesteps: int, before_batch: Callable[[], None], sharded: bool,
              spikes_per_step: int, first_timesteps: int | None) -> SNNEvaluation:
    data_dtype = next(qann.parameters()).dtype
    batches = [(x.to(device, data_dtype), y.to(device)) for x, y in batches]
    qann_logits = {i: _logits(qann(batches[i][0])) for i in _my_batches(len(batches), sharded, before_batch)}
    qann_hits = sum(int((logits.argmax(1) == batches[i][1]).sum()) for i, logits in qann_logits.items())
    samples = sum(len(batches[i][1]) for i in qann_logits)
    # Its SNN has global_pooling and a _SummedReadout classifier: prefix logits from one run (_snn_logits).
    prefix = isinstance(getattr(qann, "classifier", None), nn.Linear) and hasattr(qann, "global_pooling")
    growth = 4 if prefix else 2
    accuracy_at: dict[int, float] = {}
    timesteps = min(first_timesteps or (growth if prefix else 1), max_timesteps)
    while True:
        snn = convert_to_snn(qann, timesteps, spikes_per_step).to(device)
        prefixes = sorted({2**j for j in range(timesteps.bit_length())} | set(REPORTED_TIMESTEPS)) if prefix else []
        prefixes = [k for k in prefixes if k < timesteps]
        hits = dict.fromkeys([*prefixes, timesteps], 0)
        agreement, diff, last = 0, 0.0, 0
        for i in _my_batches(len(batches), sharded, before_batch):
            logits, active = _snn_logits(snn, batches[i][0], timesteps, prefixes)
            for k in hits:
                hits[k] += int((logits[k].argmax(1) == batches[i][1]).sum())
            agreement += int((logits[timesteps].argmax(1) == qann_logits[i].argmax(1)).sum())
            diff = max(diff, (qann_logits[i] - logits[timesteps]).abs().max().item())
            last = max(last, active)
        counts = [*hits.values(), agreement, qann_hits, samples]
        if sharded:  # the whole set's counts, largest difference and last active step on every rank
            summed = torch.tensor(counts, dtype=torch.float64, device=device)
            largest = torch.tensor([diff, last], dtype=torch.float64, device=device)
            dist.all_reduce(summed)
            dist.all_reduce(largest, op=dist.ReduceOp.MAX)
            counts, (diff, last) = [int(c) for c in summed.tolist()], (largest[0].item(), int(largest[1].item()))
        total = counts[-1]
        accuracy_at.update((k, n / total) for k, n in zip(hits, counts))
        silent = last < timesteps  # no spike in the last step: nothing can change afterwards
        if silent or timesteps >= max_timesteps:
            break
        timesteps = min(growth * timesteps, max_timesteps)
    if silent:  # nothing changes after silence: the reported steps beyond the last run read its answer
        accuracy_at.update((k, accuracy_at[timesteps]) for k in REPORTED_TIMESTEPS if k > timesteps)
    else:
        log.warning("the SNN still fired at step %d (max_timesteps): its logits are not final; raise the cap",
                    max_timesteps)
    return SNNEvaluation(
        qann_accuracy=counts[-2] / total,
        snn_accuracy=accuracy_at[timesteps],
        snn_timesteps=last if silent else timesteps,
        logit_max_abs_diff=diff,
        prediction_agreement=counts[-3] / total,
        silent=silent,
        accuracy_at=dict(sorted(accuracy_at.items())),
    )
