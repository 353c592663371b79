"""The ASO-SE cycle plan and the knob schedules (Gumbel temperature, entropy weight).

A search runs ``cycles`` cycles of four phases: ``warmup`` (weights trained, α frozen, ops still
sampled from α; cycle 0's may be longer: ``first_warmup_epochs``); ``search`` (α steps on split B
alternate with weight steps on split A, temperature annealed, entropy weight ramped); ``evolve``
(derive the genotype, prune weak ops, grow; no training); ``restabilize`` (weights trained, α frozen,
to settle the grown supernet). The last cycle ends after its ``evolve``: its genotype is the result,
and growing a supernet never trained again would be wasted.
"""
from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from enum import Enum
from typing import Any

from search_space.errors import UserInputError


class Phase(str, Enum):
    WARMUP = "warmup"
    SEARCH = "search"
    EVOLVE = "evolve"
    RESTABILIZE = "restabilize"


@dataclass(frozen=True)
class PlanEntry:
    """One unit of the plan: a training epoch of a phase, or a cycle's (instant) evolution."""

    cycle: int
    phase: Phase
    epoch_in_phase: int  # 0 for EVOLVE
    epoch: int  # training epochs before this entry: the data order and LR schedule index


@dataclass(frozen=True)
class StepKnobs:
    """The schedule's values for one training step."""

    temperature: float
    entropy_weight: float
    beta_decay_weight: float
    # The next step's temperature when it is in the same epoch, for its ops to be drawn during this step
    # (``aso_se.search.step.DrawAhead``); None at an epoch's last step: evolution and pruning come between epochs.
    next_temperature: float | None


@dataclass(frozen=True)
class SearchSchedule:
    """Cycles, phase lengths (epochs) and the annealed knobs of the search phase.

    The temperature decays exponentially from start to end within every cycle's search phase (each
    cycle explores, then commits); warm-up uses the start value, re-stabilization the end value. It
    sharpens the relaxed weights only: which ops are sampled follows ``softmax(α)``, so a hot start
    cannot turn the forward into an average of every op. The entropy weight ramps linearly over the
    same span; a positive weight pushes α towards a decision.
    """

    cycles: int = 2
    warmup_epochs: int = 2
    # Cycle 0's warm-up (None: warmup_epochs), the only one where α is still uniform and every op trains
    # as much: longer, it lets the convs catch up with pools and skips before α first moves (as PC-DARTS).
    first_warmup_epochs: int | None = None
    search_epochs: int = 1
    restabilize_epochs: int = 1
    temperature_start: float = 2.0
    temperature_end: float = 0.2
    entropy_weight_start: float = 0.0
    entropy_weight_end: float = 0.01
    # β-decay (β-DARTS): α loss += weight · mean edge logsumexp(α), ramped like the entropy weight; it keeps
    # α small and close so that no op runs away early (0: off).
    beta_decay_weight_start: float = 0.0
    beta_decay_weight_end: float = 0.0

    def __post_init__(self) -> None:
        if (self.cycles < 1 or self.search_epochs < 1
                or min(self.warmup_epochs, self.first_warmup, self.restabilize_epochs) < 0):
            raise UserInputError(
                f"search schedule cycles={self.cycles}, search_epochs={self.search_epochs}, warmup_epochs="
                f"{self.warmup_epochs}, first_warmup_epochs={self.first_warmup_epochs}, restabilize_epochs="
                f"{self.restabilize_epochs}: need cycles >= 1, search_epochs >= 1 and the others >= 0; fix "
                "search.schedule"
            )
        if min(self.beta_decay_weight_start, self.beta_decay_weight_end) < 0:
            raise UserInputError(
                f"search schedule β-decay weights {self.beta_decay_weight_start} -> {self.beta_decay_weight_end}: "
                "need both >= 0 (0: off); fix search.schedule.beta_decay_weight_*"
            )
        if not 0 < self.temperature_end <= self.temperature_start:
            raise UserInputError(
                f"search schedule temperatures {self.temperature_start} -> {self.temperature_end}: need "
                "0 < temperature_end <= temperature_start; fix search.schedule.temperature_*"
            )

    def check_resumable(self, saved: dict[str, Any]) -> None:
        """A checkpoint's schedule (``asdict``) must be this one: a resumed search goes on with the same plan."""
        # A field added to the schedule since the checkpoint was written: its default (off) is what that search ran.
        complete = {field.name: field.default for field in fields(SearchSchedule) if field.default is not MISSING}
        complete.update(saved)
        if complete != asdict(self):
            raise UserInputError(
                f"the checkpoint's search schedule {saved} differs from this run's {asdict(self)}; "
                "resume with the same search.schedule"
            )

    @property
    def first_warmup(self) -> int:
        """Cycle 0's warm-up epochs."""
        return self.warmup_epochs if self.first_warmup_epochs is None else self.first_warmup_epochs

    def plan(self) -> tuple[PlanEntry, ...]:
        entries: list[PlanEntry] = []
        epoch = 0
        for cycle in range(self.cycles):
            last = cycle == self.cycles - 1
            warmup = self.first_warmup if cycle == 0 else self.warmup_epochs
            phases = [(Phase.WARMUP, warmup), (Phase.SEARCH, self.search_epochs), (Phase.EVOLVE, 1)]
            if not last:
                phases.append((Phase.RESTABILIZE, self.restabilize_epochs))
            for phase, count in phases:
                for epoch_in_phase in range(count):
                    entries.append(PlanEntry(cycle, phase, epoch_in_phase, epoch))
                    epoch += phase is not Phase.EVOLVE
        return tuple(entries)

    @property
    def total_epochs(self) -> int:
        """Training epochs of the whole search: set the weights' LR schedule length (e.g. T_max) to this."""
        return sum(entry.phase is not Phase.EVOLVE for entry in self.plan())

    def search_progress(self, epoch_in_phase: int, step: int, steps_per_epoch: int) -> float:
        """Fraction in [0, 1) of the current search phase done before this step."""
        return (epoch_in_phase + step / max(steps_per_epoch, 1)) / self.search_epochs

    def temperature(self, phase: Phase, progress: float) -> float:
        if phase is Phase.WARMUP:
            return self.temperature_start
        if phase is Phase.SEARCH:
            return self.temperature_start * (self.temperature_end / self.temperature_start) ** progress
        return self.temperature_end

    def entropy_weight(self, progress: float) -> float:
        return self.entropy_weight_start + (self.entropy_weight_end - self.entropy_weight_start) * progress

    def beta_decay_weight(self, progress: float) -> float:
        return self.beta_decay_weight_start + (self.beta_decay_weight_end - self.beta_decay_weight_start) * progress

    def step_knobs(self, entry: PlanEntry, step: int, steps_per_epoch: int) -> StepKnobs:
        """The knobs of ``step`` of the epoch ``entry`` (``steps_per_epoch`` steps); α's knobs are 0 outside search."""
        searching = entry.phase is Phase.SEARCH
        progress = self.search_progress(entry.epoch_in_phase, step, steps_per_epoch)
        last_step = step == steps_per_epoch - 1
        next_progress = self.search_progress(entry.epoch_in_phase, step + 1, steps_per_epoch)
        return StepKnobs(
            temperature=self.temperature(entry.phase, progress),
            entropy_weight=self.entropy_weight(progress) if searching else 0.0,
            beta_decay_weight=self.beta_decay_weight(progress) if searching else 0.0,
            next_temperature=None if last_step else self.temperature(entry.phase, next_progress),
        )
