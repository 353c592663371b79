"""What search.py does at the engine's callbacks: progress, TensorBoard, checkpoints, genotypes.

The engine (``aso_se.search.engine.ASOSEEngine``) calls ``on_step`` after every step with host-side
scalars, ``on_epoch_end`` once an epoch's state is final and ``on_cycle_end`` when a cycle's
genotype is derived. Here they become a progress bar and an epoch log line, TensorBoard
scalars and images, ``checkpoints/last.pt`` at every ``trainer.checkpoint_every_n_epochs``-th epoch's end
(and mid-epoch when ``trainer.checkpoint_every_min`` has passed), ``genotypes/cycle_<k>.json`` and the α it was
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
from aso_se.search.engine import ASOSEEngine, CycleResult
from aso_se.search.strength import JudgingStopped, cells_record, derive_by_strength
from kernels.sparse_conv import PATH_COUNTS
from search_space.genotypes import Genotype
from search_space.neurons import firing_rates

log = logging.getLogger(__name__)

STRENGTH_PATHS = "strength_paths.pt"  # in checkpoints/: the paths derive=strength has judged so far

# Per-step scalars of the engine that go to TensorBoard (the rest are positions and counters).
_STEP_SCALARS = ("loss", "accuracy", "arch_loss", "arch_accuracy", "lr", "temperature",
                 "entropy", "entropy_weight", "beta_decay", "beta_decay_weight", "energy_uj", "images_per_second")
# Per-epoch figures of the engine shown in the epoch's log line.
_EPOCH_SUMMARY = ("loss", "accuracy", "arch_loss", "arch_accuracy", "images_per_second", "lr",
                  "temperature", "entropy", "arch_kl", "energy_uj", "seconds")


class SearchCallbacks:
    """The engine's callbacks for one search run (see the module docstring).

    ``engine``: the engine whose state a timed checkpoint saves; None: the one handed to the
    first ``on_epoch_end`` (no timed checkpoint before it). A timed checkpoint is taken in
    ``on_step``: its training state is exact, but on a GPU its epoch totals lack the step or two
    whose scalars are still on their way to the host (only that epoch's logged means).
    """

    def __init__(self, run: Run, board: TensorBoardLogger | None, *, steps_per_epoch: int,
                 log_every_n_steps: int, engine: ASOSEEngine | None = None) -> None:
        self.run = run
        self.board = board
        self.engine = engine
        self.steps_per_epoch = steps_per_epoch
        self.log_every = max(1, log_every_n_steps)
        self.progress = EpochProgress(enabled=run.ctx.is_main)
        self._epoch_key: tuple[int, str, int] | None = None
        if run.resumed and run.ctx.is_main and engine is not None:
            log.info("resumed at global step %d, α %s", engine.progress["global_step"],
                     alpha_digest(engine.supernet.state_dict()))

    def on_step(self, metrics: dict[str, Any]) -> None:
        key = (metrics["cycle"], metrics["phase"], metrics["epoch"])
        if key != self._epoch_key:
            self._epoch_key = key
            self.progress.start_epoch(_epoch_title(metrics), total=self.steps_per_epoch,
                                      done=metrics["step"])
        scalars = {name: metrics[name] for name in _STEP_SCALARS if name in metrics}
        self.progress.advance(1, {k: scalars[k] for k in ("loss", "accuracy") if k in scalars})
        if self.board is not None and (metrics["global_step"] + 1) % self.log_every == 0:
            self.board.scalars("search", scalars, metrics["global_step"])
        last_step = metrics["step"] + 1 >= self.steps_per_epoch  # the epoch's end saves anyway
        if self.engine is not None and not last_step and self.run.checkpoint_due():
            self.save(self.engine)  # the state a stop after this step saves: resumes at the next step

    def on_epoch_end(self, engine: ASOSEEngine, info: dict[str, Any]) -> None:
        started = time.perf_counter()
        if self.engine is None:
            self.engine = engine
        self._epoch_key = None
        summary = {k: info[k] for k in _EPOCH_SUMMARY if k in info}
        if engine.device.type == "cuda":
            summary["gpu_memory_gib"] = torch.cuda.max_memory_allocated(engine.device) / 2**30
            # What the process holds, graph pools included; the allocated peak can stay far below it (RESULTS.md).
            summary["gpu_reserved_gib"] = torch.cuda.max_memory_reserved(engine.device) / 2**30
        graphs = engine.supernet.op_graphs
        if graphs is not None:  # op graph pairs so far, failed captures, cache releases before captures
            summary.update(graphs_captured=graphs.captured, graphs_failed=graphs.failed,
                           graph_cache_releases=graphs.cache_releases)
        self.progress.end_epoch(_epoch_title(info), summary)
        paths = PATH_COUNTS.snapshot_and_reset()  # the sparse-conv dispatcher's calls of this epoch
        if self.board is not None:
            step = engine.progress["global_step"]
            self.board.scalars("search_epoch", summary, step)
            if self.board.alpha_figure_due(info["epoch"]):
                self.board.alphas(engine.alpha_probabilities(), engine.primitives, step)
            rates = firing_rates(engine.supernet)  # each neuron as of the last step that ran it
            if rates:  # one host transfer for all neurons
                values = torch.stack([rate.float() for rate in rates.values()]).tolist()
                self.board.firing_rates(dict(zip(rates, values)), step)
            self.board.sparse_conv_paths(paths, step)
        if self.run.epoch_checkpoint_due(info["epoch"] + 1):  # info's epoch counts from 0
            self.save(engine, background=True)
        if self.board is not None:  # what every rank waits for at an epoch's end (RESULTS.md "Several GPUs")
            self.board.scalars("search_epoch", {"end_seconds": time.perf_counter() - started},
                               engine.progress["global_step"])
            self.board.flush()

    def on_cycle_end(self, engine: ASOSEEngine, result: CycleResult) -> None:
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

    def save(self, engine: ASOSEEngine, *, background: bool = False) -> None:
        """``checkpoints/last.pt``: the engine's whole state (rank 0); never NaN/Inf weights (every rank
        checks, so all stop together). ``background``: written while the search goes on (`Run.save`)."""
        state = engine.state_dict()  # once: thousands of tensors (the checked parts are in it)
        bad = first_non_finite({"supernet": state["supernet"],
                                "weights_optimizer": state["weights_optimizer"]["state"],
                                "arch_optimizer": state["arch_optimizer"]["state"]})
        if bad is not None:
            raise non_finite_weights(bad, engine.progress["global_step"], lower="the learning rate (optim)")
        self.run.save({"engine": state}, background=background)

    def derive_by_strength(self, alpha_genotype: Genotype, engine: ASOSEEngine, arch_loader: Any) -> Genotype:
        """``derive=strength``: the final cell from each op's accuracy on the first ``derive_images`` images (null:
        all) of α's split (``aso_se.search.strength``); rank 0 judges (its shard of the split under DDP) and writes the
        table and both cells to ``strength.json``."""
        cfg, ctx = self.run.cfg, self.run.ctx
        if not ctx.is_main:  # only rank 0 writes the genotype
            return alpha_genotype
        evolution, paths_file = engine.evolution, self.run.run_dir / "checkpoints" / STRENGTH_PATHS
        judging = {"images": cfg.derive_images, "batch_size": cfg.batch_size, "seed": cfg.seed,
                   "global_step": engine.progress["global_step"]}
        judged, seconds_before = self._judged_paths(paths_file, judging)
        started = time.perf_counter()

        def keep(kind: str | None = None, edge: int = 0, edges: int = 0) -> None:
            seconds = seconds_before + time.perf_counter() - started
            self.run.save({"paths": judged, "judging": judging, "seconds": seconds}, paths_file)
            if kind is not None:
                log.info("derive=strength: %s edge %d of %d judged (%d paths, %.0f s)", kind, edge + 1, edges,
                         len(judged), seconds)

        try:
            genotype, table = derive_by_strength(
                engine.supernet, arch_loader, images=cfg.derive_images, batch_size=cfg.batch_size, seed=cfg.seed,
                device=ctx.device, max_skip_connect=evolution.max_skip_connect,
                max_parameter_free=evolution.max_parameter_free, max_normal_pools=evolution.max_normal_pools,
                judged=judged,
                should_stop=self.run.stop_requested, on_edge=keep)
        except JudgingStopped:
            keep()  # the paths judged since the last edge's end too
            self.run.raise_if_stopped()
            raise
        table["judging_seconds"] = seconds_before + time.perf_counter() - started
        save_json({**table, **cells_record(alpha_genotype, genotype)}, self.run.run_dir / "strength.json")
        decided = table["decided_edges"]
        log.info("derive=strength on %d images of α's split in %.0f s (base path %.4f; the strongest op leads by 2 SE "
                 "on %d of %d normal and %d of %d reduction edges): %s (α's cell: %s)", table["images"],
                 table["judging_seconds"], table["base_accuracy"], decided["normal"], len(table["lead"]["normal"]),
                 decided["reduce"], len(table["lead"]["reduce"]), genotype, alpha_genotype)
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

    def finish(self, genotype: Genotype, engine: ASOSEEngine) -> None:
        """The final ``genotype.json`` (what ``train.py`` picks up by default) and ``search_metrics.json``: what the
        run cost and how decided its α ended, so that a run dir without its checkpoints still tells both."""
        if self.run.ctx.is_main:
            save_json({"genotype": _genotype_json(genotype), "wall_time_s": self.run.wall_time_s,
                       "cpu_time_s": self.run.cpu_time_s, "world_size": self.run.ctx.world_size,
                       "device": str(self.run.ctx.device), "precision": self.run.cfg.trainer.precision,
                       "alpha_entropy": engine.entropy(), "derive": self.run.cfg.get("derive", "alpha")},
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
