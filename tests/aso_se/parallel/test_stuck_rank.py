"""StuckRankWatchdog: a stop signal whose step never ends gives one line and an exit; one whose step
ends (stop_taken) does not. Each case runs in its own process (the watchdog ends it)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from aso_se.parallel.stuck_rank import StuckRankWatchdog
    signal.signal(signal.SIGCHLD, lambda *a: None)   # a non-stop signal first: ignored by the watchdog
    signal.signal(signal.SIGTERM, lambda *a: watchdog.stop_taken() if sys.argv[1] == "ends" else None)
    watchdog = StuckRankWatchdog((signal.SIGTERM,), grace_s=0.5, message=lambda s: f"error: stuck after {s}\\n",
                                 exit_code=6)
    os.kill(os.getpid(), signal.SIGCHLD)
    time.sleep(1.0)                                   # longer than the grace: only a stop signal counts
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(3.0)                                   # the step that never ends
    watchdog.close()
    print("ended")
""")


@pytest.mark.parametrize("step", ["hangs", "ends"])
def test_a_stop_signal_whose_step_never_ends_exits_with_one_line(step: str) -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT, step], capture_output=True, text=True, timeout=60)
    if step == "hangs":
        assert result.returncode == 6 and result.stderr == "error: stuck after 15\n", result
        assert "ended" not in result.stdout  # the watchdog ended it, not the end of the sleep
    else:
        assert result.returncode == 0 and result.stdout == "ended\n" and not result.stderr, result
