"""The neuron registry, the factory every op calls, and the wrapper that runs a multi-step neuron.

Tensors flow through the network FLATTENED over time, ``[T*B, ...]``, so that conv/BN/pooling
run once on ``[T*B, C, H, W]``. A spiking neuron views its input as ``[T, B, ...]``, runs the
whole sequence from its initial state, and flattens it back. A kind is one builder
``builder(timesteps, **params) -> nn.Module`` registered with :func:`register_neuron`; its
keyword defaults are those of ``conf/neuron/<kind>.yaml``.
"""
from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch
from spikingjelly.activation_based import base as sj_base
from torch import nn

from kernels.block_map import BlockMap
from kernels.memory_order import in_storage_order, storage_order
from search_space.errors import UserInputError

NeuronFactoryFn = Callable[[], nn.Module]
NeuronBuilder = Callable[..., nn.Module]

NEURON_KINDS: dict[str, NeuronBuilder] = {}


def register_neuron(kind: str) -> Callable[[NeuronBuilder], NeuronBuilder]:
    """Decorator adding ``builder(timesteps, **params) -> nn.Module`` to ``NEURON_KINDS`` under ``kind``.

    The module maps ``[timesteps*B, ...]`` to the same shape; ``params`` are keyword arguments with
    defaults (``conf/neuron/<kind>.yaml`` sets them all). Raises ValueError on a repeated kind.
    """

    def add(builder: NeuronBuilder) -> NeuronBuilder:
        if kind in NEURON_KINDS:
            raise ValueError(f"neuron kind {kind!r} is already registered")
        NEURON_KINDS[kind] = builder
        return builder

    return add


def neuron_parameters(kind: str) -> dict[str, Any]:
    """The parameters of a registered kind (all but ``timesteps``) and their Python defaults."""
    parameters = inspect.signature(NEURON_KINDS[kind]).parameters
    return {name: p.default for name, p in parameters.items() if name != "timesteps"}


class SpikingNeuron(nn.Module):
    """Runs a multi-step neuron (``[T, B, ...]`` in and out) on a flattened ``[T*B, ...]`` tensor.

    Every forward starts from the neuron's initial state and leaves it there afterwards, so no
    state (and no autograd graph) is carried from one batch to the next: a stateful
    (spikingjelly) neuron is reset after each forward; ours (ST-BIF) keeps no state. While
    ``record_firing_rate`` is on, each forward counts its spikes on the device (one reduction,
    no host sync); :attr:`firing_rate` (and :func:`firing_rates`) is the last recorded forward's
    fraction of neuron-steps that spiked, 0 before any. ``capturable``: the builder vouches that
    the neuron's forward and backward keep no host state and never sync, so CUDA graphs may capture
    them (``aso_se.search.graphed_ops``); a neuron it does not know stays eager.
    """

    spike_count: torch.Tensor

    def __init__(self, neuron: nn.Module, timesteps: int, *, capturable: bool = False) -> None:
        super().__init__()
        self.neuron = neuron
        self.timesteps = timesteps
        self.capturable = capturable
        self.stateful = isinstance(neuron, sj_base.MemoryModule)
        self.record_firing_rate = True
        self.neuron_steps = 1  # of the last recorded forward
        # A log value, not model state: kept out of checkpoints.
        self.register_buffer("spike_count", torch.zeros((), dtype=torch.int64), persistent=False)

    @property
    def firing_rate(self) -> torch.Tensor:
        """0-dim float tensor on the module's device: the last recorded forward's spikes per neuron-step."""
        return self.spike_count / self.neuron_steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, with_block_map=False)[0]

    def forward_with_block_map(self, x: torch.Tensor) -> tuple[torch.Tensor, BlockMap | None]:
        """`forward`, and the block map of its output where the neuron's kernel writes one (ST-BIF
        on the Triton backend, [T*B, C, H, W] input; see kernels.st_bif), else None."""
        return self._run(x, with_block_map=hasattr(self.neuron, "forward_with_block_map"))

    def _run(self, x: torch.Tensor, with_block_map: bool) -> tuple[torch.Tensor, BlockMap | None]:
        if x.shape[0] % self.timesteps:
            raise ValueError(
                f"a neuron with T={self.timesteps} got a leading dimension of {x.shape[0]}, "
                "which is not T*B: flatten multi-step tensors time-first to [T*B, ...]"
            )
        x_seq = x.unflatten(0, (self.timesteps, -1))
        # A spikingjelly neuron copies a channels_last input to NCHW: hand it the memory order instead
        # (a contiguous view; the neuron is elementwise but for time) and give the output x's strides.
        order = storage_order(x_seq) if self.stateful and not x_seq.is_contiguous() else None
        block_map = None
        try:
            if with_block_map:
                out, block_map = self.neuron.forward_with_block_map(x_seq)
            elif order is not None:
                out = in_storage_order(self.neuron, x_seq, order)
            else:
                out = self.neuron(x_seq)
        finally:  # back to the initial state (also after an error), dropping the sequence's graph
            if self.stateful:
                self.neuron.reset()
        if self.record_firing_rate:
            self.spike_count = torch.count_nonzero(out)
            self.neuron_steps = out.numel()
        return out.flatten(0, 1), block_map

    def extra_repr(self) -> str:
        return f"timesteps={self.timesteps}"


def make_neuron(kind: str, *, timesteps: int, **params: Any) -> nn.Module:
    """A fresh neuron of ``kind`` mapping ``[timesteps*B, ...]`` to the same shape."""
    if kind not in NEURON_KINDS:
        raise UserInputError(f"unknown neuron kind {kind!r}: expected one of {sorted(NEURON_KINDS)}; set neuron=<kind>")
    if isinstance(timesteps, bool) or not isinstance(timesteps, int) or timesteps < 1:
        raise UserInputError(f"timesteps={timesteps!r} must be a positive integer; set neuron.timesteps, e.g. 4")
    accepted = list(neuron_parameters(kind))
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise UserInputError(
            f"neuron {kind!r} has no parameter(s) {unknown}: it accepts {accepted}; "
            "remove or rename them in conf/neuron"
        )
    return NEURON_KINDS[kind](timesteps, **params)


class NeuronFactory:
    """Makes fresh neurons of one configured kind: ``factory()`` is what every op calls.

    ``conf/neuron/<kind>.yaml`` instantiates it. The parameters are checked once here, at
    start-up, by building one neuron, rather than deep inside the first forward.
    """

    def __init__(self, kind: str, *, timesteps: int, **params: Any) -> None:
        self.kind = kind
        self.timesteps = timesteps
        self.params = params
        self()

    def __call__(self) -> nn.Module:
        return make_neuron(self.kind, timesteps=self.timesteps, **self.params)

    def __repr__(self) -> str:
        params = "".join(f", {key}={value!r}" for key, value in self.params.items())
        return f"NeuronFactory({self.kind!r}, timesteps={self.timesteps}{params})"


def firing_rates(model: nn.Module) -> dict[str, torch.Tensor]:
    """Last forward's firing rate (fraction of neuron-steps that spiked) of every spiking neuron, by module name.

    The values are 0-dim tensors on the model's device; nothing is synchronized here.
    """
    return {name: module.firing_rate for name, module in model.named_modules() if isinstance(module, SpikingNeuron)}


def set_firing_rate_recording(model: nn.Module, enabled: bool) -> None:
    """Turn the per-forward spike count (one reduction per neuron forward) on or off, e.g. on only for logged steps."""
    for module in model.modules():
        if isinstance(module, SpikingNeuron):
            module.record_firing_rate = enabled


@contextmanager
def recording_firing_rates(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Within, ``model``'s spiking neurons record their firing rates if ``enabled``; after it, none records.
    Counting spikes costs a reduction in every neuron forward, so a loop records on the steps it reports only."""
    if not enabled:
        yield
        return
    set_firing_rate_recording(model, True)
    try:
        yield
    finally:
        set_firing_rate_recording(model, False)
