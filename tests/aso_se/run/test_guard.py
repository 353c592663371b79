"""The entry-point guard: one stderr line and a distinct exit code for every expected failure."""
import signal
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException

from aso_se.errors import TrainingDiverged
from aso_se.run import errors, guard
from search_space.errors import UserInputError

CONF = str(Path(__file__).resolve().parents[3] / "conf")


@pytest.fixture(autouse=True)
def _restore_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """main_guard sets HYDRA_FULL_ERROR for its process; keep it out of the other tests."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


def _exit(failure: BaseException, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    def hydra_main() -> None:
        raise failure

    with pytest.raises(SystemExit) as exited:
        guard.main_guard(hydra_main)
    return exited.value.code, capsys.readouterr().err


@pytest.mark.parametrize(("failure", "code"), [
    (UserInputError("genotype x.json uses the unknown op 'conv_9x9'; known ops are [...]"), 2),
    (TrainingDiverged("loss became NaN/Inf at epoch 3, step 7; last good checkpoint kept"), 3),
    (errors.OutOfMemory("out of GPU memory; lower batch_size"), 4),
    (errors.Interrupted(signal.SIGINT, Path("outputs/search/x"), "search"), 130),
    (errors.Interrupted(signal.SIGTERM, Path("outputs/search/x"), "search"), 143),
])
def test_expected_failures_exit_with_one_line(failure: BaseException, code: int,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    exit_code, stderr = _exit(failure, capsys)
    assert exit_code == code
    assert stderr.count("\n") == 1 and stderr.startswith("error: ")
    assert "Traceback" not in stderr


def test_interrupted_line_says_how_to_resume(capsys: pytest.CaptureFixture[str]) -> None:
    _, stderr = _exit(errors.Interrupted(signal.SIGTERM, Path("outputs/search/x"), "search"), capsys)
    assert "SIGTERM" in stderr and "python search.py resume=outputs/search/x" in stderr


def test_bugs_keep_their_traceback() -> None:
    def hydra_main() -> None:
        raise ZeroDivisionError("a bug")

    with pytest.raises(ZeroDivisionError):
        guard.main_guard(hydra_main)


@pytest.mark.parametrize(("override", "expected"), [
    ("data=nonexistent", "Could not find 'data/nonexistent' Available options in 'data': "),
    ("no_such_key=1", "Could not override 'no_such_key'. To append to your config use "
                      "+no_such_key=1 (Key 'no_such_key' is not in struct)"),
    ("batch_size=[1", "no viable alternative at input '[1'"),
])
def test_hydra_reports_become_one_line(override: str, expected: str) -> None:
    with initialize_config_dir(CONF, version_base="1.3"):
        with pytest.raises(HydraException) as err:
            compose("train", overrides=[override])
    line = guard._one_line(err.value)
    assert expected in line and "\n" not in line and "Config search path" not in line


def test_available_options_are_listed_with_commas() -> None:
    with initialize_config_dir(CONF, version_base="1.3"):
        with pytest.raises(HydraException) as err:
            compose("train", overrides=["trainer=nope"])
    assert "Available options in 'trainer': ddp, default" in guard._one_line(err.value)
