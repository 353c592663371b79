"""The faults suite: stop search.py and train.py with SIGTERM at random moments, then resume them: none silent.

    python benchmarks/stop_resume_loop.py --trials 8 --seed 0 --out stops.jsonl [--data-root /tmp/cifar10]
    for gpu in 0 1 2 3; do CUDA_VISIBLE_DEVICES=$gpu python benchmarks/stop_resume_loop.py --seed $gpu ... & done

Each trial starts one run in its own process group (search or train, 0 or 12 loader workers, in turn),
sends SIGTERM to the whole group (as `timeout`, Slurm and Ctrl-C do) at a random time after its start,
or the moment a checkpoint write begins (the ``.last.pt.tmp`` file appears), and checks:

- the stop is graceful: "SIGTERM received" logged, exit 143, the one ``error: stopped by`` line, and a
  checkpoint written after the signal; a silent stop is exit 143 (or death by SIGTERM) without them;
- the resume (``resume=<run dir>``) logs the checkpoint's global step and α (search) or weights
  (train) digest, and a second SIGTERM stops it gracefully too.

The phase the signal hit is read from the saved checkpoint (cycle / warm-up, search, restabilize;
retrain epoch and step). With ``--data-root`` the runs are CIFAR-10 sized for a GPU (the DARTS-size
networks on a few thousand images so that every phase comes within a minute); without it, mnist5k
smoke runs (the CPU test). One JSON line per trial goes to ``--out``; the summary is printed as
a Markdown table, and its counts (graceful stops, resumes at the saved step) are appended as result rows to
``--rows-out`` (benchmarks/results/faults.csv). Run one loop per GPU (CUDA_VISIBLE_DEVICES) to use a multi-GPU machine.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aso_se.run.checkpoint import load_checkpoint  # noqa: E402
from aso_se.run.search_callbacks import alpha_digest  # noqa: E402
from aso_se.run.tensor_checks import tensor_digest  # noqa: E402
from benchmarks.rows import RESULTS, Measurement, append_rows  # noqa: E402

SMOKE = {
    "search": ["experiment=smoke", "logger=none", "search.schedule.warmup_epochs=1", "search.schedule.cycles=3",
               "search.schedule.restabilize_epochs=1", "trainer.checkpoint_every_min=0.005"],
    "train": ["experiment=smoke", "logger=none", "genotype=DARTS_V2", "epochs=30",
              "trainer.checkpoint_every_min=0.005"],
}
CIFAR10 = {  # every phase within a minute on one GPU; timed checkpoints every ~6 s
    "search": ["experiment=cifar10_qann", "data.max_train_samples=8192", "search.schedule.warmup_epochs=1",
               "search.schedule.search_epochs=2", "search.schedule.restabilize_epochs=1",
               "search.schedule.cycles=3", "trainer.checkpoint_every_min=0.1", "logger=none"],
    "train": ["experiment=cifar10_qann", "genotype=DARTS_V2", "cuda_graph=true", "data.max_train_samples=8192",
              "data.max_test_samples=2048", "epochs=50", "trainer.checkpoint_every_min=0.1", "logger=none"],
}


def _start(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_text(log: Path, text: str, process: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if text in log.read_text(errors="replace"):
            return True
        time.sleep(0.05)
    return text in log.read_text(errors="replace")


def _signal_at(process: subprocess.Popen, run_dir: Path, *, delay_s: float | None) -> float | None:
    """SIGTERM to the group after ``delay_s``, or (None) when a checkpoint write begins; the signal's time."""
    started = time.monotonic()
    temporary = run_dir / "checkpoints" / ".last.pt.tmp"
    while process.poll() is None:
        if (delay_s is not None and time.monotonic() - started >= delay_s) or (delay_s is None and temporary.exists()):
            os.killpg(process.pid, signal.SIGTERM)
            return time.time()
        if time.monotonic() - started > 600:
            break
        time.sleep(0.002 if delay_s is None else 0.05)
    return None


def _stopped_gracefully(process: subprocess.Popen, log: Path, checkpoint: Path, signalled_at: float,
                        timeout_s: float) -> dict:
    try:
        code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        code = process.wait()
        return {"exit": code, "outcome": "hung"}
    text = log.read_text(errors="replace")
    received = "SIGTERM received" in text
    error_line = "error: stopped by SIGTERM" in text
    saved = checkpoint.is_file() and checkpoint.stat().st_mtime >= signalled_at - 0.01
    if code == 128 + signal.SIGTERM and received and error_line and saved:
        outcome = "graceful"
    elif code == 128 + signal.SIGTERM and "SIGTERM received while starting" in text and error_line:
        outcome = "graceful while starting"  # nothing to save yet (aso_se/run/stop_signals.py)
    elif code in (128 + signal.SIGTERM, -signal.SIGTERM) and not received:
        outcome = "SILENT"
    else:
        outcome = "other"
    return {"exit": code, "outcome": outcome, "received": received, "saved_after_signal": saved}


def _phase(entry: str, checkpoint: Path) -> tuple[str, str, str]:
    """Where the checkpoint stands, and the digest a resume must log."""
    state = load_checkpoint(checkpoint, kind=entry)
    if entry == "search":
        engine = state["engine"]
        position = engine["position"]
        where = f"position {position}, step {engine['step']}"
        return where, str(engine["global_step"]), f"α {alpha_digest(engine['supernet'])}"
    trainer = state["trainer"]
    where = f"epoch {trainer['epoch'] + 1}, step {trainer['step_in_epoch']}"
    return where, str(trainer["global_step"]), f"weights {tensor_digest(trainer['model'])}"


def trial(index: int, rng: random.Random, *, work: Path, data_root: str | None, delays: tuple[float, float],
          stop_timeout_s: float) -> dict:
    entry = ("search", "train")[index % 2]
    workers = (0, 12)[(index // 2) % 2] if data_root else (0, 2)[(index // 2) % 2]
    at_save = index % 4 == 3  # every fourth trial: the signal lands while a checkpoint is being written
    delay_s = None if at_save else round(rng.uniform(*delays), 2)
    run_dir = work / f"trial{index:03d}_{entry}"
    overrides = [*(CIFAR10 if data_root else SMOKE)[entry], f"data.num_workers={workers}", f"seed={index}",
                 f"hydra.run.dir={run_dir}"]
    if data_root:
        overrides.append(f"data.root={data_root}")
    row = {"trial": index, "entry": entry, "workers": workers, "signal": "at a save" if at_save else f"{delay_s} s"}
    log = work / f"trial{index:03d}_{entry}.log"
    process = _start([str(REPO / f"{entry}.py"), *overrides], work, log)
    signalled_at = _signal_at(process, run_dir, delay_s=delay_s)
    if signalled_at is None:
        return {**row, "exit": process.wait(), "outcome": "finished before the signal",
                "tail": log.read_text(errors="replace")[-600:]}
    checkpoint = run_dir / "checkpoints" / "last.pt"
    row.update(_stopped_gracefully(process, log, checkpoint, signalled_at, stop_timeout_s))
    if row["outcome"] != "graceful":
        if row["outcome"] != "graceful while starting":
            row["tail"] = log.read_text(errors="replace")[-600:]
        return row
    row["phase"], step, digest = _phase(entry, checkpoint)

    resume_log = work / f"trial{index:03d}_{entry}_resume.log"
    resumed = _start([str(REPO / f"{entry}.py"), f"resume={run_dir}"], work, resume_log)
    expected = f"resumed at global step {step}, {digest}"
    row["resume_matches"] = _wait_for_text(resume_log, expected, resumed, timeout_s=300)
    time.sleep(rng.uniform(1.0, 5.0))
    if resumed.poll() is None:
        again = time.time()
        os.killpg(resumed.pid, signal.SIGTERM)
        row["resume_stop"] = _stopped_gracefully(resumed, resume_log, checkpoint, again, stop_timeout_s)["outcome"]
    else:
        row["resume_stop"] = f"exited {resumed.returncode} before the signal"
        row["tail"] = resume_log.read_text(errors="replace")[-600:]
    return row


def measurements(rows: list[dict]) -> list[Measurement]:
    """The loop's counts as result rows: graceful stops, resumes at the saved step and digest, graceful second stops."""
    resumed = [row for row in rows if "resume_matches" in row]
    of = f"of {len(rows)}"
    return [Measurement("stop_resume", "SIGTERM at random times: graceful stops",
                        sum(row["outcome"].startswith("graceful") for row in rows), of),
            Measurement("stop_resume", "resumes at the saved step and α/weights digest",
                        sum(row["resume_matches"] is True for row in resumed), of),
            Measurement("stop_resume", "resumed runs stopped gracefully by a second SIGTERM",
                        sum(row.get("resume_stop") == "graceful" for row in resumed), of)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="trial indices start at seed*1000 (one loop per GPU)")
    parser.add_argument("--out", type=Path, default=Path("stop_resume.jsonl"))
    parser.add_argument("--work", type=Path, default=Path("outputs/stop_resume_loop"))
    parser.add_argument("--data-root", default=None, help="CIFAR-10 root: GPU-sized runs; none: mnist5k smoke runs")
    parser.add_argument("--delay", type=float, nargs=2, default=(5.0, 60.0), help="signal time range after start (s)")
    parser.add_argument("--budget-s", type=float, default=None, help="start no trial after this many seconds")
    parser.add_argument("--stop-timeout-s", type=float, default=120.0)
    parser.add_argument("--rows-out", default=str(RESULTS / "faults.csv"), help="result rows file ('': none)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    began, rows = time.monotonic(), []
    for number in range(args.trials):
        if args.budget_s is not None and time.monotonic() - began > args.budget_s:
            break
        index = args.seed * 1000 + number
        row = trial(index, random.Random(index), work=args.work.resolve(), data_root=args.data_root,
                    delays=tuple(args.delay), stop_timeout_s=args.stop_timeout_s)
        rows.append(row)
        with args.out.open("a") as out:
            out.write(json.dumps(row) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k != "tail"}), flush=True)
    print("\n| trial | entry | workers | signal | phase | exit | outcome | resume same step, digest | resume stop |")
    print("|---:|---|---:|---|---|---:|---|---|---|")
    for row in rows:
        print(f"| {row['trial']} | {row['entry']} | {row['workers']} | {row['signal']} | {row.get('phase', '')} | "
              f"{row['exit']} | {row['outcome']} | {row.get('resume_matches', '')} | {row.get('resume_stop', '')} |")
    print(f"\noutcomes: {dict(Counter(row['outcome'] for row in rows))}")
    if args.rows_out and rows:
        print(f"{append_rows(Path(args.rows_out), measurements(rows))} rows appended to {args.rows_out}")


if __name__ == "__main__":
    main()
