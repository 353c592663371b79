"""The ASO-SE search engine: runs the cycle plan (``schedule``) on a supernet and derives the genotype.

``engine.run(weights_loader, arch_loader, *, callbacks, should_stop)`` follows the loops' contract
(``aso_se.loop``); its callbacks also hear of each cycle's end (:class:`SearchLoopCallbacks`). The engine never
prints; it logs rare events. Resume: ``load_state_dict(state_dict())`` on an engine built with the same arguments
restores the grown supernet, weights, α, pruning masks, optimizers, schedule position down to the step and every
RNG; the loaders' ``set_epoch(epoch, start_batch=k)`` makes the data order a pure function of (seed, epoch). Under
torch.distributed every rank runs the same engine with the same seed (``aso_se.parallel.distributed`` keeps α
identical).
"""
from __future__ import annotations

import functools
import logging
from dataclasses import asdict
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from aso_se.loop import LoopCallbacks, ResumableLoader, never
from aso_se.parallel.distributed import broadcast_module, check_identical_across_ranks, distributed_world_size
from aso_se.parallel.rng_state import capture_rng_state, restore_rng_state
from aso_se.search import fast_math
from aso_se.search.arch_params import SamplingConfig
from aso_se.search.derive import supernet_genotype
from aso_se.search.epoch_metrics import EpochMetrics
from aso_se.search.evolution import CycleResult, EvolutionConfig, prune_weak_ops, track_weak_ops
from aso_se.search.schedule import Phase, PlanEntry, SearchSchedule
from aso_se.search.step import Batch, Precision, SearchStep
from aso_se.search.supernet import CELL_TYPES, SearchNetwork
from aso_se.search.trained_supernet import OptimizerFactory, SchedulerFactory, TrainedSupernet
from search_space.errors import UserInputError
from search_space.genotypes import Genotype
from search_space.neurons import recording_firing_rates

logger = logging.getLogger(__name__)

STATE_VERSION = 1


class SearchLoopCallbacks(LoopCallbacks):
    """The loops' callbacks (``aso_se.loop``), and the search's own event: a cycle's end."""

    def on_cycle_end(self, result: CycleResult) -> None:
        """Once a cycle's genotype is derived and its supernet pruned and grown for the next cycle."""


class ASOSEEngine:
    """Searches ``supernet`` with ASO-SE (see the module docstring for the API and its callbacks).

    ``weights_optimizer``/``arch_optimizer``: factories taking the parameters (Hydra partials);
    ``weights_scheduler``: optional factory taking the weights optimizer, stepped once per
    training epoch (its length should be ``schedule.total_epochs``). ``grad_clip``: max norm of
    the weight gradients (None: no clipping). ``precision``: "bf16" runs forwards under
    autocast (weights, α and optimizer state stay fp32). ``energy_weight``: λ of the spike-aware
    α loss, ``λ · E_α[energy] / E_uniform`` (``aso_se.search.energy_cost``); 0 = off. ``latency_weight``: the same
    for the deployed SNN's steps along its longest neuron chain (``aso_se.search.latency_cost``); 0 = off.
    """

    def __init__(
        self, supernet: SearchNetwork, *, weights_optimizer: OptimizerFactory, arch_optimizer: OptimizerFactory,
        weights_scheduler: SchedulerFactory | None = None, schedule: SearchSchedule = SearchSchedule(),
        sampling: SamplingConfig = SamplingConfig(), evolution: EvolutionConfig = EvolutionConfig(),
        second_order: bool = False, grad_clip: float | None = 5.0, device: str | torch.device = "cpu",
        precision: Precision = "fp32", seed: int = 0, energy_weight: float = 0.0, channels_last: bool = False,
        graph_ops: bool = False, latency_weight: float = 0.0,
    ) -> None:
        self.device = torch.device(device)
        self.schedule, self.sampling, self.evolution = schedule, sampling, evolution
        self.precision, self.seed = precision, seed
        # channels_last: conv weights and image batches in NHWC memory, where cuDNN's batch norm and
        # depthwise convs are several times faster than in NCHW (benchmarks/bench_norm_conv.py, git 3b7d88c)
        self.memory_format = torch.channels_last if channels_last else torch.preserve_format
        # One generator for all Gumbel draws, seeded alike on every rank (aso_se.parallel.distributed).
        generator = torch.Generator(device=self.device).manual_seed(seed)
        self.step = SearchStep(
            sampling=sampling, generator=generator, second_order=second_order, grad_clip=grad_clip,
            device=self.device, precision=precision, energy_weight=energy_weight, latency_weight=latency_weight,
            memory_format=self.memory_format,
        )
        # graph_ops: on CUDA, each op's forward and backward replayed from CUDA graphs (host-bound steps)
        self.trained = TrainedSupernet(supernet, self.step, weights_optimizer=weights_optimizer,
                                       arch_optimizer=arch_optimizer, weights_scheduler=weights_scheduler,
                                       graph_ops=graph_ops)
        self._plan = schedule.plan()
        self._position = 0  # index of the current plan entry
        self._epoch_step = 0  # steps done in the current epoch
        self._global_step = 0
        self.metrics = EpochMetrics(start_logits=self._stacked_logits())
        self.genotypes: list[Genotype] = []
        self.temperature = schedule.temperature_start
        self._pending_rng: dict[str, Any] | None = None

    @property
    def supernet(self) -> SearchNetwork:
        return self.step.supernet

    @property
    def weights_optimizer(self) -> Optimizer:
        return self.step.weights_optimizer

    @property
    def arch_optimizer(self) -> Optimizer:
        return self.step.arch_optimizer

    @property
    def weights_scheduler(self) -> LRScheduler | None:
        return self.trained.weights_scheduler

    @property
    def generator(self) -> torch.Generator:
        """The generator of every Gumbel draw."""
        return self.step.draws.generator

    # ----------------------------------------------------------------------------- the loop
    def run(self, weights_loader: ResumableLoader, arch_loader: ResumableLoader, *,
            callbacks: SearchLoopCallbacks | None = None, should_stop: Callable[[], bool] = never) -> bool:
        """Runs the rest of the plan: True at its end (the genotype is ``genotypes[-1]``), False when
        ``should_stop`` ended it early.

        ``callbacks.on_log(metrics, global_step)`` after every step, a step or two late (scalars arrive
        asynchronously), ``callbacks.on_epoch_end(summary)`` once an epoch's state is final (their keys:
        ``aso_se.search.epoch_metrics``), ``callbacks.on_cycle_end(CycleResult)`` when a cycle's genotype is derived.
        """
        callbacks = SearchLoopCallbacks() if callbacks is None else callbacks
        if self._position == 0 and self._epoch_step == 0:
            broadcast_module(self.supernet)  # identical start on every rank
        while self._position < len(self._plan):
            entry = self._plan[self._position]
            if entry.phase is Phase.EVOLVE:
                result = self._evolve(entry.cycle)
                self._position += 1
                callbacks.on_cycle_end(result)
                continue
            if not self._train_epoch(entry, weights_loader, arch_loader, callbacks, should_stop):
                return False
            self._end_epoch(entry, callbacks)
        return True

    def _train_epoch(self, entry: PlanEntry, weights_loader: ResumableLoader, arch_loader: ResumableLoader,
                     callbacks: SearchLoopCallbacks, should_stop: Callable[[], bool]) -> bool:
        searching = entry.phase is Phase.SEARCH
        loaders = [weights_loader, arch_loader] if searching else [weights_loader]
        for loader in loaders:
            loader.set_epoch(entry.epoch, start_batch=self._epoch_step)
        steps_per_epoch = self._epoch_step + min(len(loader) for loader in loaders)
        if self._pending_rng is not None:  # a resumed run: the RNG as it was after the last step
            restore_rng_state(self._pending_rng)
            self._pending_rng = None
        self.metrics.start_piece()
        world_size = distributed_world_size()  # images/s counts every rank's images
        for batches in zip(*loaders):
            if searching:
                self.step.update_op_costs(batches[1], epoch_start=self._epoch_step == 0)
            knobs = self.schedule.step_knobs(entry, self._epoch_step, steps_per_epoch)
            self.temperature = knobs.temperature
            last_step = self._epoch_step == steps_per_epoch - 1
            with recording_firing_rates(self.supernet, last_step):  # the rates that on_epoch_end reads
                scalars = self.train_step(
                    batches[0], batches[1] if searching else None, temperature=knobs.temperature,
                    entropy_weight=knobs.entropy_weight, next_temperature=knobs.next_temperature,
                    beta_decay_weight=knobs.beta_decay_weight,
                )
            self.metrics.push(entry, self._epoch_step, self._global_step, self.weights_optimizer.param_groups[0]["lr"],
                              knobs, scalars, images=sum(len(batch[1]) for batch in batches) * world_size)
            self._epoch_step += 1
            self._global_step += 1
            self.metrics.deliver(callbacks, wait=False)
            if should_stop():
                self.metrics.deliver(callbacks, wait=True)
                return False
            if not last_step and callbacks.checkpoint_due():  # the epoch's end saves anyway
                callbacks.save_checkpoint()
        self.metrics.deliver(callbacks, wait=True)
        return True

    def _end_epoch(self, entry: PlanEntry, callbacks: SearchLoopCallbacks) -> None:
        self.step.draws.undo()  # none is started across an epoch's end; this keeps it so for any caller
        if self.weights_scheduler is not None:
            self.weights_scheduler.step()
        if entry.phase is Phase.SEARCH and self.evolution.prune_threshold > 0:
            for kind in CELL_TYPES:
                track_weak_ops(self.supernet.arch[kind], self.evolution.prune_threshold)
        summary = self.metrics.end_epoch(entry, lr=self.weights_optimizer.param_groups[0]["lr"],
                                         temperature=self.temperature, logits=self._stacked_logits())
        self._position += 1
        self._epoch_step = 0
        callbacks.on_epoch_end(summary)

    # ----------------------------------------------------------------------------- the step
    def train_step(
        self, weights_batch: Batch, arch_batch: Batch | None, *, temperature: float, entropy_weight: float = 0.0,
        next_temperature: float | None = None, beta_decay_weight: float = 0.0,
    ) -> dict[str, Tensor]:
        """One ASO-SE step (``aso_se.search.step.SearchStep``): an α step on ``arch_batch`` (None: α frozen),
        then a weight step on ``weights_batch``; the step's scalars as 0-dim device tensors."""
        return self.step(weights_batch, arch_batch, temperature=temperature, entropy_weight=entropy_weight,
                         next_temperature=next_temperature, beta_decay_weight=beta_decay_weight)

    # ----------------------------------------------------------------------------- evolution
    def _evolve(self, cycle: int) -> CycleResult:
        check_identical_across_ranks(self._stacked_logits(), "α")  # every rank derives the same genotype
        genotype = self.genotype()
        self.genotypes.append(genotype)
        pruned = 0
        if cycle < self.schedule.cycles - 1:  # the last cycle's supernet is not trained again
            if self.evolution.prune_threshold > 0:
                pruned = sum(prune_weak_ops(self.supernet.arch[kind]) for kind in CELL_TYPES)
            new_cells, width_factor = self.evolution.growth(self.supernet.structure)
            if new_cells or width_factor > 1:  # seeded by (seed, cycle): a resumed search grows the same supernet
                self.trained.grow(new_cells=new_cells, width_factor=width_factor, seed=self.seed + 7919 * (cycle + 1))
        structure = self.supernet.structure
        logger.info("cycle %d: genotype %s; pruned %d ops; supernet %s", cycle, genotype, pruned, structure)
        return CycleResult(cycle, genotype, structure, pruned)

    # ----------------------------------------------------------------------------- for logging
    def _stacked_logits(self) -> Tensor:
        with torch.no_grad():
            return self.supernet.arch_logits()

    @property
    def primitives(self) -> tuple[str, ...]:
        return tuple(self.supernet.search_space.primitives)

    @property
    def progress(self) -> dict[str, Any]:
        """Where the search is: cycle, phase, epoch (training epochs done), step in the epoch."""
        entry = self._plan[min(self._position, len(self._plan) - 1)]
        return {"cycle": entry.cycle, "phase": entry.phase.value, "epoch": entry.epoch, "step": self._epoch_step,
                "global_step": self._global_step, "finished": self._position >= len(self._plan)}

    def alpha_probabilities(self) -> dict[str, Tensor]:
        """``{"normal": [edges, ops], "reduce": [edges, ops]}`` softmax of α on the CPU (columns: ``primitives``)."""
        return self.supernet.alpha_probabilities()

    def entropy(self) -> dict[str, float]:
        """Mean per-edge entropy (nats) of α: each cell type's, and ``mean`` over all edges."""
        with torch.no_grad():
            per_edge = {kind: fast_math.entropy(self.supernet.arch[kind].logits()).float() for kind in CELL_TYPES}
        return {**{kind: float(values.mean()) for kind, values in per_edge.items()},
                "mean": float(torch.cat(list(per_edge.values())).mean())}

    def genotype(self) -> Genotype:
        """The genotype derived from the current α (top-2 inputs per node without none, skip cap)."""
        return supernet_genotype(self.supernet, self.evolution.max_skip_connect, self.evolution.max_parameter_free,
                                 self.evolution.max_normal_pools)

    # ----------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """Everything to continue exactly (module docstring); tensors and plain containers only."""
        return {
            "version": STATE_VERSION,
            "schedule": asdict(self.schedule),
            **self.trained.state_dict(),
            "position": self._position,
            "step": self._epoch_step,
            "global_step": self._global_step,
            **self.metrics.state_dict(),
            "genotypes": [genotype.to_json() for genotype in self.genotypes],
            "rng": capture_rng_state(),
            **self.step.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a ``state_dict()``; the global RNGs are set when ``run`` reaches the saved step."""
        if state.get("version") != STATE_VERSION:
            raise UserInputError(
                f"engine state version {state.get('version')}, expected {STATE_VERSION}; start a new search"
            )
        self.schedule.check_resumable(state["schedule"])
        self.step.load_state_dict(state)  # first: it refuses a checkpoint of another device type
        self.trained.load_state_dict(state)
        self._position, self._epoch_step, self._global_step = state["position"], state["step"], state["global_step"]
        self.metrics.load_state_dict(state, self.device)
        self.genotypes = [Genotype.from_json(text) for text in state["genotypes"]]
        self._pending_rng = state["rng"]


def build_engine(
    *, supernet: Callable[..., SearchNetwork], schedule: SearchSchedule, sampling: SamplingConfig,
    evolution: EvolutionConfig, second_order: bool, grad_clip: float | None, search_space: Any,
    neuron: Callable[[], nn.Module], num_classes: int, in_channels: int, optim: dict[str, Any],
    device: str | torch.device = "cpu", precision: Precision = "fp32", seed: int = 0, energy_weight: float = 0.0,
    channels_last: bool = False, graph_ops: bool = False, latency_weight: float = 0.0,
) -> ASOSEEngine:
    """The engine of a composed ``search`` config node (Hydra ``_partial_``), completed by search.py
    with the search space, neuron, data shapes, optimizers (``optim``: weights, arch, weights_scheduler)
    and run settings. The weights' schedule spans all training epochs of the plan."""
    network = supernet(search_space=search_space, neuron=neuron, num_classes=num_classes,
                       in_channels=in_channels, timesteps=neuron.timesteps)
    scheduler = optim.get("weights_scheduler")
    return ASOSEEngine(
        network, weights_optimizer=optim["weights"], arch_optimizer=optim["arch"],
        weights_scheduler=None if scheduler is None else functools.partial(scheduler, T_max=schedule.total_epochs),
        schedule=schedule, sampling=sampling, evolution=evolution, second_order=second_order,
        grad_clip=grad_clip, device=device, precision=precision, seed=seed, energy_weight=energy_weight,
        channels_last=channels_last, graph_ops=graph_ops, latency_weight=latency_weight,
    )
