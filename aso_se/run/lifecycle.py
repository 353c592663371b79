"""One search or retrain run, from its config to its last checkpoint: `Run`, entered by the entry point.

On entry: the config to use (the saved one when resuming, aso_se.run.resume), the run directory, the
process group, seeds, and the handler of ``trainer.stop_signals`` (aso_se.run.stop_signals). During the
run: when to checkpoint (its `CheckpointPolicy`, aso_se.run.checkpoint_policy), the saves themselves (in the
background when asked), whether to stop. On exit: loader workers and the process group are shut down and an
expected failure (bad input, NaN/Inf, out of memory, a failed write, the stop) exits with its one line
(aso_se.run.errors).
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import resource
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from aso_se.data import loaders
from aso_se.monitor.tensorboard import TensorBoardLogger
from aso_se.parallel.distributed import (
    DistributedContext,
    any_rank,
    broadcast_from_main,
    init_distributed,
    is_peer_failure,
    shutdown_distributed,
)
from aso_se.run import errors
from aso_se.run.checkpoint import CheckpointWriter, restore_errors
from aso_se.run.checkpoint_policy import CheckpointPolicy
from aso_se.run.elastic_restart import name_run_for_elastic_restarts
from aso_se.run.guard import exit_at_once, exit_on_run_failure
from aso_se.run.paths import CHECKPOINT
from aso_se.run.resume import load_resumed
from aso_se.run.stop_signals import STUCK_RANK_GRACE_S, StopHandler, parse_stop_signals
from aso_se.run.trainer_settings import check_settings

log = logging.getLogger(__name__)


class Run:
    """Context of one search or retrain run (see the module docstring).

    The training loop polls `should_stop` after each step; once it is true the entry point saves and
    calls `raise_if_stopped`. ``checkpoints``, the run's one `CheckpointPolicy`, tells the loops' callbacks when
    to save.
    """

    def __init__(self, cfg: DictConfig, *, entry_point: str) -> None:
        self.entry_point = entry_point
        self.cfg = cfg
        self.state: dict[str, Any] | None = None  # the checkpoint being resumed
        self.ctx: DistributedContext | None = None
        # A resumed run's directory on every rank: torchrun's other ranks run Hydra in "." (see run_dir)
        # and would look for the checkpoint there before rank 0's directory is broadcast.
        resume = cfg.get("resume")
        self.run_dir = Path(resume) if resume else Path(HydraConfig.get().runtime.output_dir)
        self._stop = StopHandler(lambda signum: errors.quit_at_once(signum, self.run_dir, self.entry_point))
        self._started = time.perf_counter()
        self._cpu_started = _cpu_seconds()
        self._writer = CheckpointWriter()
        self.checkpoints = CheckpointPolicy()  # the run's own, from its trainer config, once it starts

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / CHECKPOINT

    @property
    def resumed(self) -> bool:
        return self.state is not None

    def __enter__(self) -> Run:
        try:
            self._handle_stop_signals()
            signum = self._stop.signalled_while_starting()
            if signum is not None:
                raise errors.StoppedBeforeStart(signum, self.run_dir, self.entry_point,
                                                resumed=bool(self.cfg.get("resume")))
            self._start()
        except BaseException as err:
            self.__exit__(type(err), err, err.__traceback__)
            raise
        return self

    def _handle_stop_signals(self) -> None:
        self._stop.install(parse_stop_signals(self.cfg.trainer.get("stop_signals", ["SIGINT", "SIGTERM"])))

    def _start(self) -> None:
        # The jobs of a multirun may share a process (Hydra's basic launcher): each counts only its own conv calls.
        from kernels.sparse_conv import PATH_COUNTS

        PATH_COUNTS.reset()
        if self.cfg.get("resume"):
            self.state, self.cfg = load_resumed(self.checkpoint_path, self.entry_point)
            self._handle_stop_signals()  # the resumed run's own setting
        settings = check_settings(self.cfg, self.entry_point)
        self.checkpoints = settings.checkpoints
        trainer = self.cfg.trainer
        self.ctx = init_distributed(ddp=trainer.ddp, device=trainer.device, peer_timeout_s=settings.peer_timeout_s)
        self.checkpoints.timed = self.ctx.is_main  # rank 0 alone writes checkpoints
        torch.backends.cudnn.benchmark = bool(trainer.get("cudnn_benchmark", False))
        self.run_dir = broadcast_from_main(self.run_dir, self.ctx)
        if self.ctx.is_main and not self.resumed:
            name_run_for_elastic_restarts(self.run_dir, self.entry_point)
        if self.ctx.distributed and "TORCHELASTIC_RUN_ID" in os.environ:
            self._stop.watch_for_stuck_ranks(
                lambda signum: errors.stuck_rank_line(self.ctx.rank, signum, STUCK_RANK_GRACE_S, self.run_dir),
                exit_code=errors.EXIT_PEER_LOST)
        seed_everything(self.cfg.seed)
        if not self.ctx.is_main:  # rank 0 reports progress; the others only warnings and errors
            logging.getLogger().setLevel(logging.WARNING)
        if self.ctx.is_main:
            log.info("%s run in %s (%s, %d process%s)%s", self.entry_point, self.run_dir,
                     self.ctx.device, self.ctx.world_size, "" if self.ctx.world_size == 1 else "es",
                     f", resumed from {self.checkpoint_path}" if self.resumed else "")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Restore the signal handlers, leave the process group, report an expected failure.

        Expected failures exit here, inside the task, with one line: Hydra would print a line
        of its own for an exception leaving the task. Bugs propagate with their traceback.
        """
        loaders.shutdown_workers()  # now, while torch still shuts them down cleanly
        write_error: Exception | None = None
        try:
            self._writer.wait()  # an epoch-end checkpoint still being written
        except Exception as err:  # reported below unless the run already failed otherwise
            write_error = err
        self._stop.restore()
        if self.ctx is not None and self.ctx.distributed and exc is not None and is_peer_failure(exc):
            self._exit_peer_lost(exc)
        if self.ctx is not None:
            shutdown_distributed(self.ctx)
        if exc is None:
            if write_error is None:
                return
            exc = write_error
        exit_on_run_failure(exc, self.run_dir, self.entry_point)
        if exc is write_error:  # a bug in the background write: its traceback, as for any bug
            raise write_error

    def _exit_peer_lost(self, err: BaseException) -> None:
        """One line and exit 6 at once: leaving the process group (or the interpreter) normally
        would wait on collectives that the lost rank never joins."""
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        with contextlib.suppress(Exception):
            self._writer.wait(timeout_s=60.0)  # the epoch-end checkpoint being written: a restart resumes from it
        exit_at_once(errors.peer_lost_line(self.ctx.rank, cause, self.run_dir, self.entry_point), errors.EXIT_PEER_LOST)

    def should_stop(self) -> bool:
        """Polled after every step; all ranks agree so they stop at the same step."""
        return any_rank(self._stop.step_ended(), self.ctx)

    def stop_requested(self) -> bool:
        """This process got a stop signal; unlike ``should_stop`` no collective, for work that one rank does alone
        (derive=strength's judging)."""
        self._stop.keep_installed()
        return self._stop.signum is not None

    def raise_if_stopped(self) -> None:
        """After the final save: report the stop (exit 128 + signal)."""
        if self._stop.signum is not None:
            raise errors.Interrupted(self._stop.signum, self.run_dir, self.entry_point)

    def restore(self, component: Any, key: str) -> None:
        """On a resumed run, ``component.load_state_dict(state[key])`` of the checkpoint; a state that
        does not fit is bad input (``checkpoint.restore_errors``). Nothing on a fresh run."""
        if self.resumed:
            with restore_errors(self.checkpoint_path):
                component.load_state_dict(self.state[key])

    def save(self, state: Mapping[str, Any], path: Path | None = None, *, background: bool = False) -> None:
        """Checkpoint ``state`` with the config it belongs to (rank 0 only; others return). ``background``: the
        file is written while training goes on (``checkpoint.CheckpointWriter``); the next save or the run's
        end waits for it."""
        if self.ctx is not None and not self.ctx.is_main:
            return
        self._stop.keep_installed()
        config = OmegaConf.to_container(self.cfg, resolve=True)
        keep = self.checkpoints.keep if path is None else 1  # last.pt's history only
        self._writer.save({"config": config, "wall_time_s": self.wall_time_s,
                           "cpu_time_s": self.cpu_time_s, "world_size": self.ctx.world_size, **state},
                          path or self.checkpoint_path, kind=self.entry_point, keep=keep, background=background)
        if path is None:
            self.checkpoints.saved()

    @property
    def wall_time_s(self) -> float:
        """Seconds this run has been working, over every session when it was resumed."""
        before = self.state.get("wall_time_s", 0.0) if self.state else 0.0
        return before + time.perf_counter() - self._started

    @property
    def cpu_time_s(self) -> float:
        """CPU seconds of this process and its finished children (loader workers) for this run, over every
        session when it was resumed (several jobs of a multirun share a process, one after another)."""
        before = self.state.get("cpu_time_s", 0.0) if self.state else 0.0
        return before + _cpu_seconds() - self._cpu_started

    def tensorboard(self, logger: DictConfig | None, *, step: int) -> TensorBoardLogger | None:
        """The run's one TensorBoard logger on rank 0 (None elsewhere or with logger=none).

        ``step`` is the global step the run starts from; events a killed run wrote after it
        are purged, so a resumed curve has no doubled segment.
        """
        if logger is None or not self.ctx.is_main:
            return None
        return instantiate(logger)(log_dir=self.run_dir / "tb", purge_step=step or None)


def _cpu_seconds() -> float:
    return sum(usage.ru_utime + usage.ru_stime
               for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


def seed_everything(seed: int) -> None:
    """The same seed on every rank: identical initial weights, α and Gumbel draws."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
