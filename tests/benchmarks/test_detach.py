"""benchmarks/detach.sh: a job outlives the call that started it, and its DONE file is written even so."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "detach.sh"


def wait_for(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return True
        time.sleep(0.05)
    return False


def call_then_kill_its_processes(*args: str) -> subprocess.CompletedProcess:
    """Runs detach.sh as a device call does, in a session of its own, then kills that session's processes as the
    device does when a call returns."""
    call = subprocess.Popen(["bash", str(SCRIPT), *args], start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = call.communicate(timeout=30)
    try:
        os.killpg(call.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    subprocess.run(["pkill", "-KILL", "-s", str(call.pid)], check=False)
    return subprocess.CompletedProcess(call.args, call.returncode, out, err)


def test_the_job_and_its_done_file_survive_the_end_of_the_call(tmp_path: Path) -> None:
    done, log = tmp_path / "out" / "DONE", tmp_path / "out" / "job.log"
    # Still running when the call's processes are killed: the job waits for the kill to be over.
    job = "sleep 1.5; echo trained; exit 3"
    result = call_then_kill_its_processes(str(done), str(log), "--", "bash", "-c", job)
    assert result.returncode == 0, result.stderr
    assert not done.exists()
    assert wait_for(done, 30), "the DONE file was never written: the job or its waiter died with the call"
    assert done.read_text().strip() == "3"  # the job's exit status
    assert log.read_text().strip() == "trained"


def test_arguments_with_spaces_reach_the_command_unchanged(tmp_path: Path) -> None:
    done, log = tmp_path / "DONE", tmp_path / "job.log"
    result = call_then_kill_its_processes(str(done), str(log), "--", "printf", "%s|", "a b", "c")
    assert result.returncode == 0, result.stderr
    assert wait_for(done, 30) and done.read_text().strip() == "0"
    assert log.read_text() == "a b|c|"


def test_an_old_done_file_is_removed_at_the_start(tmp_path: Path) -> None:
    done, log = tmp_path / "DONE", tmp_path / "job.log"
    done.write_text("0\n")
    result = call_then_kill_its_processes(str(done), str(log), "--", "bash", "-c", "sleep 2")
    assert result.returncode == 0
    assert not done.exists() or not done.read_text().strip(), "a DONE file from an earlier job was kept"
    assert wait_for(done, 30)


@pytest.mark.parametrize("args", [(), ("d", "l", "--"), ("d", "l", "x", "cmd")])
def test_bad_arguments_are_a_one_line_error(args: tuple[str, ...]) -> None:
    result = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
