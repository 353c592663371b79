"""benchmarks/snn_figure.py: the binary SNN's accuracy against T drawn from the result rows."""
from __future__ import annotations

import pytest

from benchmarks import snn_figure
from benchmarks.rows import RESULTS, read_rows


def test_the_curves_are_the_newest_rows_of_each_case_and_network():
    found, relu = snn_figure.curves(read_rows(RESULTS / "binary_snn.csv"), snn_figure.DEFAULT_CASES)
    warm = found["darts_v2_8x16_level4_warm_t4", "fine-tuned SNN"]
    assert sorted(warm) == [1, 2, 4, 6, 8, 16] and warm[4] == pytest.approx(80.44)
    assert relu["darts_v2_8x16_level4_warm_t4"] == pytest.approx(80.8)
    assert not any(case.startswith("lever_") for case, _ in found)  # only the cases asked for


def test_the_figure_is_written_and_an_unknown_case_is_one_line(tmp_path, capsys):
    out = tmp_path / "figure.png"
    assert snn_figure.main(["--cases", "darts_v2_8x16_level4_warm_t4", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert snn_figure.main(["--cases", "no_such_case", "--out", str(tmp_path / "other.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no accuracy-against-T rows for no_such_case" in err
    assert not (tmp_path / "other.png").exists()
