"""Stop signals as clusters deliver them: to the whole process group, loader workers included
(Slurm, ``timeout``, systemd, a shell's Ctrl-C), and SIGKILL after a timed mid-epoch checkpoint.

The entry points run as real subprocesses in their own session with two loader workers per loader;
the signal goes to the group once the workers run. Every stop must end like a signal to the main
process alone: the step finished, a loadable checkpoint, one ``error:`` line with the resume
command, exit 128 + signal, no worker left, and a resumed search ends with the uninterrupted
run's genotype.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from triton import knobs as triton_knobs

from aso_se.run.checkpoint import load_checkpoint
from aso_se.run.stop_signals import os_handler
from tests.aso_se.run.helpers import REPO, SMOKE, RunApp

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc (Linux)")

WORKERS = "data.num_workers=2"


def _env() -> dict[str, str]:
    # One thread per process: the tests run several processes on two cores.
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def _start(script: str, *overrides: str, cwd: Path) -> subprocess.Popen[bytes]:
    """``python <script> ...`` in a new session (its pid is the group id); output to files, so
    a full pipe never blocks it."""
    with open(cwd / f"{script}.out", "wb") as out, open(cwd / f"{script}.err", "wb") as err:
        return subprocess.Popen([sys.executable, str(REPO / script), *overrides], cwd=cwd, env=_env(),
                                stdout=out, stderr=err, start_new_session=True)


def _finish(process: subprocess.Popen[bytes], script: str, cwd: Path) -> tuple[int, str]:
    code = process.wait(timeout=180)
    return code, (cwd / f"{script}.err").read_text()


def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (zombies excluded)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, parent = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(parent) == pid and state != "Z":
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(condition, what: str, process: subprocess.Popen[bytes], timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the run ended (exit {process.returncode}) before {what}"
        if found := condition():
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _assert_stopped(code: int, stderr: str, signum: int, script: str, run_dir: Path) -> None:
    assert code == 128 + signum, stderr[-3000:]
    assert stderr.count("\n") == 1 and stderr.startswith(f"error: stopped by {signal.Signals(signum).name}; ")
    assert stderr.rstrip().endswith(f"continue with: python {script} resume={run_dir}")
    assert "Traceback" not in stderr


def _genotype(run_dir: Path) -> dict:
    return json.loads((run_dir / "genotype.json").read_text())


@pytest.fixture
def straight(finished_search: Path) -> Path:
    """An uninterrupted smoke search without workers (the data order depends on (seed, epoch) only):
    the session's one, shared with test_bad_input.py (conftest.py)."""
    return finished_search


@pytest.mark.slow
def test_sigterm_to_the_group_stops_the_search_and_it_resumes_to_the_same_genotype(
        tmp_path: Path, straight: Path, run_app: RunApp) -> None:
    run_dir = tmp_path / "run"
    search = _start("search.py", *SMOKE, WORKERS, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    workers = _wait_for(lambda: kids if len(kids := _children(search.pid)) >= 4 else None, "4 workers", search)
    os.killpg(search.pid, signal.SIGTERM)
    code, stderr = _finish(search, "search.py", tmp_path)
    _assert_stopped(code, stderr, signal.SIGTERM, "search.py", run_dir)
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt", kind="search")
    assert state["engine"]["global_step"] >= 1 and not (run_dir / "genotype.json").exists()
    assert not any(_alive(pid) for pid in workers)  # the main process shut its workers down
    log = (run_dir / "search.log").read_text()
    assert log.count("SIGTERM received") == 1  # the workers ignored it

    code, stderr = run_app("search", f"resume={run_dir}")  # in-process: the resume needs no process of its own
    assert code == 0, stderr[-3000:]
    assert _genotype(run_dir) == _genotype(straight)


def test_sigusr1_to_the_group_stops_the_retrain(tmp_path: Path) -> None:
    """Slurm's ``--signal=USR1@90`` early warning: one of the default trainer.stop_signals. (The
    retrain's resume from a stop is checked in test_retrain_resume.py.)"""
    run_dir = tmp_path / "run"
    train = _start("train.py", *SMOKE, WORKERS, "genotype=DARTS_V2", "epochs=4", f"hydra.run.dir={run_dir}",
                   cwd=tmp_path)
    workers = _wait_for(lambda: kids if len(kids := _children(train.pid)) >= 2 else None, "2 workers", train)
    os.killpg(train.pid, signal.SIGUSR1)
    code, stderr = _finish(train, "train.py", tmp_path)
    _assert_stopped(code, stderr, signal.SIGUSR1, "train.py", run_dir)
    assert code == 138
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt", kind="train")["trainer"]
    assert state["global_step"] >= 1 and state["epoch"] < 4
    assert not any(_alive(pid) for pid in workers)


@pytest.mark.slow
def test_sigkill_after_a_timed_checkpoint_loses_at_most_the_interval(tmp_path: Path, straight: Path,
                                                                    run_app: RunApp) -> None:
    """trainer.checkpoint_every_min tiny: a checkpoint after every step. SIGKILL (to the main process
    alone, as when the node's OOM killer picks it) after a mid-epoch one: the workers die with it
    (torch's watchdog), and the resumed run ends with the uninterrupted genotype."""
    run_dir = tmp_path / "run"
    path = run_dir / "checkpoints" / "last.pt"
    search = _start("search.py", *SMOKE, WORKERS, "trainer.checkpoint_every_min=1e-6",
                    f"hydra.run.dir={run_dir}", cwd=tmp_path)

    def mid_epoch_checkpoint() -> bool:
        try:
            return path.is_file() and load_checkpoint(path, kind="search")["engine"]["step"] > 0
        except Exception:  # replaced while being read: look again
            return False

    _wait_for(mid_epoch_checkpoint, "a mid-epoch checkpoint", search)
    workers = _children(search.pid)
    search.send_signal(signal.SIGKILL)
    assert search.wait(timeout=30) == -signal.SIGKILL
    assert workers and load_checkpoint(path, kind="search")["engine"]["step"] > 0

    # In-process (the resume needs no process of its own), while the workers notice their parent's death.
    code, stderr = run_app("search", f"resume={run_dir}")
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers)  # they ignore SIGTERM but not their parent's death
    assert code == 0, stderr[-3000:]
    assert _genotype(run_dir) == _genotype(straight)


# ------------------------------------------------------------------ in-process: config, repeats

@pytest.mark.parametrize(("override", "message"), [
    ("trainer.stop_signals=[SIGTERM,SIGNOPE]", "trainer.stop_signals: SIGNOPE is not a signal"),
    ("trainer.stop_signals=[SIGKILL]", "trainer.stop_signals: SIGKILL is not a signal a run can stop on"),
    ("trainer.stop_signals=SIGTERM", "is not a list of signal names"),
    ("trainer.checkpoint_every_min=0", "trainer.checkpoint_every_min=0 must be a positive number"),
    ("trainer.checkpoint_every_min=soon", "trainer.checkpoint_every_min=soon must be a positive number"),
    ("trainer.keep_checkpoints=0", "trainer.keep_checkpoints=0 must be an integer >= 1"),
    ("trainer.checkpoint_every_n_epochs=0", "trainer.checkpoint_every_n_epochs=0 must be an integer >= 1"),
    ("trainer.checkpoint_every_n_epochs=1.5", "trainer.checkpoint_every_n_epochs=1.5 must be an integer >= 1"),
])
def test_bad_stop_settings_are_one_line(run_app: RunApp, override: str, message: str) -> None:
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", override)
    assert code == 2 and stderr.count("\n") == 1 and message in stderr, stderr


def _signal_during_step(step: int, signums: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Send this process ``signums`` back to back during the ``step``-th training step."""
    from aso_se.train.retrain import Retrainer
    real_step, steps = Retrainer._train_step, 0

    def train_step(self, inputs, labels):
        nonlocal steps
        steps += 1
        if steps == step:
            for signum in signums:
                os.kill(os.getpid(), signum)
                time.sleep(0.01)  # each is handled before the next arrives
        return real_step(self, inputs, labels)

    monkeypatch.setattr(Retrainer, "_train_step", train_step)


@pytest.mark.parametrize(("signums", "window_s"), [
    ([signal.SIGTERM, signal.SIGTERM], None),  # timeout: to its child, then to the child's group
    ([signal.SIGINT, signal.SIGINT], None),    # timeout -s INT
    ([signal.SIGUSR1, signal.SIGTERM], 0.0),   # Slurm: the early warning, then the time limit
])
def test_a_repeated_or_escalated_signal_is_one_stop(run_app: RunApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    signums: list[int], window_s: float | None) -> None:
    if window_s is not None:
        monkeypatch.setattr("aso_se.run.stop_signals._REPEAT_WINDOW_S", window_s)
    _signal_during_step(2, signums, monkeypatch)
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "hydra.run.dir=run")
    _assert_stopped(code, stderr, signums[0], "train.py", tmp_path / "run")
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", kind="train")["trainer"]
    assert (state["epoch"], state["step_in_epoch"]) == (0, 2)


def _replace_the_handler_then_stop(replace, monkeypatch: pytest.MonkeyPatch) -> None:
    """``replace()`` in the retrain's first step, SIGTERM to the process in its second."""
    from aso_se.train.retrain import Retrainer
    real_step, steps = Retrainer._train_step, 0

    def train_step(self, inputs, labels):
        nonlocal steps
        steps += 1
        if steps == 1:
            replace()
        if steps == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
        return real_step(self, inputs, labels)

    monkeypatch.setattr(Retrainer, "_train_step", train_step)


def test_a_stop_handler_replaced_by_a_library_is_put_back(run_app: RunApp, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # a library swaps in its own handler, which would swallow the stop
    _replace_the_handler_then_stop(lambda: signal.signal(signal.SIGTERM, lambda signum, frame: None), monkeypatch)
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "hydra.run.dir=run")
    _assert_stopped(code, stderr, signal.SIGTERM, "train.py", tmp_path / "run")
    assert "the SIGTERM handler was replaced by <function" in (tmp_path / "run" / "train.log").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the OS handler through glibc")
def test_a_stop_handler_replaced_by_a_c_library_is_put_back(run_app: RunApp, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A C library's sigaction() is invisible to signal.getsignal; left alone, SIGTERM would kill
    the run (and this test) silently."""
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p

    def replace() -> None:
        libc.signal(signal.SIGTERM, ctypes.c_void_p(0))  # SIG_DFL, behind Python's back
        assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL  # Python still sees its own
        assert os_handler(signal.SIGTERM) == 0
        # LLVM (in libtriton) does this when Triton first compiles: put back as soon as the kernel loads
        triton_knobs.runtime.kernel_load_end_hook(None, None, "kernel", None, "hash")
        assert os_handler(signal.SIGTERM) != 0

    _replace_the_handler_then_stop(replace, monkeypatch)
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "hydra.run.dir=run")
    _assert_stopped(code, stderr, signal.SIGTERM, "train.py", tmp_path / "run")
    assert "handler was replaced outside Python" in (tmp_path / "run" / "train.log").read_text()


def test_a_second_ctrl_c_later_quits_at_once(run_app: RunApp, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("aso_se.run.stop_signals._REPEAT_WINDOW_S", 0.0)
    _signal_during_step(2, [signal.SIGTERM, signal.SIGINT], monkeypatch)
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "hydra.run.dir=run")
    assert code == 128 + signal.SIGINT, stderr
    assert stderr == "error: stopped at once by a second signal (SIGINT); no checkpoint was saved yet\n"
    assert not (tmp_path / "run" / "checkpoints" / "last.pt").exists()


def _wait_until_it_catches(pid: int, signum: int, timeout_s: float = 60) -> None:
    """Until the process has a handler for ``signum`` (its SigCgt mask in /proc)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
        if caught >> (signum - 1) & 1:
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} never caught signal {signum}")


def test_a_stop_while_starting_is_one_line_not_a_silent_death(tmp_path: Path) -> None:
    """SIGTERM during the imports (before the Run's handlers): the default action would kill the process
    without a word; stop_signals.catch_early records it and the Run stops before it begins."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    train = subprocess.Popen([sys.executable, str(REPO / "train.py"), *SMOKE, "genotype=DARTS_V2", "hydra.run.dir=run"],
                             cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_until_it_catches(train.pid, signal.SIGTERM)  # stop_signals.catch_early() ran; torch and hydra still importing
    os.killpg(train.pid, signal.SIGTERM)
    _, stderr = train.communicate(timeout=120)
    assert train.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.strip().splitlines()[-1] == ("error: stopped by SIGTERM while starting; nothing was saved; "
                                                "start the run again")
    assert not (tmp_path / "run" / "checkpoints").exists()
