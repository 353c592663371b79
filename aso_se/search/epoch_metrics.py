"""The search's step metrics and epoch sums: what the engine hands to ``on_log`` and ``on_epoch_end``.

A step's scalars stay on the device and reach the host a step or two later (``AsyncStepMetrics``), so logging
every step never stalls the GPU. As they land they are checked for a NaN/Inf loss, added to the epoch's sums and
handed out. At an epoch's end the sums become the epoch's means, beside its throughput, α's entropy and how far α
moved over the epoch (``arch_kl``).
"""
from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import Tensor

from aso_se.errors import TrainingDiverged
from aso_se.loop import LoopCallbacks
from aso_se.monitor.step_metrics import AsyncStepMetrics
from aso_se.search import fast_math
from aso_se.search.schedule import PlanEntry, StepKnobs
from aso_se.search.step import mean_entropy

# The step metrics whose epoch means the epoch's summary reports.
SUMMED = ("images", "loss", "accuracy", "arch_loss", "arch_accuracy", "energy_uj", "latency_steps")


def non_finite_message(metrics: dict[str, Any], name: str) -> str:
    """Where a loss became NaN/Inf, and what to lower."""
    return (f"{name} is {metrics[name]} at cycle {metrics['cycle']}, {metrics['phase']} epoch {metrics['epoch']}, "
            f"step {metrics['step']}: lower the learning rate (optim) or the entropy weight, "
            "or use trainer.precision=fp32")


def position(entry: PlanEntry) -> dict[str, Any]:
    """Where in the plan an epoch is, as the metrics name it."""
    return {"cycle": entry.cycle, "phase": entry.phase.value, "epoch": entry.epoch,
            "epoch_in_phase": entry.epoch_in_phase}


class EpochMetrics:
    """The step metrics on their way to the host and the running epoch's sums (see the module docstring).

    A step's metrics: cycle, phase, epoch, epoch_in_phase, step, global_step, lr, temperature, entropy_weight,
    beta_decay_weight, images, images_per_second, loss, accuracy, entropy (nats), and arch_loss, arch_accuracy (and
    beta_decay when its weight is positive, energy_uj and latency_steps when their terms are on) in the search phase.
    An epoch's summary: its position, steps, seconds, images_per_second, lr, temperature, entropy, arch_kl and the
    epoch means of the summed metrics. ``start_logits``: α's logits as the running epoch began (``arch_kl``'s
    reference).
    """

    def __init__(self, start_logits: Tensor) -> None:
        self._in_flight = AsyncStepMetrics()
        self._sums: dict[str, float] = {}
        self._start_logits = start_logits
        self._epoch_started = time.perf_counter()
        self._last_push = time.perf_counter()

    def start_piece(self) -> None:
        """An epoch starts, or goes on after a resume: images/s counts from here."""
        self._last_push = time.perf_counter()

    def push(self, entry: PlanEntry, step: int, global_step: int, lr: float, knobs: StepKnobs,
             scalars: dict[str, Tensor], images: int) -> None:
        """A step just taken: where it was, its knobs and ``images`` (every rank's), and its device ``scalars``."""
        now = time.perf_counter()
        self._in_flight.push(
            {
                **position(entry), "step": step, "global_step": global_step, "lr": lr,
                "temperature": knobs.temperature, "entropy_weight": knobs.entropy_weight,
                "beta_decay_weight": knobs.beta_decay_weight, "images": images,
                "images_per_second": images / max(now - self._last_push, 1e-9),
            },
            scalars,
        )
        self._last_push = now

    def deliver(self, callbacks: LoopCallbacks, *, wait: bool) -> None:
        """Hands the landed step metrics to ``callbacks.on_log`` (all of them with ``wait``); raises TrainingDiverged
        on a NaN/Inf loss."""
        for metrics in self._in_flight.drain(wait=wait):
            for name in ("loss", "arch_loss"):
                if name in metrics and not math.isfinite(metrics[name]):
                    raise TrainingDiverged(non_finite_message(metrics, name))
            sums = self._sums
            sums["steps"] = sums.get("steps", 0.0) + 1
            for name in SUMMED:
                if name in metrics:
                    sums[name] = sums.get(name, 0.0) + metrics[name]
            callbacks.on_log(metrics, metrics["global_step"])

    def end_epoch(self, entry: PlanEntry, *, lr: float, temperature: float, logits: Tensor) -> dict[str, Any]:
        """The ended epoch's summary (α's ``logits`` at its end); the sums start anew."""
        sums = dict(self._sums)
        steps, images = sums.pop("steps", 0.0), sums.pop("images", 0.0)
        seconds = time.perf_counter() - self._epoch_started
        summary = {
            **position(entry), "steps": int(steps), "seconds": seconds,
            "images_per_second": images / max(seconds, 1e-9), "lr": lr, "temperature": temperature,
            "entropy": float(mean_entropy(logits)),
            "arch_kl": float(fast_math.kl_divergence(logits, self._start_logits).mean()),
            **{name: total / max(steps, 1.0) for name, total in sums.items()},
        }
        self._sums = {}
        self._start_logits = logits
        self._epoch_started = time.perf_counter()
        return summary

    def state_dict(self) -> dict[str, Any]:
        return {"epoch_totals": dict(self._sums), "epoch_start_logits": self._start_logits.cpu()}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self._sums = dict(state["epoch_totals"])
        self._start_logits = state["epoch_start_logits"].to(device)
