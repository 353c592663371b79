"""The entry points' outermost layer: one line on stderr and a distinct exit code for every expected failure
(the codes: aso_se.run.errors)."""
from __future__ import annotations

import logging
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra.errors
import torch
from omegaconf.errors import OmegaConfBaseException

from aso_se.errors import TrainingDiverged
from aso_se.run.atomic_write import CheckpointWriteError
from aso_se.run.elastic_restart import resume_elastic_restart
from aso_se.run.errors import (
    EXIT_BAD_INPUT,
    EXIT_DIVERGED,
    EXIT_OUT_OF_MEMORY,
    EXIT_WRITE_FAILED,
    INTERRUPTED_BEFORE_SAVE,
    Interrupted,
    OutOfMemory,
    QuitAtOnce,
    WriteFailed,
    diverged,
    out_of_memory,
    write_failed,
)
from aso_se.run.run_dir import quiet_nonzero_ranks, register_resolvers
from search_space.errors import UserInputError

# Read before main_guard sets HYDRA_FULL_ERROR for Hydra's sake: the user's own wish.
_USER_WANTS_TRACEBACKS = os.environ.get("HYDRA_FULL_ERROR") == "1"

# Optimizer groups of one entry point: given to the other, Hydra's "use +<group>=..." hint would add
# an optimizer of the wrong shape that fails late, so the line names the right group instead.
_OTHER_ENTRY_POINTS_GROUP = {
    "optim": "optim is train.py's retrain optimizer; search.py's optimizers are search_optim=adam|darts",
    "search_optim": "search_optim is search.py's; train.py's optimizer is optim=retrain",
}


def main_guard(hydra_main: Callable[[], Any]) -> None:
    """Run a ``@hydra.main`` function; expected failures become one stderr line and an exit code.

    Composition errors (a bad override) happen inside ``hydra_main`` before the task runs:
    Hydra prints a multi-line report for them unless HYDRA_FULL_ERROR is set, when it re-raises
    and this guard reduces the message to one line. Failures inside the task are reported by
    the `aso_se.run.lifecycle.Run` (Hydra would add a line of its own if they left the task). Anything
    unexpected is a bug and keeps its traceback.
    """
    os.environ["HYDRA_FULL_ERROR"] = "1"
    register_resolvers()
    resume_elastic_restart(Path(sys.argv[0]).stem)
    quiet_nonzero_ranks()
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
        message, code = INTERRUPTED_BEFORE_SAVE, 128 + signal.SIGINT
    elif isinstance(err, (CheckpointWriteError, WriteFailed)):
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


def exit_on_run_failure(err: BaseException, run_dir: Path, entry_point: str) -> None:
    """`exit_on_expected_failure` for a failure inside a run, whose line also says what the run has kept."""
    if isinstance(err, torch.OutOfMemoryError):
        err = out_of_memory(entry_point)
    elif isinstance(err, TrainingDiverged):
        err = diverged(err, run_dir)
    elif isinstance(err, CheckpointWriteError):
        err = write_failed(err, run_dir, entry_point)
    exit_on_expected_failure(err)


def exit_at_once(line: str, code: int) -> None:
    """Write ``line`` and end the process now, skipping the interpreter's shutdown: that would wait on
    collectives that a lost rank never joins."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.write(line)
    sys.stderr.flush()
    os._exit(code)


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
    # a resolver's own error, which OmegaConf re-raises as text: that text alone
    resolved = re.match(r"UserInputError raised while resolving interpolation: (.*?) full_key: ", text)
    if resolved:
        return resolved.group(1)
    for group, hint in _OTHER_ENTRY_POINTS_GROUP.items():
        if text.startswith(f"Could not override '{group}'. No match in the defaults list."):
            return f"Could not override '{group}': {hint}"
    return text
