"""What search.py does at the engine's callbacks: progress, TensorBoard, checkpoints, genotypes.

The engine (``aso_se.search.engine.ASOSEEngine``) calls ``on_log`` after every step with host-side
scalars, ``on_epoch_end`` once an epoch's state is final, ``on_cycle_end`` when a cycle's
genotype is derived, and ``save_checkpoint`` mid-epoch when ``checkpoint_due``. Here they become a progress bar and
an epoch log line, TensorBoard scalars and images, ``checkpoints/last.pt`` where the run's checkpoint policy says
(``aso_se.run.checkpoint_policy``), ``genotypes/cycle_<k>.json`` and the α it was
derived from, ``alphas/cycle_<k>.json`` (another derivation rule needs no new search: ``benchmarks/derive_cell.py``);
at the end ``genotype.json`` and ``search_metrics.json`` (and ``strength.json`` with ``derive=strength``, whose
judged paths ``checkpoints/strength_paths.pt`` keeps edge by edge for a resume). Only rank 0 writes; every rank
keeps the same bookkeeping.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from aso_se.monitor.progress import EpochProgress
from aso_se.monitor.tensorboard import TensorBoardLogger
from aso_se.run.atomic_write import save_json
from aso_se.run.checkpoint import CheckpointError, load_checkpoint
from aso_se.run.errors import non_finite_weights
from aso_se.run.lifecycle import Run
from aso_se.run.tensor_checks import first_non_finite, tensor_digest
from aso_se.search.engine import ASOSEEngine, SearchLoopCallbacks
from aso_se.search.evolution import CycleResult
from aso_se.search.strength import JudgingStopped, final_cell_by_strength, judging_key
from kernels.sparse_conv import PATH_COUNTS
from search_space.genotypes import Genotype
from search_space.neurons import firing_rates

log = logging.getLogger(__name__)

STRENGTH_PATHS = "strength_paths.pt"  # in checkpoints/: the paths derive=strength has judged so far

# Per-step scalars of the engine that go to TensorBoard (the rest are positions and counters).
_STEP_SCALARS = ("loss", "accuracy", "arch_loss", "arch_accuracy", "lr", "temperature",
                 "entropy", "entropy_weight", "beta_decay", "beta_decay_weight", "energy_uj", "latency_steps",
                 "images_per_second")
# Per-epoch figures of the engine shown in the epoch's log line.
_EPOCH_SUMMARY = ("loss", "accuracy", "arch_loss", "arch_accuracy", "images_per_second", "lr",
                  "temperature", "entropy", "arch_kl", "energy_uj", "latency_steps", "seconds")


class SearchCallbacks(SearchLoopCallbacks):
    """The engine's callbacks for one search run (see the module docstring).

    A timed checkpoint's training state is exact, but on a GPU its epoch totals lack the step or two whose
    scalars are still on their way to the host (only that epoch's logged means).
    """

    def __init__(self, run: Run, board: TensorBoardLogger | None, *, engine: ASOSEEngine, steps_per_epoch: int,
                 log_every_n_steps: int) -> None:
        self.run = run
        self.board = board
        self.engine = engine
        self.steps_per_epoch = steps_per_epoch
        self.log_every = max(1, log_every_n_steps)
        self.progress = EpochProgress(enabled=run.ctx.is_main)
        self._epoch_key: tuple[int, str, int] | None = None
        if run.resumed and run.ctx.is_main:
            log.info("resumed at global step %d, α %s", engine.progress["global_step"],
                     alpha_digest(engine.supernet.state_dict()))

    def on_log(self, scalars: dict[str, Any], step: int) -> None:
        key = (scalars["cycle"], scalars["phase"], scalars["epoch"])
        if key != self._epoch_key:
            self._epoch_key = key
            self.progress.start_epoch(_epoch_title(scalars), total=self.steps_per_epoch, done=scalars["step"])
        logged = {name: scalars[name] for name in _STEP_SCALARS if name in scalars}
        self.progress.advance(1, {k: logged[k] for k in ("loss", "accuracy") if k in logged})
        if self.board is not None and (step + 1) % self.log_every == 0:
            self.board.scalars("search", logged, step)

    def checkpoint_due(self) -> bool:
        return self.run.checkpoints.timed_due()

    def save_checkpoint(self) -> None:
        self.save()  # the state a stop after this step saves: resumes at the next step

    def on_epoch_end(self, summary: dict[str, Any]) -> None:
        started = time.perf_counter()
        engine = self.engine
        self._epoch_key = None
        shown = {k: summary[k] for k in _EPOCH_SUMMARY if k in summary}
        if engine.device.type == "cuda":
            shown["gpu_memory_gib"] = torch.cuda.max_memory_allocated(engine.device) / 2**30
            # What the process holds, graph pools included; the allocated peak can stay far below it (RESULTS.md).
            shown["gpu_reserved_gib"] = torch.cuda.max_memory_reserved(engine.device) / 2**30
        graphs = engine.supernet.op_graphs
        if graphs is not None:  # op graph pairs so far, failed captures, cache releases before captures
            shown.update(graphs_captured=graphs.captured, graphs_failed=graphs.failed,
                         graph_cache_releases=graphs.cache_releases)
        self.progress.end_epoch(_epoch_title(summary), shown)
        paths = PATH_COUNTS.snapshot_and_reset()  # the sparse-conv dispatcher's calls of this epoch
        if self.board is not None:
            step = engine.progress["global_step"]
            self.board.scalars("search_epoch", shown, step)
            if self.board.alpha_figure_due(summary["epoch"]):
                self.board.alphas(engine.alpha_probabilities(), engine.primitives, step)
            rates = firing_rates(engine.supernet)  # each neuron as of the last step that ran it
            if rates:  # one host transfer for all neurons
                values = torch.stack([rate.float() for rate in rates.values()]).tolist()
                self.board.firing_rates(dict(zip(rates, values)), step)
            self.board.sparse_conv_paths(paths, step)
        if self.run.checkpoints.epoch_due(summary["epoch"] + 1):  # the summary's epoch counts from 0
            self.save(background=True)
        if self.board is not None:  # what every rank waits for at an epoch's end (RESULTS.md "Several GPUs")
            self.board.scalars("search_epoch", {"end_seconds": time.perf_counter() - started},
                               engine.progress["global_step"])
            self.board.flush()

    def on_cycle_end(self, result: CycleResult) -> None:
        engine = self.engine
        if self.run.ctx.is_main:
            save_json(_genotype_json(result.genotype),
                      self.run.run_dir / "genotypes" / f"cycle_{result.cycle}.json")
            save_json(alpha_json(engine), self.run.run_dir / "alphas" / f"cycle_{result.cycle}.json")
        if self.board is not None:  # the cycle's final α, whatever alpha_figure_every_n_epochs skipped
            self.board.alphas(engine.alpha_probabilities(), engine.primitives, engine.progress["global_step"])
            self.board.genotype(result.genotype, engine.progress["global_step"])
            self.board.scalars("evolution", {"cells": float(len(result.structure.cells)),
                                             "channels": float(result.structure.channels),
                                             "pruned_ops": float(result.pruned_ops)},
                               engine.progress["global_step"])

    def save(self, *, background: bool = False) -> None:
        """``checkpoints/last.pt``: the engine's whole state (rank 0); never NaN/Inf weights (every rank
        checks, so all stop together). ``background``: written while the search goes on (`Run.save`)."""
        engine = self.engine
        state = engine.state_dict()  # once: thousands of tensors (the checked parts are in it)
        bad = first_non_finite({"supernet": state["supernet"],
                                "weights_optimizer": state["weights_optimizer"]["state"],
                                "arch_optimizer": state["arch_optimizer"]["state"]})
        if bad is not None:
            raise non_finite_weights(bad, engine.progress["global_step"], lower="the learning rate (optim)")
        self.run.save({"engine": state}, background=background)

    def derive_by_strength(self, alpha_genotype: Genotype, arch_loader: Any) -> Genotype:
        """``derive=strength``: the final cell from each op's accuracy on the first ``derive_images`` images (null:
        all) of α's split (``aso_se.search.strength.final_cell_by_strength``); rank 0 judges (its shard of the split
        under DDP), keeps the judged paths for a resume and writes the table and both cells to ``strength.json``."""
        cfg, run = self.run.cfg, self.run
        if not run.ctx.is_main:  # only rank 0 writes the genotype
            return alpha_genotype
        paths_file = run.run_dir / "checkpoints" / STRENGTH_PATHS
        judged, seconds_before = self._judged_paths(
            paths_file, judging_key(self.engine, images=cfg.derive_images, batch_size=cfg.batch_size, seed=cfg.seed))
        try:
            genotype, record = final_cell_by_strength(
                self.engine, arch_loader, images=cfg.derive_images, batch_size=cfg.batch_size, seed=cfg.seed,
                judged=judged, seconds_before=seconds_before, keep=lambda state: run.save(state, paths_file),
                should_stop=run.stop_requested)
        except JudgingStopped:
            run.raise_if_stopped()
            raise
        save_json(record, run.run_dir / "strength.json")
        return genotype

    @staticmethod
    def _judged_paths(path: Path, judging: dict) -> tuple[dict[str, torch.Tensor], float]:
        """The paths a stopped judging of this search kept, and the seconds it spent; none for another judging
        (other images, batches or weights) or an unreadable file, which the next save replaces."""
        if not path.is_file():
            return {}, 0.0
        try:
            saved = load_checkpoint(path, kind="search")
        except CheckpointError as err:
            log.warning("%s; derive=strength judges every path again", err)
            return {}, 0.0
        if saved.get("judging") != judging:
            log.warning("%s holds a judging of %s, not of %s; derive=strength judges every path again", path,
                        saved.get("judging"), judging)
            return {}, 0.0
        log.info("derive=strength goes on from %d paths judged before the stop", len(saved["paths"]))
        return dict(saved["paths"]), float(saved["seconds"])

    def finish(self, genotype: Genotype) -> None:
        """The final ``genotype.json`` (what ``train.py`` picks up by default) and ``search_metrics.json``: what the
        run cost and how decided its α ended, so that a run dir without its checkpoints still tells both."""
        if self.run.ctx.is_main:
            save_json({"genotype": _genotype_json(genotype), "wall_time_s": self.run.wall_time_s,
                       "cpu_time_s": self.run.cpu_time_s, "world_size": self.run.ctx.world_size,
                       "device": str(self.run.ctx.device), "precision": self.run.cfg.trainer.precision,
                       "alpha_entropy": self.engine.entropy(), "derive": self.run.cfg.get("derive", "alpha")},
                      self.run.run_dir / "search_metrics.json")
            save_json(_genotype_json(genotype), self.run.run_dir / "genotype.json")
        if self.board is not None:
            self.board.close()


def alpha_digest(supernet_state: dict[str, torch.Tensor]) -> str:
    """`tensor_digest` of the architecture weights α in a supernet's state dict."""
    return tensor_digest({name: value for name, value in supernet_state.items()
                          if name.startswith("arch.") and name.endswith(".alpha")})


def alpha_json(engine: ASOSEEngine) -> dict[str, Any]:
    """softmax(α) per cell type (``[edges][ops]``, pruned ops 0) with what a derivation needs beside it."""
    space = engine.supernet.search_space
    return {"primitives": list(engine.primitives), "steps": space.steps, "multiplier": space.multiplier,
            **{kind: probs.tolist() for kind, probs in engine.alpha_probabilities().items()}}


def _epoch_title(position: dict[str, Any]) -> str:
    return f"cycle {position['cycle']} {position['phase']} (epoch {position['epoch'] + 1})"


def _genotype_json(genotype: Genotype) -> Any:
    """The object ``Genotype.from_json`` reads, to be written with indentation."""
    return json.loads(genotype.to_json())
