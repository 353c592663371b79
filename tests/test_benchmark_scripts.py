"""Every benchmark script imports as `python benchmarks/<name>.py` does: from another directory, with neither the
repo on PYTHONPATH nor `benchmarks` installed (the package installs aso_se, search_space and kernels only)."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# In one process for speed; each script starts from the original sys.path with no `benchmarks` module loaded,
# so one script's path fix cannot make another's pass.
PROBE = """
import runpy, sys
scripts = sys.argv[1:]
start_path = list(sys.path)
failed = []
for script in scripts:
    for name in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
        del sys.modules[name]
    sys.path[:] = start_path
    try:
        runpy.run_path(script, run_name="imported_by_test")
    except Exception as error:
        failed.append(f"{script}: {type(error).__name__}: {error}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_benchmark_script_imports_outside_the_repo(tmp_path: Path) -> None:
    scripts = sorted(str(path) for path in (REPO / "benchmarks").glob("*.py") if path.name != "common.py")
    suites = {"speed.py", "accuracy.py", "snn.py", "tools.py", "stop_resume_loop.py", "report.py"}
    assert suites <= {Path(script).name for script in scripts}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([sys.executable, "-c", PROBE, *scripts], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stdout + probe.stderr[-2000:]
