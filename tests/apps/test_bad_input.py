"""Every bad input gives one stderr line naming the problem and the fix, a non-zero exit, no
traceback, and loses nothing already written.

The entry points run in this process (``runpy`` runs search.py as ``__main__`` with a patched
argv, exactly what ``python search.py ...`` does) so that each case costs a fraction of a
second; the subprocess tests in test_entry_points.py show the same guard in real processes.
"""
from __future__ import annotations

import runpy
import shutil
import sys
from pathlib import Path

import pytest
import torch

from aso_se import app
from aso_se.checkpoint import load_checkpoint, save_checkpoint

REPO = Path(__file__).resolve().parents[2]
SMOKE = ["experiment=smoke", "logger=none"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> None:
    """Tiny shapes gain nothing from intra-op threads, and threads that spin on a busy CPU
    (other tests in parallel) slow these runs down by an order of magnitude."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Runs in a temporary directory; main_guard's HYDRA_FULL_ERROR does not leak out."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


def run(entry_point: str, *argv: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``python <entry_point>.py <argv>`` in this process: (exit code, stderr)."""
    script = str(REPO / f"{entry_point}.py")
    monkeypatch.setattr(sys, "argv", [script, *argv])
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exited:
        code = exited.code
    return code, capsys.readouterr().err


def assert_one_line(stderr: str, *fragments: str) -> None:
    assert stderr.startswith("error: ") and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in stderr


@pytest.fixture(scope="module")
def finished_search(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished smoke search (in process), copied by the tests that damage it."""
    run_dir = tmp_path_factory.mktemp("search") / "run"
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
        monkeypatch.setattr(sys, "argv", ["search.py", *SMOKE, f"hydra.run.dir={run_dir}"])
        runpy.run_path(str(REPO / "search.py"), run_name="__main__")
    return run_dir


@pytest.mark.parametrize(("argv", "fragments"), [
    (["no_such_key=1"], ["Could not override 'no_such_key'", "+no_such_key=1"]),
    (["data=nope"], ["Could not find 'data/nope'", "mnist5k"]),
    (["search.schedule.cycles=0"], ["cycles=0", "fix search.schedule"]),
    (["trainer.precision=fp16"], ["trainer.precision=fp16", "fp32 or bf16"]),
    (["trainer=ddp"], ["torchrun --nproc_per_node"]),
    (["resume=no/such/dir"], ["resume dir no/such/dir does not exist"]),
])
def test_bad_search_overrides(argv: list[str], fragments: list[str], tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    code, stderr = run("search", *SMOKE, *argv, monkeypatch=monkeypatch, capsys=capsys)
    assert code == app.EXIT_BAD_INPUT
    assert_one_line(stderr, *fragments)
    assert not (tmp_path / "no").exists()  # a mistyped resume dir is never created


@pytest.mark.parametrize(("text", "fragments"), [
    ("{not json", ["genotype.json", "must be JSON"]),
    ('{"normal": [["conv_9x9", 0], ["skip_connect", 1]], "normal_concat": [2],'
     ' "reduce": [["skip_connect", 0], ["skip_connect", 1]], "reduce_concat": [2]}',
     ["unknown op 'conv_9x9'", "sep_conv_3x3"]),
])
def test_bad_genotype_file(text: str, fragments: list[str], tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "genotype.json").write_text(text)
    code, stderr = run("train", *SMOKE, "genotype=genotype.json", monkeypatch=monkeypatch,
                       capsys=capsys)
    assert code == app.EXIT_BAD_INPUT
    assert_one_line(stderr, *fragments)
    assert (tmp_path / "genotype.json").read_text() == text


def test_no_genotype_and_no_search_yet(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, stderr = run("train", *SMOKE, monkeypatch=monkeypatch, capsys=capsys)
    assert code == app.EXIT_BAD_INPUT
    assert_one_line(stderr, "run python search.py first", "genotype=")


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / "copy"))


def test_resume_dir_without_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty_run").mkdir()
    code, stderr = run("search", "resume=empty_run", monkeypatch=monkeypatch, capsys=capsys)
    assert code == app.EXIT_BAD_INPUT
    assert_one_line(stderr, "has no checkpoints/last.pt")
    assert list((tmp_path / "empty_run").iterdir()) == []


def test_resume_corrupt_checkpoint_keeps_the_run(finished_search: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _copy(finished_search, tmp_path)
    last = run_dir / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    code, stderr = run("search", f"resume={run_dir}", monkeypatch=monkeypatch, capsys=capsys)
    assert code == app.EXIT_BAD_INPUT
    assert_one_line(stderr, "unreadable", str(last))
    for path, content in before.items():
        assert path.read_bytes() == content


def test_resume_with_the_other_entry_point(finished_search: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _copy(finished_search, tmp_path)
    code, stderr = run("train", f"resume={run_dir}", monkeypatch=monkeypatch, capsys=capsys)
    assert code == app.EXIT_BAD_INPUT
    assert_one_line(stderr, "written by the search entry point", "search.py")


def test_resume_checkpoint_that_does_not_fit(finished_search: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _copy(finished_search, tmp_path)
    last = run_dir / "checkpoints" / "last.pt"
    state = load_checkpoint(last, kind="search")
    name = next(iter(state["engine"]["supernet"]))
    state["engine"]["supernet"][name] = torch.zeros(3, 3, 3)  # a weight of another shape
    save_checkpoint(state, last, kind="search")
    code, stderr = run("search", f"resume={run_dir}", monkeypatch=monkeypatch, capsys=capsys)
    assert code == app.EXIT_BAD_INPUT
    assert_one_line(stderr, "does not fit", name)


def test_resume_with_other_overrides(finished_search: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _copy(finished_search, tmp_path)
    code, stderr = run("search", f"resume={run_dir}", "batch_size=8", monkeypatch=monkeypatch,
                       capsys=capsys)
    assert code == app.EXIT_BAD_INPUT
    assert_one_line(stderr, "drop the overrides batch_size=8")


def _nan_after(calls: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the cross-entropy NaN from the ``calls``-th call on (a diverging run)."""
    real = torch.nn.functional.cross_entropy
    count = {"calls": 0}

    def cross_entropy(*args, **kwargs):
        count["calls"] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if count["calls"] >= calls else loss

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", cross_entropy)


def test_nan_loss_stops_the_search_and_keeps_the_last_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _nan_after(6, monkeypatch)  # 2 steps of 2 losses each make epoch 1; epoch 2 diverges
    code, stderr = run("search", *SMOKE, "hydra.run.dir=run", monkeypatch=monkeypatch,
                       capsys=capsys)
    assert code == app.EXIT_DIVERGED
    assert_one_line(stderr, "is nan at cycle 0", "last good checkpoint kept: ",
                    str(tmp_path / "run" / "checkpoints" / "last.pt"))
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt",
                           kind="search")["engine"]["global_step"] == 2


def test_nan_loss_stops_the_retrain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    _nan_after(2, monkeypatch)
    code, stderr = run("train", *SMOKE, "genotype=DARTS_V2", "hydra.run.dir=run",
                       monkeypatch=monkeypatch, capsys=capsys)
    assert code == app.EXIT_DIVERGED
    assert_one_line(stderr, "NaN/Inf at epoch 1, step 2", "no checkpoint was saved yet")


def test_out_of_memory_names_the_knobs(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr("aso_se.engine.ASOSEEngine._weight_step", out_of_memory)
    code, stderr = run("search", *SMOKE, "hydra.run.dir=run", monkeypatch=monkeypatch,
                       capsys=capsys)
    assert code == app.EXIT_OUT_OF_MEMORY
    assert_one_line(stderr, "out of GPU memory", "batch_size", "search.supernet.channels")
