"""How a run ends when it cannot finish: its exit code, its exception, and the one line it writes.

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

The lines a started run ends with (a stop, NaN/Inf, out of memory, a failed write, a lost rank) are
written here, once, with what the run has kept; `aso_se.run.guard` turns the exceptions into their exit
codes. Bad input is `search_space.errors.UserInputError`, raised where the input is checked.
"""
from __future__ import annotations

import signal
from pathlib import Path

from aso_se.errors import TrainingDiverged
from aso_se.run.paths import CHECKPOINT

EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_OUT_OF_MEMORY, EXIT_WRITE_FAILED, EXIT_PEER_LOST = 2, 3, 4, 5, 6

NOTHING_SAVED = "no checkpoint was saved yet"
INTERRUPTED_BEFORE_SAVE = "interrupted before the state was saved; the last saved checkpoint is kept"

# Knobs that shrink activation memory, named in the out-of-memory line per entry point.
_MEMORY_KNOBS = {
    "search": ("batch_size, search.supernet.channels, search.supernet.layers, neuron.timesteps "
               "or search.sampling.k (or set search.supernet.recompute=true)"),
    "train": "batch_size, model.network.channels, model.network.layers or neuron.timesteps",
}


class OutOfMemory(RuntimeError):
    """The GPU ran out of memory; the message names the knobs to lower."""


class WriteFailed(RuntimeError):
    """A checkpoint or result file could not be written; the message says what is kept."""


class Interrupted(Exception):
    """A stop signal (SIGINT, SIGTERM, ...) stopped the run after its state was saved."""

    def __init__(self, signum: int, run_dir: Path, entry_point: str) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}; state saved in "
                         f"{run_dir / CHECKPOINT}; {_continue_with(entry_point, run_dir)}")


class StoppedBeforeStart(Interrupted):
    """A stop signal came while the entry point was starting (before the run's handlers): nothing to save."""

    def __init__(self, signum: int, run_dir: Path, entry_point: str, resumed: bool) -> None:
        self.signum = signum
        then = _continue_with(entry_point, run_dir) if resumed else "nothing was saved; start the run again"
        Exception.__init__(self, f"stopped by {signal.Signals(signum).name} while starting; {then}")


class QuitAtOnce(KeyboardInterrupt):
    """A second Ctrl-C during a stop: the run quits where it is, without saving."""

    def __init__(self, signum: int, message: str) -> None:
        self.signum = signum
        super().__init__(message)


def _resume_command(entry_point: str, run_dir: Path, launcher: str = "python") -> str:
    return f"{launcher} {entry_point}.py resume={run_dir}"


def _continue_with(entry_point: str, run_dir: Path) -> str:
    return f"continue with: {_resume_command(entry_point, run_dir)}"


def _if_saved(run_dir: Path, kept: str) -> str:
    """``kept`` (what the run's checkpoint offers) once the run has saved one."""
    return kept if (run_dir / CHECKPOINT).is_file() else NOTHING_SAVED


def quit_at_once(signum: int, run_dir: Path, entry_point: str) -> QuitAtOnce:
    kept = _if_saved(run_dir, f"{run_dir / CHECKPOINT} holds the last saved state; "
                              f"{_continue_with(entry_point, run_dir)}")
    return QuitAtOnce(signum, f"stopped at once by a second signal ({signal.Signals(signum).name}); {kept}")


def out_of_memory(entry_point: str) -> OutOfMemory:
    return OutOfMemory(f"out of GPU memory; lower {_MEMORY_KNOBS[entry_point]}, or "
                       f"spread the batch over GPUs with trainer=ddp")


def out_of_memory_in_finetuning(run_dir: Path, batch_size: int, timesteps: int) -> OutOfMemory:
    """An OOM of the SNN fine-tuning, whose BPTT holds T steps of activations: its own knobs, and the resume that
    keeps the trained QANN (its checkpoint is written when its training ends)."""
    smaller = max(1, batch_size // 2)
    return OutOfMemory(f"out of GPU memory in the SNN fine-tuning (BPTT holds T = {timesteps} steps of activations "
                       f"of {batch_size} images a process); lower snn_finetune.batch_size or snn_finetune.timesteps "
                       f"and go on from the trained QANN: {_resume_command('train', run_dir)} "
                       f"snn_finetune.batch_size={smaller}")


def diverged(err: TrainingDiverged, run_dir: Path) -> TrainingDiverged:
    """``err`` with what the run keeps: a diverged step is never saved, so the checkpoint is the last good one."""
    return TrainingDiverged(f"{err}; {_if_saved(run_dir, f'last good checkpoint kept: {run_dir / CHECKPOINT}')}")


def non_finite_weights(name: str, global_step: int, lower: str) -> TrainingDiverged:
    """Weights or optimizer state ``name`` hold NaN/Inf at a save: refused, so the last good checkpoint stays.
    ``lower``: the entry point's learning-rate knob."""
    return TrainingDiverged(f"{name} became NaN/Inf by global step {global_step} (not saved): lower {lower} "
                            f"or use trainer.precision=fp32")


def write_failed(err: Exception, run_dir: Path, entry_point: str) -> WriteFailed:
    kept = _if_saved(run_dir, f"the previous checkpoint {run_dir / CHECKPOINT} is intact; "
                              f"{_continue_with(entry_point, run_dir)}")
    return WriteFailed(f"{err}; {kept}")


def peer_lost_line(rank: int, cause: str, run_dir: Path, entry_point: str) -> str:
    """Exit 6's line: another rank of the torchrun job died or did not answer."""
    kept = _if_saved(run_dir, f"the last checkpoint {run_dir / CHECKPOINT} is intact; torchrun --max-restarts=N "
                              f"resumes from it by itself, or run "
                              f"{_resume_command(entry_point, run_dir, launcher='torchrun ...')}")
    return (f"error: rank {rank}: another process of this torchrun job died or did not answer "
            f"within trainer.peer_timeout_s ({cause}); {kept}\n")


def stuck_rank_line(rank: int, signum: int, grace_s: float, run_dir: Path) -> str:
    """Exit 6's line from the watchdog: a stop signal came but the step waits on a rank that died or hangs."""
    kept = _if_saved(run_dir, f"the last checkpoint {run_dir / CHECKPOINT} is intact; torchrun --max-restarts=N "
                              f"resumes from it")
    return (f"error: rank {rank}: {signal.Signals(signum).name} received but the step did not end within "
            f"{grace_s:.0f} s: it waits on a rank that died or hangs; {kept}\n")
