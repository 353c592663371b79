"""One ASO-SE training step: an α step on split B, then a weight step on split A (DARTS's order).

:class:`SearchStep` is the algorithm: each step draws its ops once (one Gumbel top-k for both halves,
``aso_se.search.arch_params``), takes an α step on the arch batch with the second half of the draw
(first- or second-order, ``aso_se.search.architect``; plus the entropy, energy and latency terms), then a weight
step on the weights batch with the first half. Without an arch batch (warm-up, re-stabilization) α is
frozen and only the weight step runs. :class:`DrawAhead` is pipelining only: it starts the next step's
draw during this one and changes no draw.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import Optimizer

from aso_se.parallel.distributed import all_reduce_gradients
from aso_se.search import fast_math
from aso_se.search.arch_params import ArchSample, PendingDraw, SamplingConfig
from aso_se.search.architect import first_order_arch_step, second_order_arch_step
from aso_se.search.energy_cost import expected_energy, measure_op_costs, uniform_energy
from aso_se.search.latency_cost import CellChains, cells_per_type, expected_latency, steps_per_neuron, uniform_latency
from aso_se.search.supernet import SearchNetwork
from search_space.errors import UserInputError

Precision = Literal["fp32", "bf16"]
Batch = Sequence[Tensor]  # (inputs, labels)


def check_loss_weight(name: str, weight: Any) -> float:
    """A term's weight in the α loss as a float: a number >= 0 (0 = off), else one line naming its setting."""
    if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
        raise UserInputError(f"{name}={weight!r}: need a number >= 0 (0 = off); fix search.{name}")
    return float(weight)


def mean_entropy(logits: Tensor) -> Tensor:
    """Mean per-edge entropy (nats) of ``[..., edges, ops]`` architecture logits."""
    return fast_math.entropy(logits).mean()


def beta_decay(logits: Tensor) -> Tensor:
    """β-DARTS's regularizer: the mean per-edge logsumexp of ``[..., edges, ops]`` logits (pruned ops: -inf)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32)).logsumexp(dim=-1).mean()  # bf16 α: in fp32


class DrawAhead:
    """The steps' op draws, each step's started during the step before (pipelining, not the algorithm).

    ``draw(num_samples, temperature)`` queues one draw. A step gets its samples from :meth:`take`: the
    draw started early if it is the one asked for, else a fresh one. :meth:`start_next` starts the next
    step's draw once α is final for it, so that step need not wait for the GPU to drain before its
    ops reach the host. The generator's state from before an early draw is kept: :meth:`undo` sets it
    back, and :meth:`generator_state` (what a checkpoint saves) is as if the draw had not started.
    """

    def __init__(self, draw: Callable[[int, float], PendingDraw], generator: torch.Generator,
                 uses_generator: bool) -> None:
        self._draw = draw
        self.generator = generator
        self._uses_generator = uses_generator
        # The early draw and the generator's state before it (None where draws do not use the generator).
        self.pending: tuple[PendingDraw, Tensor | None] | None = None

    def take(self, num_samples: int, temperature: float) -> list[list[ArchSample]]:
        """This step's samples: the early draw if it is this one, else a new draw."""
        pending = self.pending
        if pending is not None and pending[0].num_samples == num_samples and pending[0].temperature == temperature:
            self.pending = None
            return pending[0].samples()
        self.undo()
        return self._draw(num_samples, temperature).samples()

    def start_next(self, num_samples: int, temperature: float) -> None:
        """Starts the next step's draw now (α must already be what the next step reads)."""
        state_before = self.generator.get_state() if self._uses_generator else None
        self.pending = (self._draw(num_samples, temperature), state_before)

    def undo(self) -> None:
        """Drops the early draw, if any, the generator set back as if it had not been drawn."""
        if self.pending is not None and self.pending[1] is not None:
            self.generator.set_state(self.pending[1])
        self.pending = None

    def generator_state(self) -> Tensor:
        """The generator's state, before the early draw if one is pending."""
        if self.pending is not None and self.pending[1] is not None:
            return self.pending[1]
        return self.generator.get_state()

    def check_saved_on(self, device_type: str | None) -> None:
        """A generator's state fits only its device type's generator: a search moves between machines of one kind
        (``device_type``: where a checkpoint's state was saved; None: not recorded)."""
        here = self.generator.device.type
        if device_type is not None and device_type != here:
            raise UserInputError(f"the checkpoint was written by a search on {device_type} and this run is on {here}; "
                                 f"resume it on {device_type} (trainer.device={device_type})")

    def restore(self, generator_state: Tensor) -> None:
        """Back to a saved :meth:`generator_state`, with no draw pending."""
        self.pending = None
        try:
            self.generator.set_state(generator_state)
        except RuntimeError as err:  # checkpoints from before the device was saved
            raise UserInputError(f"the checkpoint's Gumbel generator state does not fit this run's "
                                 f"{self.generator.device.type} generator (a search written on another device "
                                 "type?); resume it on the device type that wrote it (trainer.device)") from err


class SearchStep:
    """ASO-SE's step on the supernet and optimizers given by :meth:`bind` (see the module docstring).

    ``grad_clip``: max norm of the weight gradients (None: no clipping). ``precision``: "bf16" runs the
    forwards under autocast. ``energy_weight``: λ of the spike-aware α loss ``λ · E_α[energy] / E_uniform``
    with the op costs of :meth:`measure_op_costs` (0 = off). ``latency_weight``: the same for the deployed SNN's
    steps along its longest neuron chain (``aso_se.search.latency_cost``; 0 = off). ``memory_format``: the layout
    of image batches.
    """

    def __init__(
        self, *, sampling: SamplingConfig, generator: torch.Generator, second_order: bool, grad_clip: float | None,
        device: torch.device, precision: Precision, energy_weight: float, memory_format: torch.memory_format,
        latency_weight: float = 0.0,
    ) -> None:
        if precision not in ("fp32", "bf16"):
            raise UserInputError(f"precision {precision!r}: expected 'fp32' or 'bf16'; fix trainer.precision")
        self.energy_weight = check_loss_weight("energy_weight", energy_weight)
        self.latency_weight = check_loss_weight("latency_weight", latency_weight)
        self.sampling, self.second_order, self.grad_clip = sampling, second_order, grad_clip
        self.device, self.precision, self.memory_format = device, precision, memory_format
        self.op_costs: Tensor | None = None  # [types, edges, ops] µJ per image (measure_op_costs)
        self.chains: CellChains | None = None  # the latency term's neurons per op (bind), None while it is off
        self.draws = DrawAhead(self._draw, generator, uses_generator=sampling.gumbel)

    def bind(self, supernet: SearchNetwork, weights_optimizer: Optimizer, arch_optimizer: Optimizer) -> None:
        """The supernet and the optimizers the steps train (anew after a growth or a resume)."""
        self.supernet = supernet
        self.weight_params = list(supernet.weight_parameters())
        self.weights_optimizer, self.arch_optimizer = weights_optimizer, arch_optimizer
        if self.latency_weight > 0:
            chains = CellChains.of(supernet.search_space, steps_per_neuron(supernet.neuron))
            self.chains = chains.to(supernet.arch_parameters()[0])

    def __call__(
        self, weights_batch: Batch, arch_batch: Batch | None, *, temperature: float, entropy_weight: float = 0.0,
        next_temperature: float | None = None, beta_decay_weight: float = 0.0,
    ) -> dict[str, Tensor]:
        """One step: an α step on ``arch_batch`` (skipped when None: α frozen), then a weight step on
        ``weights_batch``, each with its own ops from ONE batched draw (the step's only host sync).
        Returns the step's scalars as 0-dim device tensors (nothing is synchronized).

        ``next_temperature``: the next step's temperature, if the next step is one with the same kind of
        batches: its draw then starts after this step's α update and before its weight step (the same
        draw, from the same α and generator; :class:`DrawAhead`).
        """
        num_samples = 1 if arch_batch is None else 2
        samples = self.draws.take(num_samples, temperature)
        weights_batch = self.to_device(weights_batch)
        scalars: dict[str, Tensor] = {}
        if arch_batch is None:
            with torch.no_grad():
                scalars["entropy"] = mean_entropy(self.supernet.arch_logits())
        else:  # DARTS's order: the α step, then the weight step
            scalars.update(self.arch_step(self.to_device(arch_batch), weights_batch, samples[1], entropy_weight,
                                          beta_decay_weight))
        if next_temperature is not None:  # α is final for the next step
            self.draws.start_next(num_samples, next_temperature)
        scalars.update(self.weight_step(weights_batch, samples[0]))
        return scalars

    def _draw(self, num_samples: int, temperature: float) -> PendingDraw:
        return self.supernet.start_draw(num_samples, self.sampling, temperature=temperature,
                                        generator=self.draws.generator)

    def weight_step(self, batch: tuple[Tensor, Tensor], sample: Sequence[ArchSample]) -> dict[str, Tensor]:
        """An SGD step of the weights on ``batch`` with ``sample``'s ops (α detached)."""
        self.weights_optimizer.zero_grad(set_to_none=True)
        loss, accuracy = self.loss(batch, sample, arch_grad=False)
        loss.backward()
        all_reduce_gradients(self.weight_params)
        if self.grad_clip is not None:
            nn.utils.clip_grad_norm_(self.weight_params, self.grad_clip)
        self.weights_optimizer.step()
        return {"loss": loss.detach(), "accuracy": accuracy}

    def arch_step(
        self, batch: tuple[Tensor, Tensor], weights_batch: tuple[Tensor, Tensor], sample: Sequence[ArchSample],
        entropy_weight: float, beta_decay_weight: float = 0.0,
    ) -> dict[str, Tensor]:
        """An α step on ``batch`` that lowers :meth:`arch_objective`."""
        outputs: dict[str, Tensor] = {}  # the last arch_loss() call's parts, for the metrics

        def arch_loss() -> Tensor:
            loss, parts = self.arch_objective(batch, sample, entropy_weight, beta_decay_weight)
            outputs.update(parts)
            return loss

        def train_loss() -> Tensor:
            return self.loss(weights_batch, sample, arch_grad=True)[0]

        alphas = self.supernet.arch_parameters()
        if self.second_order:
            second_order_arch_step(arch_loss, train_loss, alphas, self.weight_params, self.weights_optimizer)
        else:
            with self.supernet.op_runner.without_weight_grads():  # graphed ops skip them as eager ops do
                first_order_arch_step(arch_loss, alphas)
        all_reduce_gradients(alphas)
        self.arch_optimizer.step()
        return {name: value.detach() for name, value in outputs.items()}

    def arch_objective(
        self, batch: tuple[Tensor, Tensor], sample: Sequence[ArchSample], entropy_weight: float,
        beta_decay_weight: float = 0.0,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """α's loss on ``batch`` and its parts: cross-entropy + ``entropy_weight`` · mean edge entropy
        (+ ``beta_decay_weight`` · :func:`beta_decay`, + the energy and latency terms, each its weight times α's
        expectation over the uniform mixture's)."""
        parts: dict[str, Tensor] = {}
        parts["arch_loss"], parts["arch_accuracy"] = self.loss(batch, sample, arch_grad=True)
        logits = self.supernet.arch_logits()
        parts["entropy"] = mean_entropy(logits)
        loss = parts["arch_loss"] + entropy_weight * parts["entropy"]
        if beta_decay_weight > 0:
            parts["beta_decay"] = beta_decay(logits)
            loss = loss + beta_decay_weight * parts["beta_decay"]
        if self.energy_weight > 0 and self.op_costs is not None:
            parts["energy_uj"] = expected_energy(logits, self.op_costs)
            unit = uniform_energy(logits.detach(), self.op_costs).clamp_min(1e-12)
            loss = loss + self.energy_weight * parts["energy_uj"] / unit
        if self.latency_weight > 0 and self.chains is not None:
            cells = cells_per_type(self.supernet.structure.cells)
            parts["latency_steps"] = expected_latency(logits, self.chains, cells)
            with torch.no_grad():
                unit = uniform_latency(logits, self.chains, cells).clamp_min(1e-12)
            loss = loss + self.latency_weight * parts["latency_steps"] / unit
        return loss, parts

    def loss(
        self, batch: tuple[Tensor, Tensor], sample: Sequence[ArchSample], *, arch_grad: bool
    ) -> tuple[Tensor, Tensor]:
        """(cross-entropy loss, accuracy) of one supernet forward with ``sample``."""
        inputs, labels = batch
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            logits = self.supernet(inputs, sample, arch_grad=arch_grad)
        # bf16 logits in fp32; a float64 supernet (the gradient checks) keeps float64
        loss = F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), labels)
        return loss, (logits.detach().argmax(dim=-1) == labels).float().mean()

    def update_op_costs(self, arch_batch: Batch, *, epoch_start: bool) -> None:
        """The energy term's op costs, measured anew at each search epoch's start (firing rates change as the
        weights train) and wherever none were measured yet; nothing while the term is off."""
        if self.energy_weight > 0 and (epoch_start or self.op_costs is None):
            self.measure_op_costs(arch_batch)

    def measure_op_costs(self, arch_batch: Batch) -> None:
        """Each op's energy per image on ``arch_batch``'s images, the energy term's costs (``energy_cost``)."""
        self.op_costs = measure_op_costs(self.supernet, self.to_device(arch_batch)[0])

    def state_dict(self) -> dict[str, Any]:
        """The Gumbel generator (as before a pending early draw) and the energy term's op costs."""
        return {"gumbel_rng": self.draws.generator_state(), "gumbel_rng_device": self.draws.generator.device.type,
                "op_costs": None if self.op_costs is None else self.op_costs.cpu()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.draws.check_saved_on(state.get("gumbel_rng_device"))
        self.draws.restore(state["gumbel_rng"])
        costs = state.get("op_costs")  # absent in checkpoints from before the energy-aware loss
        self.op_costs = None if costs is None else costs.to(self.device)

    def to_device(self, batch: Batch) -> tuple[Tensor, Tensor]:
        inputs, labels = batch[0], batch[1]
        layout = self.memory_format if inputs.dim() == 4 else torch.preserve_format  # DVS frames are 5-d
        return (inputs.to(self.device, non_blocking=True, memory_format=layout),
                labels.to(self.device, non_blocking=True))
