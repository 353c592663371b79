"""Plumbing shared by search.py and train.py: run directory, resume, signals, errors, progress.

Exit codes (documented in the README):

====  ===============================================================================
0     finished
2     bad input: a config override, genotype file, data set or checkpoint (one line)
3     the loss became NaN/Inf; the last good checkpoint is kept (one line)
4     out of GPU memory; the line names the knobs to lower
5     a checkpoint or result file could not be written (disk full, read-only run dir); the
      previous checkpoint is intact
6     under torchrun: another rank died, or hung past ``trainer.peer_timeout_s``; the last
      checkpoint is intact (``torchrun --max-restarts=N`` resumes from it by itself)
130   stopped by SIGINT (Ctrl-C) after saving a checkpoint; ``resume=<run_dir>`` goes on
143   the same for SIGTERM, 138 for SIGUSR1 (``trainer.stop_signals``: 128 + the signal)
====  ===============================================================================

An interrupted run exits with 128 + signal, as shells do, so ``search.py && train.py`` does not
go on to retrain from a search that was stopped.
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import hydra.errors
import numpy as np
import torch
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from triton import knobs as triton_knobs

from aso_se.data import loaders
from aso_se.errors import TrainingDiverged
from aso_se.monitor.tensorboard import TensorBoardLogger
from aso_se.parallel.distributed import (
    DistributedContext,
    any_rank,
    broadcast_from_main,
    init_distributed,
    is_peer_failure,
    shutdown_distributed,
)
from aso_se.parallel.stuck_rank import StuckRankWatchdog
from aso_se.run import checkpoint, early_signals, gpu_slots
from aso_se.run.checkpoint_policy import CheckpointPolicy
from aso_se.run.os_signals import describe_handler, os_handler
from search_space.errors import UserInputError
from search_space.genotypes import Genotype, load_genotype

log = logging.getLogger(__name__)

EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_OUT_OF_MEMORY, EXIT_WRITE_FAILED, EXIT_PEER_LOST = 2, 3, 4, 5, 6
CHECKPOINT = Path("checkpoints") / "last.pt"
# torchrun --max-restarts: the first attempt's rank 0 names its run dir here, keyed by the job's
# rendezvous id; a restarted attempt resumes that run (see resume_elastic_restart).
ELASTIC_MARKERS = Path("outputs") / ".torchelastic"
# What a resume may set anew: where this machine keeps the data and how many processes read it
# (``+data.root=<dir>``: the default config a resume composes, mnist5k's, has no root).
MACHINE_KEYS = ("data.root", "data.num_workers")
# ... and how train.py evaluates the exact SNN at the end: evaluation only, the training is unchanged.
EVALUATION_KEYS = ("snn_max_timesteps", "snn_first_timesteps", "snn_eval_samples", "snn_eval_dtype",
                   "snn_spikes_per_step")
# Evaluation settings newer than some saved runs: their defaults, so that those runs resume (and re-evaluate).
NEWER_EVALUATION_DEFAULTS = {"snn_spikes_per_step": 1, "snn_first_timesteps": None}
RESUME_KEYS = MACHINE_KEYS + EVALUATION_KEYS
# Where a multirun's jobs run (``+sweep=local_gpus`` and its ``sweep.*`` keys): the launcher's, not the run's config,
# so a resume takes them too (benchmarks continue unfinished runs through the same launcher).


def is_launcher_override(override: str) -> bool:
    key = override.split("=", 1)[0].lstrip("+")
    return key == "sweep" or key.startswith("sweep.")
# Knobs that shrink activation memory, named in the out-of-memory line per entry point.
_MEMORY_KNOBS = {
    "search": ("batch_size, search.supernet.channels, search.supernet.layers, neuron.timesteps "
               "or search.sampling.k (or set search.supernet.recompute=true)"),
    "train": "batch_size, model.network.channels, model.network.layers or neuron.timesteps",
}


# Read before main_guard sets HYDRA_FULL_ERROR for Hydra's sake: the user's own wish.
_USER_WANTS_TRACEBACKS = os.environ.get("HYDRA_FULL_ERROR") == "1"


class OutOfMemory(RuntimeError):
    """The GPU ran out of memory; the message names the knobs to lower."""


class WriteFailed(RuntimeError):
    """A checkpoint or result file could not be written; the message says what is kept."""


# Under torchrun: how long after a stop signal a rank may take to end its step before the watchdog
# ends it with one line (below torchrun's 30 s between its SIGTERM and SIGKILL; see stuck_rank).
_STUCK_RANK_GRACE_S = 20.0
# A second SIGINT within this many seconds is the same stop: `timeout -s INT` signals its child
# and then the child's whole group, so the main process can see the signal twice.
_REPEAT_WINDOW_S = 0.5


class Interrupted(Exception):
    """A stop signal (SIGINT, SIGTERM, ...) stopped the run after its state was saved."""

    def __init__(self, signum: int, run_dir: Path, entry_point: str) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}; state saved in "
                         f"{run_dir / CHECKPOINT}; continue with: "
                         f"python {entry_point}.py resume={run_dir}")


class StoppedBeforeStart(Interrupted):
    """A stop signal came while the entry point was starting (early_signals): nothing to save."""

    def __init__(self, signum: int, run_dir: Path, entry_point: str, resumed: bool) -> None:
        self.signum = signum
        then = (f"continue with: python {entry_point}.py resume={run_dir}" if resumed
                else "nothing was saved; start the run again")
        Exception.__init__(self, f"stopped by {signal.Signals(signum).name} while starting; {then}")


class QuitAtOnce(KeyboardInterrupt):
    """A second Ctrl-C during a stop: the run quits where it is, without saving."""

    def __init__(self, signum: int, message: str) -> None:
        self.signum = signum
        super().__init__(message)


# ---------------------------------------------------------------------------------------------
# Entry point guard: one line on stderr and a distinct exit code for every expected failure.
# ---------------------------------------------------------------------------------------------

def main_guard(hydra_main: Callable[[], Any]) -> None:
    """Run a ``@hydra.main`` function; expected failures become one stderr line and an exit code.

    Composition errors (a bad override) happen inside ``hydra_main`` before the task runs:
    Hydra prints a multi-line report for them unless HYDRA_FULL_ERROR is set, when it re-raises
    and this guard reduces the message to one line. Failures inside the task are reported by
    `Run` (Hydra would add a line of its own if they left the task). Anything unexpected is a
    bug and keeps its traceback.
    """
    os.environ["HYDRA_FULL_ERROR"] = "1"
    register_resolvers()
    resume_elastic_restart(Path(sys.argv[0]).stem)
    _quiet_nonzero_ranks()
    try:
        hydra_main()
    except (Exception, KeyboardInterrupt) as err:
        exit_on_expected_failure(err)
        raise


def exit_on_expected_failure(err: BaseException) -> None:
    """Write one ``error:`` line and exit with the failure's code; return for a bug."""
    if isinstance(err, (Interrupted, QuitAtOnce)):
        message, code = str(err), 128 + err.signum
    elif isinstance(err, KeyboardInterrupt):  # Ctrl-C before the run installed its handlers
        message = "interrupted before the state was saved; the last saved checkpoint is kept"
        code = 128 + signal.SIGINT
    elif isinstance(err, (checkpoint.CheckpointWriteError, WriteFailed)):
        message, code = str(err), EXIT_WRITE_FAILED
    elif isinstance(err, (UserInputError, hydra.errors.HydraException, OmegaConfBaseException)):
        if _USER_WANTS_TRACEBACKS:
            return
        message, code = _one_line(err), EXIT_BAD_INPUT
    elif isinstance(err, TrainingDiverged):
        message, code = str(err), EXIT_DIVERGED
    elif isinstance(err, OutOfMemory):
        message, code = str(err), EXIT_OUT_OF_MEMORY
    else:
        return
    sys.stderr.write(f"error: {message}\n")
    sys.exit(code)


# Optimizer groups of one entry point: given to the other, Hydra's "use +<group>=..." hint would add
# an optimizer of the wrong shape that fails late, so the line names the right group instead.
_OTHER_ENTRY_POINTS_GROUP = {
    "optim": "optim is train.py's retrain optimizer; search.py's optimizers are search_optim=adam|darts",
    "search_optim": "search_optim is search.py's; train.py's optimizer is optim=retrain",
}


def _one_line(err: BaseException) -> str:
    """A Hydra/OmegaConf report on one line; our own error when a resolver raised it."""
    cause = err
    while cause.__cause__ is not None and not isinstance(cause, UserInputError):
        cause = cause.__cause__
    if isinstance(cause, UserInputError):
        err = cause
    report = str(err).split("Config search path")[0]  # Hydra appends its search path
    lines = [line.strip() for line in report.splitlines() if line.strip()]
    if isinstance(err.__cause__, OmegaConfBaseException) and not isinstance(err, UserInputError):
        lines.append(f"({str(err.__cause__).strip().splitlines()[0]})")
    text, listing = "", False
    for line in lines:  # after "Available options in 'data':" come the options, one per line
        separator = ", " if listing and not text.endswith(":") else " "
        text = f"{text}{separator}{line}" if text else line
        listing = listing or line.endswith(":")
    for group, hint in _OTHER_ENTRY_POINTS_GROUP.items():
        if text.startswith(f"Could not override '{group}'. No match in the defaults list."):
            return f"Could not override '{group}': {hint}"
    return text


# ---------------------------------------------------------------------------------------------
# Run directory: Hydra's, or the resumed run's.
# ---------------------------------------------------------------------------------------------

def register_resolvers() -> None:
    """Resolvers that ``hydra.run.dir`` and ``hydra.output_subdir`` use in conf/{search,train}.yaml.

    With ``resume=<run_dir>`` Hydra runs in that directory (after checking it holds a
    checkpoint, so a typo creates nothing) and writes the resuming invocation's config under
    ``.hydra/resume_<time>`` instead of over the original ``.hydra/config.yaml``.
    """
    if not OmegaConf.has_resolver("aso_se.gpu_slots"):  # +sweep=local_gpus: hydra.launcher.n_jobs
        OmegaConf.register_new_resolver("aso_se.gpu_slots", lambda per_gpu, gpus: (
            len(gpus) * int(per_gpu) if gpus else gpu_slots.slot_count(per_gpu)))
    if not OmegaConf.has_resolver("aso_se.stem"):  # hydra.sweep.subdir of the benchmarks: a run's name
        OmegaConf.register_new_resolver("aso_se.stem", lambda value: Path(str(value)).stem)
    if not OmegaConf.has_resolver("aso_se.run_dir"):
        OmegaConf.register_new_resolver("aso_se.run_dir", _run_dir)
        OmegaConf.register_new_resolver(
            "aso_se.hydra_subdir", lambda resume, resumed, fresh: resumed if resume else fresh)


def _run_dir(resume: str | None, fresh: str) -> str:
    if not resume:
        return fresh
    if not Path(resume).is_dir():
        raise checkpoint.CheckpointError(f"resume dir {resume} does not exist; pass resume=<a run "
                                         f"dir under outputs/>, or drop resume= to start anew")
    if not checkpoint.history(Path(resume) / CHECKPOINT):
        raise checkpoint.CheckpointError(f"resume dir {resume} has no {CHECKPOINT} (the run saved "
                                         f"none yet); drop resume= to start a new run")
    return str(resume)


def _elastic_marker(entry_point: str) -> Path | None:
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    return ELASTIC_MARKERS / f"{entry_point}-{run_id}" if run_id else None


def resume_elastic_restart(entry_point: str) -> None:
    """A worker restarted by ``torchrun --max-restarts=N`` continues its job's run: the command line
    becomes ``resume=<the run dir the first attempt named>`` when that run saved a checkpoint;
    otherwise the attempt starts anew like the first."""
    marker = _elastic_marker(entry_point)
    if marker is None or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0 or not marker.is_file():
        return
    run_dir = marker.read_text().strip()
    if not checkpoint.history(Path(run_dir) / CHECKPOINT):
        return
    sys.argv[1:] = [f"resume={run_dir}"]  # the same command on the same machine: its saved config


def _name_run_for_elastic_restarts(run_dir: Path, entry_point: str) -> None:
    """Rank 0 of a fresh run under torchrun --max-restarts: where a restarted attempt finds this run."""
    marker = _elastic_marker(entry_point)
    if marker is not None and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{run_dir}\n")


def _quiet_nonzero_ranks() -> None:
    """Under torchrun, ranks > 0 write no run directory, Hydra config or log file.

    Every rank composes the config and would make its own timestamped run directory (they can
    straddle a second); rank 0's directory is broadcast once the process group is up.
    """
    if int(os.environ.get("RANK", "0")) > 0:
        sys.argv += ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=none"]


# ---------------------------------------------------------------------------------------------
# One run: config, directory, process group, seeds, signals, checkpoint.
# ---------------------------------------------------------------------------------------------

class Run:
    """Context of one search or retrain run, entered by the entry point around its work.

    On entry: the config to use (the saved one when resuming), the run directory, the process
    group, seeds, and handlers for ``trainer.stop_signals`` that only raise a stop flag (the
    training loop polls `should_stop` after each step, then the entry point saves and raises
    `Interrupted`; a second Ctrl-C quits at once). Loader workers ignore those signals, so a
    signal to the whole process group stops the run the same way. ``checkpoints``, the run's
    `CheckpointPolicy`, tells the loops' callbacks when to save. On exit: loader
    workers and the process group are shut down and an expected failure (bad input, NaN/Inf,
    out of memory, a failed write, the stop) exits with its one line.
    """

    def __init__(self, cfg: DictConfig, *, entry_point: str) -> None:
        self.entry_point = entry_point
        self.cfg = cfg
        self.state: dict[str, Any] | None = None  # the checkpoint being resumed
        self.ctx: DistributedContext | None = None
        # A resumed run's directory on every rank: torchrun's other ranks run Hydra in "." (see above)
        # and would look for the checkpoint there before rank 0's directory is broadcast.
        resume = cfg.get("resume")
        self.run_dir = Path(resume) if resume else Path(HydraConfig.get().runtime.output_dir)
        self._signum: int | None = None
        self._signalled_at = 0.0
        self._pid = os.getpid()
        self._previous_handlers: dict[int, Any] = {}
        self._os_handlers: dict[int, int | None] = {}  # what the OS runs for them: Python's C handler
        self._previous_worker_signals: tuple[int, ...] | None = None
        self._started = time.perf_counter()
        self._cpu_started = _cpu_seconds()
        self._writer = checkpoint.CheckpointWriter()
        self.checkpoints = CheckpointPolicy()  # the run's own, from its trainer config, once it starts
        self._watchdog: StuckRankWatchdog | None = None

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / CHECKPOINT

    @property
    def resumed(self) -> bool:
        return self.state is not None

    def __enter__(self) -> Run:
        try:
            self._handle_stop_signals(self.cfg.trainer)
            self._stop_if_signalled_while_starting()
            self._start()
        except BaseException as err:
            self.__exit__(type(err), err, err.__traceback__)
            raise
        return self

    def _start(self) -> None:
        # The jobs of a multirun may share a process (Hydra's basic launcher): each counts only its own conv calls.
        from kernels.sparse_conv import PATH_COUNTS

        PATH_COUNTS.reset()
        if self.cfg.get("resume"):
            self._load_resumed_state()
            self._handle_stop_signals(self.cfg.trainer)  # the resumed run's own setting
        if self.entry_point == "search" and self.cfg.get("model") is not None:  # conf/search.yaml pins it
            raise UserInputError("model= chooses train.py's network; search.py's supernet is sized by "
                                 "search.supernet.channels and search.supernet.layers")
        trainer = self.cfg.trainer
        allowed = ("fp32", "bf16", "fp16") if self.entry_point == "train" else ("fp32", "bf16")
        if trainer.precision not in allowed:
            raise UserInputError(f"trainer.precision={trainer.precision} is not supported by {self.entry_point}.py; "
                                 f"use {' or '.join(allowed)}")
        self.checkpoints = CheckpointPolicy.from_config(trainer)
        peer_timeout_s = trainer.get("peer_timeout_s", 300)
        if isinstance(peer_timeout_s, bool) or not isinstance(peer_timeout_s, (int, float)) or peer_timeout_s <= 0:
            raise UserInputError(f"trainer.peer_timeout_s={peer_timeout_s!r} must be a positive number of seconds; "
                                 f"fix trainer.peer_timeout_s")
        self.ctx = init_distributed(ddp=trainer.ddp, device=trainer.device, peer_timeout_s=float(peer_timeout_s))
        self.checkpoints.timed = self.ctx.is_main  # rank 0 alone writes checkpoints
        torch.backends.cudnn.benchmark = bool(trainer.get("cudnn_benchmark", False))
        self.run_dir = broadcast_from_main(self.run_dir, self.ctx)
        if self.ctx.is_main and not self.resumed:
            _name_run_for_elastic_restarts(self.run_dir, self.entry_point)
        if self.ctx.distributed and "TORCHELASTIC_RUN_ID" in os.environ:
            self._watchdog = StuckRankWatchdog(tuple(self._previous_handlers), grace_s=_STUCK_RANK_GRACE_S,
                                               message=self._stuck_message, exit_code=EXIT_PEER_LOST)
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
        if self._watchdog is not None:
            self._watchdog.close()
        self._restore_signal_handlers()
        if self.ctx is not None and self.ctx.distributed and exc is not None and is_peer_failure(exc):
            self._exit_peer_lost(exc)
        if self.ctx is not None:
            shutdown_distributed(self.ctx)
        if exc is None:
            if write_error is None:
                return
            exc = write_error
        if isinstance(exc, torch.OutOfMemoryError):
            exc = OutOfMemory(f"out of GPU memory; lower {_MEMORY_KNOBS[self.entry_point]}, or "
                              f"spread the batch over GPUs with trainer=ddp")
        elif isinstance(exc, TrainingDiverged):
            kept = (f"last good checkpoint kept: {self.checkpoint_path}"
                    if self.checkpoint_path.is_file() else "no checkpoint was saved yet")
            exc = TrainingDiverged(f"{exc}; {kept}")
        elif isinstance(exc, checkpoint.CheckpointWriteError):
            exc = WriteFailed(f"{exc}; {self._what_is_kept()}")
        exit_on_expected_failure(exc)
        if exc is write_error:  # a bug in the background write: its traceback, as for any bug
            raise write_error

    def _exit_peer_lost(self, err: BaseException) -> None:
        """One line and exit 6 at once: leaving the process group (or the interpreter) normally
        would wait on collectives that the lost rank never joins."""
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        with contextlib.suppress(Exception):
            self._writer.wait(timeout_s=60.0)  # the epoch-end checkpoint being written: a restart resumes from it
        kept = (f"the last checkpoint {self.checkpoint_path} is intact; torchrun --max-restarts=N resumes "
                f"from it by itself, or run torchrun ... {self.entry_point}.py resume={self.run_dir}"
                if self.checkpoint_path.is_file() else "no checkpoint was saved yet")
        message = (f"error: rank {self.ctx.rank}: another process of this torchrun job died or did not answer "
                   f"within trainer.peer_timeout_s ({cause}); {kept}\n")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.write(message)
        sys.stderr.flush()
        os._exit(EXIT_PEER_LOST)

    def _stuck_message(self, signum: int) -> str:
        kept = (f"the last checkpoint {self.checkpoint_path} is intact; torchrun --max-restarts=N resumes from it"
                if self.checkpoint_path.is_file() else "no checkpoint was saved yet")
        return (f"error: rank {self.ctx.rank}: {signal.Signals(signum).name} received but the step did not end within "
                f"{_STUCK_RANK_GRACE_S:.0f} s: it waits on a rank that died or hangs; {kept}\n")

    def _what_is_kept(self) -> str:
        if not self.checkpoint_path.is_file():
            return "no checkpoint was saved yet"
        return (f"the previous checkpoint {self.checkpoint_path} is intact; continue with: "
                f"python {self.entry_point}.py resume={self.run_dir}")

    # ------------------------------------------------------------------------- stop signals
    def _handle_stop_signals(self, trainer: DictConfig) -> None:
        """Install the stop handler for ``trainer.stop_signals``; workers will ignore them."""
        signums = _stop_signals(trainer.get("stop_signals", ["SIGINT", "SIGTERM"]))
        for signum in signums:  # a resumed run may change the set: keep the original handlers
            previous = early_signals.original(signum, signal.signal(signum, self._on_signal))
            self._previous_handlers.setdefault(signum, previous)
            self._os_handlers[signum] = os_handler(signum)
        for signum in set(self._previous_handlers) - set(signums):
            signal.signal(signum, self._previous_handlers.pop(signum))
        previous = loaders.ignore_in_workers(signums)
        if self._previous_worker_signals is None:
            self._previous_worker_signals = previous
        if signums:  # LLVM in libtriton installs its own stop handlers (they kill) when it first compiles
            triton_knobs.runtime.kernel_load_end_hook.add(self._after_kernel_load)

    def _after_kernel_load(self, *args: Any) -> None:
        if threading.current_thread() is threading.main_thread():  # signal.signal's rule; else the next step's check
            self._keep_stop_handlers()

    def _stop_if_signalled_while_starting(self) -> None:
        signum = early_signals.take()
        if signum is None:
            return
        if signum not in self._previous_handlers:  # not a stop signal of this run: its default action
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        log.warning("%s received while starting: stopping before the run begins", signal.Signals(signum).name)
        raise StoppedBeforeStart(signum, self.run_dir, self.entry_point, resumed=bool(self.cfg.get("resume")))

    def _restore_signal_handlers(self) -> None:
        triton_knobs.runtime.kernel_load_end_hook.remove(self._after_kernel_load)
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()
        self._os_handlers.clear()
        if self._previous_worker_signals is not None:
            loaders.ignore_in_workers(self._previous_worker_signals)
            self._previous_worker_signals = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A DataLoader worker between its fork and its init function: the main process
            # stops the run and shuts the worker down.
            return
        now = time.monotonic()
        if self._signum is not None:
            # Only a person's second Ctrl-C quits at once. Schedulers repeat their signal (timeout,
            # torchrun's agent) or escalate (Slurm: USR1, then TERM) and SIGKILL when they mean it.
            if signum == signal.SIGINT and now - self._signalled_at >= _REPEAT_WINDOW_S:
                raise QuitAtOnce(signum, self._quit_message(signum))
            return
        self._signum, self._signalled_at = signum, now
        log.warning("%s received: saving a checkpoint after this step (Ctrl-C again to quit at once)",
                    signal.Signals(signum).name)

    def _quit_message(self, signum: int) -> str:
        kept = (f"{self.checkpoint_path} holds the last saved state; continue with: "
                f"python {self.entry_point}.py resume={self.run_dir}"
                if self.checkpoint_path.is_file() else "no checkpoint was saved yet")
        return f"stopped at once by a second signal ({signal.Signals(signum).name}); {kept}"

    def should_stop(self) -> bool:
        """Polled after every step; all ranks agree so they stop at the same step."""
        self._keep_stop_handlers()
        if self._signum is not None and self._watchdog is not None:
            self._watchdog.stop_taken()  # this rank's step ended: it will save and stop, not hang
        return any_rank(self._signum is not None, self.ctx)

    def stop_requested(self) -> bool:
        """This process got a stop signal; unlike ``should_stop`` no collective, for work that one rank does alone
        (derive=strength's judging)."""
        self._keep_stop_handlers()
        return self._signum is not None

    def _keep_stop_handlers(self) -> None:
        """Puts back a stop handler that something in the process replaced, and names the replacement:
        a signal caught by another handler (or none) would end the run without its checkpoint."""
        for signum in self._previous_handlers:
            current = signal.getsignal(signum)
            if current != self._on_signal:
                log.warning("the %s handler was replaced by %r; the run's stop handler is back",
                            signal.Signals(signum).name, current)
                signal.signal(signum, self._on_signal)
            elif (replacement := os_handler(signum)) != self._os_handlers.get(signum):  # sigaction() unseen by Python
                log.warning("the %s handler was replaced outside Python (by %s); the run's stop handler is back",
                            signal.Signals(signum).name, describe_handler(replacement))
                signal.signal(signum, self._on_signal)

    def raise_if_stopped(self) -> None:
        """After the final save: report the stop (exit 128 + signal)."""
        if self._signum is not None:
            raise Interrupted(self._signum, self.run_dir, self.entry_point)

    def _load_resumed_state(self) -> None:
        overrides = [o for o in HydraConfig.get().overrides.task
                     if not o.startswith("resume=") and not is_launcher_override(o)]
        allowed = [o for o in overrides if o.split("=", 1)[0].lstrip("+") in RESUME_KEYS]
        extra = [o for o in overrides if o not in allowed]
        if extra:
            raise UserInputError(f"resume continues a run with its saved config; drop the "
                                 f"overrides {' '.join(extra)} (a resume takes only {', '.join(RESUME_KEYS)}), "
                                 f"or start a new run with them")
        # A truncated or corrupt last.pt: the one saved before it (trainer.keep_checkpoints); rank 0 sets it aside.
        self.state, _ = checkpoint.load_newest_readable(self.checkpoint_path, kind=self.entry_point,
                                                        warn=log.warning,
                                                        set_aside=int(os.environ.get("RANK", "0")) == 0)
        self.cfg = OmegaConf.create(self.state["config"])
        if self.entry_point == "train":
            for key, default in NEWER_EVALUATION_DEFAULTS.items():
                self.cfg.setdefault(key, default)
        self._fit_to_this_launch(self.state.get("world_size"))
        for override in allowed:  # where this machine keeps the data (a run dir copied here resumes), the SNN's eval
            key, value = override.split("=", 1)
            key = key.lstrip("+")  # +data.root=: the default data set (mnist5k) has no root to override
            if key not in self.cfg and OmegaConf.select(self.cfg, key) is None:  # snn_eval_samples: null is a value
                group, _, name = key.rpartition(".")
                raise UserInputError(f"{override}: this run's {group or 'config'} has no {name} setting; drop it "
                                     f"from the resume")
            OmegaConf.update(self.cfg, key, yaml.safe_load(value), merge=False)

    def _fit_to_this_launch(self, saved_world: int | None) -> None:
        """A run saved by N processes resumed by M (torchrun's WORLD_SIZE, else 1): the same global batch,
        ``batch_size`` per process × N / M, so every global step reads the same images (ShardSampler
        deals each step's block out round-robin); a batch that M processes cannot split is bad input."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if saved_world is None or saved_world == world:
            return
        global_batch = self.cfg.batch_size * saved_world
        if global_batch % world:
            raise UserInputError(f"this run trained with a global batch of {global_batch} (batch_size="
                                 f"{self.cfg.batch_size} on {saved_world} processes), which {world} processes cannot "
                                 f"split evenly; resume it on a number of processes that divides {global_batch}")
        self.cfg.batch_size = global_batch // world
        self.cfg.trainer.ddp = world > 1
        if int(os.environ.get("RANK", "0")) == 0:
            log.warning("resumed on %d process%s (saved on %d): batch_size per process %d -> %d, the global batch "
                        "of %d is kept", world, "" if world == 1 else "es", saved_world, global_batch // saved_world,
                        self.cfg.batch_size, global_batch)

    def restore(self, component: Any, key: str) -> None:
        """On a resumed run, ``component.load_state_dict(state[key])`` of the checkpoint; a state that
        does not fit is bad input (``checkpoint.restore_errors``). Nothing on a fresh run."""
        if self.resumed:
            with checkpoint.restore_errors(self.checkpoint_path):
                component.load_state_dict(self.state[key])

    def save(self, state: Mapping[str, Any], path: Path | None = None, *, background: bool = False) -> None:
        """Checkpoint ``state`` with the config it belongs to (rank 0 only; others return). ``background``: the
        file is written while training goes on (``checkpoint.CheckpointWriter``); the next save or the run's
        end waits for it."""
        if self.ctx is not None and not self.ctx.is_main:
            return
        self._keep_stop_handlers()
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


def _stop_signals(names: Any) -> tuple[int, ...]:
    """``trainer.stop_signals`` (e.g. [SIGTERM, SIGINT, USR1]) as signal numbers."""
    if isinstance(names, str) or not all(isinstance(name, str) for name in names or []):
        raise UserInputError(f"trainer.stop_signals={names} is not a list of signal names; "
                             f"write e.g. trainer.stop_signals=[SIGTERM,SIGINT,SIGUSR1]")
    signums = []
    for name in names:
        full = name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}"
        signum = getattr(signal.Signals, full, None)
        if signum is None or signum in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            raise UserInputError(f"trainer.stop_signals: {name} is not a signal a run can stop on; "
                                 f"use e.g. SIGTERM, SIGINT, SIGUSR1, SIGUSR2 or SIGHUP")
        signums.append(int(signum))
    return tuple(dict.fromkeys(signums))


def genotype_to_train(run: Run) -> Genotype:
    """train.py's genotype: the resumed run's own, else ``genotype=``'s (see find_genotype)."""
    if run.resumed:
        return Genotype.from_json(run.state["genotype"])
    return load_genotype(find_genotype(run.cfg.genotype))


def find_genotype(name_or_path: str | None, search_root: Path = Path("outputs/search")) -> str:
    """``genotype=``'s value, or the newest ``genotype.json`` that search.py wrote."""
    if name_or_path:
        return str(name_or_path)
    found = sorted(search_root.glob("*/genotype.json"), key=lambda path: path.stat().st_mtime)
    if not found:
        raise UserInputError(f"no genotype given and no {search_root}/*/genotype.json found; run "
                             f"python search.py first, or pass genotype=<genotype.json | a bundled "
                             f"name like DARTS_V2>")
    log.info("genotype: %s (the newest search result)", found[-1])
    return str(found[-1])


def check_timesteps(data: Any, neuron: Any) -> None:
    """Event data brings its own number of frames; the network must run that many steps."""
    if data.timesteps is not None and data.timesteps != neuron.timesteps:
        raise UserInputError(f"data {data.name} has {data.timesteps} frames per sample but "
                             f"neuron.timesteps={neuron.timesteps}; set both to the same T "
                             f"(data.timesteps=<T> neuron.timesteps=<T>)")


def seed_everything(seed: int) -> None:
    """The same seed on every rank: identical initial weights, α and Gumbel draws."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
