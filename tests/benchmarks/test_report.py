"""benchmarks/report.py: RESULTS.md is what the result rows and the template give, and the tables read the rows."""
import csv
import re

import pytest

from benchmarks import report
from benchmarks.rows import COLUMNS, Measurement, append_rows, read_rows


def test_results_md_is_what_the_rows_give():
    assert report.main(["--check"]) == 0, "run `python benchmarks/report.py` and commit benchmarks/RESULTS.md"


def test_the_searched_vs_random_table_is_computed_from_the_rows():
    text = report.table("search_vs_random")
    assert "| full/searched | 3 | **92.98 ± 0.25** (92.8, 93.26, 92.88)" in text
    assert "| full/random | 3 | **93.18 ± 0.35** (92.81, 93.51, 93.21)" in text
    assert "| full/DARTS_V2 | 1 | 93.52 |" in text
    assert "/ranking |" not in text and "/searches |" not in text  # rows of other metrics: the next table's


def test_the_ranking_against_the_full_budget_is_its_own_table():
    text = report.table("search_vs_random_agreement")
    # the 5-epoch proxy of the full benchmark's seven cells, ranked from the rows (recorded before: τ-b 0.14)
    assert "| proxy 5 epochs, 8×16/ranking | Kendall τ-b against the full budget | 0.143 |" in text
    assert "| full/" not in text


def test_every_template_placeholder_has_a_table_and_every_table_a_rows_file():
    placeholders = set(report.re.findall(r"\{\{(\w+)\}\}", report.TEMPLATE.read_text()))
    assert placeholders == set(report.TABLES)
    for spec in report.TABLES.values():
        for file in [target.file for target in spec.targets] if isinstance(spec, report.Targets) else [spec.file]:
            read_rows(report.RESULTS / file)  # exists, with the shared columns


def test_appended_rows_show_newest_first_and_a_file_without_rows_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(report.TABLES, "binary_snn", report.Latest("binary.csv"))
    (tmp_path / "binary.csv").write_text(",".join(COLUMNS) + "\n")
    assert report.table("binary_snn", tmp_path) == "No rows yet (`benchmarks/results/binary.csv`)."
    append_rows(tmp_path / "binary.csv", [Measurement("binary_T4", "accuracy", 90.0, "%")], command="python x.py")
    append_rows(tmp_path / "binary.csv", [Measurement("binary_T4", "accuracy", 91.25, "%", "seed 0")],
                command="python x.py --again")
    rows = read_rows(tmp_path / "binary.csv")
    assert [row["value"] for row in rows] == ["90.0", "91.25"] and rows[0]["gpu"] == "cpu"
    text = report.table("binary_snn", tmp_path)
    assert "| binary_T4 | accuracy | 91.25 % | seed 0 | cpu |" in text and "90 %" not in text
    assert "- c1: `python x.py --again`" in text


def test_detail_metrics_stay_in_the_rows_file(tmp_path, monkeypatch):
    monkeypatch.setitem(report.TABLES, "speed", report.Latest("speed.csv", skip_endings=(": peak memory",)))
    (tmp_path / "speed.csv").write_text(",".join(COLUMNS) + "\n")
    append_rows(tmp_path / "speed.csv", [Measurement("step", "net: throughput", 4741.0, "images/s"),
                                         Measurement("step", "net: peak memory", 43.2, "GiB")], command="python s.py")
    text = report.table("speed", tmp_path)
    assert "| step | net: throughput | 4,741 images/s |" in text and "peak memory" not in text


def test_a_step_time_beside_its_throughput_stays_in_the_rows_file(tmp_path, monkeypatch):
    monkeypatch.setitem(report.TABLES, "speed", report.Latest("speed.csv", steps_with_throughput=False))
    (tmp_path / "speed.csv").write_text(",".join(COLUMNS) + "\n")
    append_rows(tmp_path / "speed.csv", [Measurement("step", "net: throughput", 4741.0, "images/s"),
                                         Measurement("step", "net: step", 216.0, "ms"),
                                         Measurement("search", "supernet: step", 289.3, "ms")], command="python s.py")
    text = report.table("speed", tmp_path)
    assert "| step | net: throughput |" in text and "| search | supernet: step | 289.3 ms |" in text
    assert "| step | net: step |" not in text


def test_a_rows_file_with_other_columns_is_refused(tmp_path):
    path = tmp_path / "bad.csv"
    with open(path, "w", newline="") as out:
        csv.writer(out).writerow(["case", "value"])
    with pytest.raises(ValueError, match="expected"):
        read_rows(path)


def test_the_readmes_links_into_results_md_name_its_sections():
    def anchor(heading: str) -> str:  # GitHub's: lower case, punctuation dropped, spaces to hyphens
        return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")

    results = report.REPORT.read_text().splitlines()
    anchors = {anchor(line.lstrip("#")) for line in results if line.startswith("#")}
    readme = (report.HERE.parent / "README.md").read_text()
    links = re.findall(r"benchmarks/RESULTS\.md#([\w\-]+)", readme)
    assert links and set(links) <= anchors, set(links) - anchors


def test_the_roofline_is_a_table_per_network_with_a_row_per_kernel_class():
    text = report.table("roofline")
    assert "| | least bytes (GB) | time (ms) | achieved bandwidth (GB/s) | share of HBM bandwidth (%) |" in text
    assert "| quantizer / neuron | 80.23 | 29.18 | 2,749 | 82.1 |" in text  # the H100 rows of speed.csv
    assert "| copy / layout | 0 | 17.32 | — | — |" in text  # no floor: no bandwidth to show
    assert "| roofline |" not in report.table("speed")  # not repeated in the speed table


def test_a_target_reads_the_newest_figure_of_each_of_its_cases(tmp_path, monkeypatch):
    """Gaps against a reference metric of the same case, every case needed for a yes, a miss shown as one."""
    gap = report.Target("SNN at T = 4 − ReLU", "b.csv", "SNN, T = 4", -2.0, cases=("net", "net_seed1"),
                        minus="ReLU ANN test accuracy")
    speed = report.Target("step", "s.csv", "net: throughput", 6000)
    monkeypatch.setitem(report.TABLES, "targets", report.Targets((gap, speed)))
    for name in ("b.csv", "s.csv"):
        (tmp_path / name).write_text(",".join(COLUMNS) + "\n")
    text = report.table("targets", tmp_path)
    assert "| SNN at T = 4 − ReLU ≥ −2 | — | not measured |" in text and "| step ≥ 6,000 | — | not measured |" in text

    append_rows(tmp_path / "b.csv", [Measurement("net", "SNN, T = 4", 79.9, "%"),
                                     Measurement("net", "ReLU ANN test accuracy", 81.0, "%")], command="python t.py")
    append_rows(tmp_path / "s.csv", [Measurement("step", "net: throughput", 6100.0, "images/s")], command="python s.py")
    text = report.table("targets", tmp_path)
    assert "| SNN at T = 4 − ReLU ≥ −2 | −1.10 | 1 of 2 measured |" in text  # seed 1 still to run
    assert "| step ≥ 6,000 | 6,100 | yes |" in text

    append_rows(tmp_path / "b.csv", [Measurement("net_seed1", "SNN, T = 4", 78.0, "%"),
                                     Measurement("net_seed1", "ReLU ANN test accuracy", 80.5, "%")],
                command="python t.py --seed 1")
    append_rows(tmp_path / "s.csv", [Measurement("step", "net: throughput", 5900.0, "images/s")], command="python s.py")
    text = report.table("targets", tmp_path)
    assert "| SNN at T = 4 − ReLU ≥ −2 | −1.10, −2.50 | **no** |" in text and "c1, c2" in text
    assert "| step ≥ 6,000 | 5,900 | **no** |" in text  # the newest row, not the best

    append_rows(tmp_path / "b.csv", [Measurement("net_seed1", "SNN, T = 4", 79.0, "%")], command="python t.py --again")
    assert "| SNN at T = 4 − ReLU ≥ −2 | −1.10, −1.50 | yes |" in report.table("targets", tmp_path)
