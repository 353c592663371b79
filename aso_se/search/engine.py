"""The ASO-SE search engine: runs the cycle plan (``schedule``) on a supernet and returns the genotype.

``engine.run(weights_loader, arch_loader, on_step=, on_epoch_end=, on_cycle_end=, should_stop=)``;
the callbacks' keys are documented on ``run``. The engine never prints; it logs rare events.
Resume: ``load_state_dict(state_dict())`` on an engine built with the same arguments restores the
grown supernet, weights, α, pruning masks, optimizers, schedule position down to the step and
every RNG; the loaders' ``set_epoch(epoch, start_batch=k)`` makes the data order a pure function of
(seed, epoch). Under torch.distributed every rank runs the same engine with the same seed
(``aso_se.parallel.distributed`` keeps α identical).
"""
from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Callable, Iterable, Protocol

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from aso_se.errors import TrainingDiverged
from aso_se.monitor.step_metrics import AsyncStepMetrics
from aso_se.parallel.distributed import broadcast_module, check_identical_across_ranks, distributed_world_size
from aso_se.parallel.rng_state import capture_rng_state, restore_rng_state
from aso_se.search import fast_math
from aso_se.search.arch_params import SamplingConfig
from aso_se.search.derive import supernet_genotype
from aso_se.search.evolution import EvolutionConfig, prune_weak_ops, track_weak_ops
from aso_se.search.growth import grow_supernet, rebind_optimizer
from aso_se.search.schedule import Phase, PlanEntry, SearchSchedule
from aso_se.search.step import Batch, Precision, SearchStep, mean_entropy
from aso_se.search.supernet import CELL_TYPES, SearchNetwork, SupernetStructure
from search_space.errors import UserInputError
from search_space.genotypes import Genotype
from search_space.neurons import set_firing_rate_recording

logger = logging.getLogger(__name__)

OptimizerFactory = Callable[[Iterable[nn.Parameter]], Optimizer]
SchedulerFactory = Callable[[Optimizer], LRScheduler]
STATE_VERSION = 1


class ResumableLoader(Protocol):
    """What ``run`` needs from a loader (``aso_se.data``'s loaders have it)."""

    def __iter__(self) -> Any: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None: ...


def non_finite_message(metrics: dict[str, Any], name: str) -> str:
    """Where a loss became NaN/Inf, and what to lower."""
    return (f"{name} is {metrics[name]} at cycle {metrics['cycle']}, {metrics['phase']} epoch {metrics['epoch']}, "
            f"step {metrics['step']}: lower the learning rate (optim) or the entropy weight, "
            "or use trainer.precision=fp32")


@dataclass(frozen=True)
class CycleResult:
    """A cycle's outcome: its derived genotype and the supernet it leaves for the next cycle."""

    cycle: int
    genotype: Genotype
    structure: SupernetStructure
    pruned_ops: int


class ASOSEEngine:
    """Searches ``supernet`` with ASO-SE (see the module docstring for the API and its callbacks).

    ``weights_optimizer``/``arch_optimizer``: factories taking the parameters (Hydra partials);
    ``weights_scheduler``: optional factory taking the weights optimizer, stepped once per
    training epoch (its length should be ``schedule.total_epochs``). ``grad_clip``: max norm of
    the weight gradients (None: no clipping). ``precision``: "bf16" runs forwards under
    autocast (weights, α and optimizer state stay fp32). ``energy_weight``: λ of the spike-aware
    α loss, ``λ · E_α[energy] / E_uniform`` (``aso_se.search.energy_cost``); 0 = off.
    """

    def __init__(
        self,
        supernet: SearchNetwork,
        *,
        weights_optimizer: OptimizerFactory,
        arch_optimizer: OptimizerFactory,
        weights_scheduler: SchedulerFactory | None = None,
        schedule: SearchSchedule = SearchSchedule(),
        sampling: SamplingConfig = SamplingConfig(),
        evolution: EvolutionConfig = EvolutionConfig(),
        second_order: bool = False,
        grad_clip: float | None = 5.0,
        device: str | torch.device = "cpu",
        precision: Precision = "fp32",
        seed: int = 0,
        energy_weight: float = 0.0,
        channels_last: bool = False,
        graph_ops: bool = False,
    ) -> None:
        if precision not in ("fp32", "bf16"):
            raise UserInputError(f"precision {precision!r}: expected 'fp32' or 'bf16'; fix trainer.precision")
        if not (isinstance(energy_weight, (int, float)) and math.isfinite(energy_weight) and energy_weight >= 0):
            raise UserInputError(f"energy_weight={energy_weight!r}: need a number >= 0 (0 = off); "
                                 "fix search.energy_weight")
        self.device = torch.device(device)
        self.schedule, self.sampling, self.evolution = schedule, sampling, evolution
        self.precision, self.seed = precision, seed
        self._make_weights_optimizer, self._make_arch_optimizer = weights_optimizer, arch_optimizer
        self._make_weights_scheduler = weights_scheduler
        # channels_last: conv weights and image batches in NHWC memory, where cuDNN's batch norm and
        # depthwise convs are several times faster than in NCHW (benchmarks/bench_norm_conv.py, git 3b7d88c)
        self.memory_format = torch.channels_last if channels_last else torch.preserve_format
        # One generator for all Gumbel draws, seeded alike on every rank (aso_se.parallel.distributed).
        generator = torch.Generator(device=self.device).manual_seed(seed)
        self.step = SearchStep(
            sampling=sampling, generator=generator, second_order=second_order, grad_clip=grad_clip,
            device=self.device, precision=precision, energy_weight=float(energy_weight),
            memory_format=self.memory_format,
        )
        # graph_ops: on CUDA, each op's forward and backward replayed from CUDA graphs (host-bound steps)
        self.graph_ops = bool(graph_ops) and self._graph_ops_apply(supernet)
        self._use_supernet(supernet.to(self.device))
        self._plan = schedule.plan()
        self._position = 0  # index of the current plan entry
        self._epoch_step = 0  # steps done in the current epoch
        self._global_step = 0
        self._epoch_totals: dict[str, float] = {}
        self._epoch_start_logits = self._stacked_logits()
        self._epoch_started = time.perf_counter()
        self.genotypes: list[Genotype] = []
        self.temperature = schedule.temperature_start
        self._metrics = AsyncStepMetrics()
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
    def generator(self) -> torch.Generator:
        """The generator of every Gumbel draw."""
        return self.step.draws.generator

    # ----------------------------------------------------------------------------- the loop
    def run(
        self,
        weights_loader: ResumableLoader,
        arch_loader: ResumableLoader,
        *,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        on_epoch_end: Callable[[ASOSEEngine, dict[str, Any]], None] | None = None,
        on_cycle_end: Callable[[ASOSEEngine, CycleResult], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> Genotype | None:
        """Runs the rest of the plan; the final genotype, or None if ``should_stop`` ended it early.

        ``on_step(metrics)`` after every step, a step or two late (scalars arrive asynchronously):
        cycle, phase, epoch, epoch_in_phase, step, global_step, lr, temperature, entropy_weight,
        beta_decay_weight, images, images_per_second, loss, accuracy, entropy (nats), and arch_loss,
        arch_accuracy (and beta_decay when its weight is positive) in the search phase.
        ``on_epoch_end(engine, info)`` once an epoch's state is final (save here): also steps, seconds,
        arch_kl and the epoch means. ``on_cycle_end(engine, CycleResult)`` when
        a cycle's genotype is derived. ``should_stop()`` is polled after every step.
        """
        if self._position == 0 and self._epoch_step == 0:
            broadcast_module(self.supernet)  # identical start on every rank
        while self._position < len(self._plan):
            entry = self._plan[self._position]
            if entry.phase is Phase.EVOLVE:
                result = self._evolve(entry.cycle)
                self._position += 1
                if on_cycle_end is not None:
                    on_cycle_end(self, result)
                continue
            if not self._train_epoch(entry, weights_loader, arch_loader, on_step, should_stop):
                return None
            self._end_epoch(entry, on_epoch_end)
        return self.genotypes[-1]

    def _train_epoch(
        self, entry: PlanEntry, weights_loader: ResumableLoader, arch_loader: ResumableLoader,
        on_step: Callable[[dict[str, Any]], None] | None, should_stop: Callable[[], bool],
    ) -> bool:
        searching = entry.phase is Phase.SEARCH
        loaders = [weights_loader, arch_loader] if searching else [weights_loader]
        for loader in loaders:
            loader.set_epoch(entry.epoch, start_batch=self._epoch_step)
        steps_per_epoch = self._epoch_step + min(len(loader) for loader in loaders)
        if self._pending_rng is not None:  # a resumed run: the RNG as it was after the last step
            restore_rng_state(self._pending_rng)
            self._pending_rng = None
        last_push = time.perf_counter()
        world_size = distributed_world_size()  # images/s counts every rank's images
        for batches in zip(*loaders):
            if searching and self.step.energy_weight > 0 and (self._epoch_step == 0 or self.step.op_costs is None):
                # Firing rates change as the weights train: the costs are measured anew each search epoch.
                self.step.measure_op_costs(batches[1])
            progress = self.schedule.search_progress(entry.epoch_in_phase, self._epoch_step, steps_per_epoch)
            self.temperature = self.schedule.temperature(entry.phase, progress)
            entropy_weight = self.schedule.entropy_weight(progress) if searching else 0.0
            beta_decay_weight = self.schedule.beta_decay_weight(progress) if searching else 0.0
            last_step = self._epoch_step == steps_per_epoch - 1
            if last_step:  # the firing rates that on_epoch_end reads (module docstring)
                set_firing_rate_recording(self.supernet, True)
            # The next step's ops are drawn during this one (not across an epoch's end: evolution and
            # pruning come between epochs), so the host never waits for the GPU to drain.
            next_temperature = None if last_step else self.schedule.temperature(
                entry.phase, self.schedule.search_progress(entry.epoch_in_phase, self._epoch_step + 1, steps_per_epoch)
            )
            scalars = self.train_step(
                batches[0], batches[1] if searching else None,
                temperature=self.temperature, entropy_weight=entropy_weight, next_temperature=next_temperature,
                beta_decay_weight=beta_decay_weight,
            )
            if last_step:
                set_firing_rate_recording(self.supernet, False)
            now = time.perf_counter()
            images = sum(len(batch[1]) for batch in batches) * world_size
            self._metrics.push(
                {
                    "cycle": entry.cycle, "phase": entry.phase.value, "epoch": entry.epoch,
                    "epoch_in_phase": entry.epoch_in_phase, "step": self._epoch_step, "global_step": self._global_step,
                    "lr": self.weights_optimizer.param_groups[0]["lr"], "temperature": self.temperature,
                    "entropy_weight": entropy_weight, "beta_decay_weight": beta_decay_weight, "images": images,
                    "images_per_second": images / max(now - last_push, 1e-9),
                },
                scalars,
            )
            last_push = now
            self._epoch_step += 1
            self._global_step += 1
            self._deliver(on_step, wait=False)
            if should_stop():
                self._deliver(on_step, wait=True)
                return False
        self._deliver(on_step, wait=True)
        return True

    def _end_epoch(self, entry: PlanEntry, on_epoch_end: Callable[[ASOSEEngine, dict[str, Any]], None] | None) -> None:
        self.step.draws.undo()  # none is started across an epoch's end; this keeps it so for any caller
        if self.weights_scheduler is not None:
            self.weights_scheduler.step()
        if entry.phase is Phase.SEARCH and self.evolution.prune_threshold > 0:
            for kind in CELL_TYPES:
                track_weak_ops(self.supernet.arch[kind], self.evolution.prune_threshold)
        logits = self._stacked_logits()
        totals = dict(self._epoch_totals)
        steps, images = totals.pop("steps", 0.0), totals.pop("images", 0.0)
        seconds = time.perf_counter() - self._epoch_started
        info = {
            "cycle": entry.cycle, "phase": entry.phase.value, "epoch": entry.epoch,
            "epoch_in_phase": entry.epoch_in_phase, "steps": int(steps), "seconds": seconds,
            "images_per_second": images / max(seconds, 1e-9),
            "lr": self.weights_optimizer.param_groups[0]["lr"], "temperature": self.temperature,
            "entropy": float(mean_entropy(logits)),
            "arch_kl": float(fast_math.kl_divergence(logits, self._epoch_start_logits).mean()),
            **{name: total / max(steps, 1.0) for name, total in totals.items()},
        }
        self._position += 1
        self._epoch_step = 0
        self._epoch_totals = {}
        self._epoch_start_logits = logits
        self._epoch_started = time.perf_counter()
        if on_epoch_end is not None:
            on_epoch_end(self, info)

    def _deliver(self, on_step: Callable[[dict[str, Any]], None] | None, *, wait: bool) -> None:
        """Hands the landed step metrics out; raises TrainingDiverged on a NaN/Inf loss."""
        for metrics in self._metrics.drain(wait=wait):
            for name in ("loss", "arch_loss"):
                if name in metrics and not math.isfinite(metrics[name]):
                    raise TrainingDiverged(non_finite_message(metrics, name))
            totals = self._epoch_totals
            totals["steps"] = totals.get("steps", 0.0) + 1
            for name in ("images", "loss", "accuracy", "arch_loss", "arch_accuracy", "energy_uj"):
                if name in metrics:
                    totals[name] = totals.get(name, 0.0) + metrics[name]
            if on_step is not None:
                on_step(metrics)

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
            self._grow(cycle)
        structure = self.supernet.structure
        logger.info("cycle %d: genotype %s; pruned %d ops; supernet %s", cycle, genotype, pruned, structure)
        return CycleResult(cycle, genotype, structure, pruned)

    def _grow(self, cycle: int) -> None:
        structure, evolution = self.supernet.structure, self.evolution
        new_cells = evolution.grow_cells
        if evolution.max_cells is not None:
            new_cells = max(0, min(new_cells, evolution.max_cells - len(structure.cells)))
        width_factor = evolution.width_factor
        if evolution.max_channels is not None and structure.channels * width_factor > evolution.max_channels:
            width_factor = 1
        if new_cells == 0 and width_factor == 1:
            return
        old_net, old_optimizers = self.supernet, (self.weights_optimizer, self.arch_optimizer)
        old_scheduler = self.weights_scheduler
        # Seeded by (seed, cycle): a resumed search grows exactly the same supernet.
        seed = self.seed + 7919 * (cycle + 1)
        grown, old_name = grow_supernet(old_net, new_cells=new_cells, width_factor=width_factor, seed=seed)
        self._use_supernet(grown)
        if old_scheduler is not None:
            self.weights_scheduler.load_state_dict(old_scheduler.state_dict())
        for old, new in zip(old_optimizers, (self.weights_optimizer, self.arch_optimizer)):
            rebind_optimizer(old, new, old_net, grown, old_name, width_factor)
        old_net.use_op_graphs(False)  # its graphs' pools become free for the grown supernet's captures

    # ----------------------------------------------------------------------------- helpers
    def _graph_ops_apply(self, supernet: SearchNetwork) -> bool:
        """Whether graph_ops can act here; if not, says why once (the ops run eagerly, with the same results)."""
        reason = ("the device is not CUDA" if self.device.type != "cuda" else
                  "recomputed cells run ops again in backward" if supernet.recompute else None)
        if reason is not None:
            logger.warning("search.graph_ops=true has no effect here (%s): the ops run eagerly", reason)
        return reason is None

    def _use_supernet(self, supernet: SearchNetwork) -> None:
        """Makes ``supernet`` the searched one, with fresh optimizers (and scheduler) over it."""
        supernet = supernet.to(memory_format=self.memory_format)  # keeps the Parameter objects
        supernet.use_op_graphs(self.graph_ops)
        set_firing_rate_recording(supernet, False)  # on for each epoch's last step only
        weights_optimizer = self._make_weights_optimizer(list(supernet.weight_parameters()))
        self.step.bind(supernet, weights_optimizer, self._make_arch_optimizer(supernet.arch_parameters()))
        self.weights_scheduler = (
            None if self._make_weights_scheduler is None else self._make_weights_scheduler(weights_optimizer)
        )

    def _stacked_logits(self) -> Tensor:
        with torch.no_grad():
            return self.supernet.arch_logits()

    # ----------------------------------------------------------------------------- for logging
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
            "structure": self.supernet.structure.to_dict(),
            "supernet": self.supernet.state_dict(),
            "weights_optimizer": self.weights_optimizer.state_dict(),
            "arch_optimizer": self.arch_optimizer.state_dict(),
            "weights_scheduler": None if self.weights_scheduler is None else self.weights_scheduler.state_dict(),
            "position": self._position,
            "step": self._epoch_step,
            "global_step": self._global_step,
            "epoch_totals": dict(self._epoch_totals),
            "epoch_start_logits": self._epoch_start_logits.cpu(),
            "genotypes": [genotype.to_json() for genotype in self.genotypes],
            "rng": capture_rng_state(),
            "gumbel_rng": self.step.draws.generator_state(),
            "gumbel_rng_device": self.step.draws.generator.device.type,
            "op_costs": None if self.step.op_costs is None else self.step.op_costs.cpu(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a ``state_dict()``; the global RNGs are set when ``run`` reaches the saved step."""
        if state.get("version") != STATE_VERSION:
            raise UserInputError(
                f"engine state version {state.get('version')}, expected {STATE_VERSION}; start a new search"
            )
        # A field added to the schedule since the checkpoint was written: its default (off) is what that search ran.
        saved = {field.name: field.default for field in fields(SearchSchedule) if field.default is not MISSING}
        saved.update(state["schedule"])
        if saved != asdict(self.schedule):
            raise UserInputError(
                f"the checkpoint's search schedule {state['schedule']} differs from this run's "
                f"{asdict(self.schedule)}; "
                "resume with the same search.schedule"
            )
        # A generator's state fits only its device type's generator: a search moves between machines of one kind.
        written_on, here = state.get("gumbel_rng_device"), self.step.draws.generator.device.type
        if written_on is not None and written_on != here:
            raise UserInputError(f"the checkpoint was written by a search on {written_on} and this run is on {here}; "
                                 f"resume it on {written_on} (trainer.device={written_on})")
        structure = SupernetStructure.from_dict(state["structure"])
        if structure != self.supernet.structure:
            self._use_supernet(self.supernet.with_structure(structure))
        self.supernet.load_state_dict(state["supernet"])
        self.weights_optimizer.load_state_dict(state["weights_optimizer"])
        self.arch_optimizer.load_state_dict(state["arch_optimizer"])
        if self.weights_scheduler is not None:
            self.weights_scheduler.load_state_dict(state["weights_scheduler"])
        self._position, self._epoch_step, self._global_step = state["position"], state["step"], state["global_step"]
        self._epoch_totals = dict(state["epoch_totals"])
        self._epoch_start_logits = state["epoch_start_logits"].to(self.device)
        self.genotypes = [Genotype.from_json(text) for text in state["genotypes"]]
        try:
            self.step.draws.restore(state["gumbel_rng"])
        except RuntimeError as err:  # checkpoints from before the device was saved
            raise UserInputError(f"the checkpoint's Gumbel generator state does not fit this run's {here} generator "
                                 "(a search written on another device type?); resume it on the device type that "
                                 "wrote it (trainer.device)") from err
        self._pending_rng = state["rng"]
        costs = state.get("op_costs")  # absent in checkpoints from before the energy-aware loss
        self.step.op_costs = None if costs is None else costs.to(self.device)


def build_engine(
    *, supernet: Callable[..., SearchNetwork], schedule: SearchSchedule, sampling: SamplingConfig,
    evolution: EvolutionConfig, second_order: bool, grad_clip: float | None, search_space: Any,
    neuron: Callable[[], nn.Module], num_classes: int, in_channels: int, optim: dict[str, Any],
    device: str | torch.device = "cpu", precision: Precision = "fp32", seed: int = 0, energy_weight: float = 0.0,
    channels_last: bool = False, graph_ops: bool = False,
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
        channels_last=channels_last, graph_ops=graph_ops,
    )
