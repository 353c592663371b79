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
from typing import Iterable, Iterator

import torch
from torch import Tensor, nn

from kernels.st_bif import STBIFNeuron, level_bounds
from search_space.errors import UserInputError
from search_space.multistep import Stem
from search_space.neurons import SpikingNeuron

log = logging.getLogger(__name__)


def _round_half_up(v: Tensor) -> Tensor:
    return torch.floor(v + 0.5)


class _Quantize(torch.autograd.Function):
    """One node for the quantizer: saves x only and recomputes the rest in backward (fewer kernels and
    bytes than autograd through the straight-through expression)."""

    @staticmethod
    def forward(ctx, x: Tensor, theta: Tensor, neg_min: int, pos_max: int, scale: float) -> Tensor:
        ctx.save_for_backward(x, theta)
        ctx.bounds, ctx.scale = (neg_min, pos_max), scale
        return torch.clamp(_round_half_up(x / theta), neg_min, pos_max) * theta

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        x, theta = ctx.saved_tensors
        neg_min, pos_max = ctx.bounds
        v = x / theta
        inside = (v >= neg_min - 0.5) & (v < pos_max + 0.5)
        grad_x = grad * inside if ctx.needs_input_grad[0] else None
        grad_theta = None
        if ctx.needs_input_grad[1]:  # LSQ: round(v) - v inside the range, the clipped level outside
            q = torch.clamp(_round_half_up(v), neg_min, pos_max)
            grad_theta = (grad * torch.where(inside, q - v, q)).sum().mul(ctx.scale).reshape(theta.shape)
        return grad_x, grad_theta, None, None, None


class QuantizedActivation(nn.Module):
    """θ·clip(floor(x/θ + 0.5), neg_min, pos_max) with a straight-through gradient for x inside the
    clip range and LSQ's gradient (scaled by 1/sqrt(features·pos_max)) for a learnable θ."""

    def __init__(
        self, q_threshold: float = 1.0, level: int = 8, sym: bool = True, learn_threshold: bool = True
    ) -> None:
        super().__init__()
        if isinstance(level, bool) or not isinstance(level, int) or level < 2:
            raise UserInputError(f"neuron st_bif_qann: level={level!r} must be an integer >= 2; fix neuron.level")
        if not q_threshold > 0:
            raise UserInputError(f"neuron st_bif_qann: q_threshold={q_threshold} must be > 0; fix neuron.q_threshold")
        self.pos_max, self.neg_min = level_bounds(level, sym)
        self.level, self.sym = level, sym
        threshold = torch.tensor(float(q_threshold))
        if learn_threshold:
            self.q_threshold = nn.Parameter(threshold)
        else:
            self.register_buffer("q_threshold", threshold)

    def forward(self, x: Tensor) -> Tensor:
        theta = self.q_threshold.to(x.dtype)
        scale = (x[0].numel() * max(self.pos_max, 1)) ** -0.5 if theta.requires_grad else 0.0
        return _Quantize.apply(x, theta, self.neg_min, self.pos_max, scale)

    def extra_repr(self) -> str:
        learn = isinstance(self.q_threshold, nn.Parameter)
        return (f"level={self.level}, sym={self.sym}, pos_max={self.pos_max}, neg_min={self.neg_min}, "
                f"learn_threshold={learn}")


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

    def forward(self, x: Tensor) -> Tensor:
        shape = (1, -1) + (1,) * (x.dim() - 2)
        y = (x * self.scale.view(shape)).unflatten(0, (self.timesteps, -1))
        first = y[:1] + self.shift.view(shape)
        return torch.cat([first, y[1:]]).flatten(0, 1)


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


def _qann_activations(model: nn.Module) -> list[QuantizedActivation]:
    return [m for m in model.modules() if isinstance(m, QuantizedActivation)]


def _other_neurons(model: nn.Module) -> Iterable[str]:
    for m in model.modules():
        if isinstance(m, SpikingNeuron):
            yield type(m.neuron).__name__
        elif isinstance(m, (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU)):
            yield type(m).__name__


def convert_to_snn(qann: nn.Module, timesteps: int) -> nn.Module:
    """A new ST-BIF SNN with the QANN's weights, running ``timesteps`` steps (the QANN is untouched).

    Every QuantizedActivation becomes an ST-BIF neuron with its θ and bounds; eval-mode BatchNorm adds
    its shift at t = 0 only; max pooling runs on running sums; the stem injects the image at t = 0;
    the linear head reads the features summed over time. Convs with a bias are refused.
    """
    if not isinstance(timesteps, int) or timesteps < 1:
        raise UserInputError(f"timesteps={timesteps!r} must be a positive integer")
    if not _qann_activations(qann):
        found = sorted(set(_other_neurons(qann))) or ["none"]
        raise UserInputError(
            f"only a network built with neuron=st_bif_qann converts to an exact SNN; this one has {found} "
            "activations: retrain it with neuron=st_bif_qann"
        )
    snn = copy.deepcopy(qann).eval()
    _convert_children(snn, timesteps)
    for module in snn.modules():
        if hasattr(module, "timesteps") and isinstance(module.timesteps, int):
            module.timesteps = timesteps
    return snn


def _convert_children(module: nn.Module, timesteps: int) -> None:
    for name, child in module.named_children():
        replacement: nn.Module | None = None
        if isinstance(child, QuantizedActivation):
            neuron = STBIFNeuron(q_threshold=1.0, level=child.level, sym=child.sym, backend="auto")
            neuron.q_threshold = child.q_threshold.detach().clone()  # exactly the QANN's θ
            replacement = SpikingNeuron(neuron, timesteps)
        elif isinstance(child, nn.modules.batchnorm._BatchNorm):
            replacement = _ShiftAtFirstStep(child, timesteps)
        elif isinstance(child, nn.MaxPool2d):
            replacement = _SpikingMaxPool(child, timesteps)
        elif isinstance(child, Stem):
            for sub in child:
                if isinstance(sub, nn.Conv2d) and sub.bias is not None:
                    raise UserInputError("the stem conv has a bias: the converter needs bias-free convs")
            replacement = _InjectOnceStem(child, timesteps)
        elif isinstance(child, nn.Linear) and name == "classifier":
            replacement = _SummedReadout(child, timesteps)
        elif isinstance(child, nn.Conv2d) and child.bias is not None:
            raise UserInputError(f"conv {name!r} has a bias; only bias-free convs (followed by BatchNorm) convert")
        if replacement is None:
            _convert_children(child, timesteps)
        else:
            setattr(module, name, replacement)


@dataclass
class SNNEvaluation:
    """The QANN and its SNN on one data set."""

    qann_accuracy: float
    snn_accuracy: float
    snn_timesteps: int            # steps until the whole set was silent (the cap if it never was)
    logit_max_abs_diff: float     # max over the set of |QANN logits − SNN summed logits|
    prediction_agreement: float   # fraction of samples where both predict the same class
    silent: bool                  # False when the cap stopped the SNN first
    accuracy_at: dict[int, float] = field(default_factory=dict)  # accuracy after t = 1, 2, 4, ... steps


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


@torch.no_grad()
@_full_fp32()
def evaluate_snn(qann: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], *, device: torch.device | str = "cpu",
                 max_timesteps: int = 64, dtype: torch.dtype | None = None) -> SNNEvaluation:
    """Runs the QANN and its SNN at T = 1, 2, 4, ... (fresh state each time, the image at t = 0) until a
    run's last step has no spike anywhere, or T reaches ``max_timesteps`` (a warning then).

    Both run without TF32, in the network's dtype or ``dtype``: float64 (the torch reference neuron)
    makes them equal to rounding; in float32 (the Triton neuron on CUDA) the convs' rounding differs
    between the summed and the per-step inputs, and a neuron whose input sits on a rounding boundary
    can flip a level, so a few predictions of a large network may differ.
    """
    if dtype is not None:
        qann = copy.deepcopy(qann).to(dtype)
    qann = qann.eval()
    data_dtype = next(qann.parameters()).dtype
    batches = [(x.to(device, data_dtype), y.to(device)) for x, y in batches]
    qann_logits = [_logits(qann(x)) for x, _ in batches]
    labels = torch.cat([y for _, y in batches])
    total = len(labels)
    qann_predictions = torch.cat(qann_logits).argmax(1)
    qann_accuracy = (qann_predictions == labels).sum().item() / total
    accuracy_at: dict[int, float] = {}
    timesteps, result = 1, None
    while True:
        snn = convert_to_snn(qann, timesteps).to(device)
        last_active = torch.zeros((), dtype=torch.long, device=device)
        neurons = [m for m in snn.modules() if isinstance(m, SpikingNeuron)]

        def record(module: nn.Module, inputs: tuple[Tensor], out: Tensor) -> None:
            nonlocal last_active
            active_steps = out.unflatten(0, (module.timesteps, -1)).flatten(1).ne(0).any(1)
            steps = torch.arange(1, module.timesteps + 1, device=out.device)
            last_active = torch.maximum(last_active, (steps * active_steps).max())

        handles = [neuron.register_forward_hook(record) for neuron in neurons]
        try:
            snn_logits = [_logits(snn(x)) for x, _ in batches]
        finally:
            for handle in handles:
                handle.remove()
        snn_predictions = torch.cat(snn_logits).argmax(1)
        correct = (snn_predictions == labels).sum().item()
        accuracy_at[timesteps] = correct / total
        last = int(last_active.item())
        silent = last < timesteps
        if silent or timesteps >= max_timesteps:
            diff = max((q - s).abs().max().item() for q, s in zip(qann_logits, snn_logits))
            agree = (snn_predictions == qann_predictions).sum().item() / total
            result = SNNEvaluation(qann_accuracy, correct / total, last if silent else timesteps, diff, agree, silent,
                                   accuracy_at)
            break
        timesteps = min(2 * timesteps, max_timesteps)
    if not result.silent:
        log.warning("the SNN still fired at step %d (snn.max_timesteps): its logits are not final; raise the cap",
                    max_timesteps)
    return result
