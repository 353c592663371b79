"""Genotype: JSON round trip, validation with clear messages, bundled cells, load_genotype."""
import dataclasses
import json

import pytest

from search_space.errors import UserInputError
from search_space.genotypes import GENOTYPES, Genotype, load_genotype

DARTS_V2_JSON = {
    "normal": [["sep_conv_3x3", 0], ["sep_conv_3x3", 1], ["sep_conv_3x3", 0], ["sep_conv_3x3", 1],
               ["sep_conv_3x3", 1], ["skip_connect", 0], ["skip_connect", 0], ["dil_conv_3x3", 2]],
    "normal_concat": [2, 3, 4, 5],
    "reduce": [["max_pool_3x3", 0], ["max_pool_3x3", 1], ["skip_connect", 2], ["max_pool_3x3", 1],
               ["max_pool_3x3", 0], ["skip_connect", 2], ["skip_connect", 2], ["max_pool_3x3", 1]],
    "reduce_concat": [2, 3, 4, 5],
}


def edit(**changes) -> str:
    return json.dumps({**DARTS_V2_JSON, **changes})


@pytest.mark.parametrize("name", sorted(GENOTYPES))
def test_json_round_trip_keeps_tuples(name):
    genotype = GENOTYPES[name]
    loaded = Genotype.from_json(genotype.to_json())
    assert loaded == genotype and hash(loaded) == hash(genotype)
    assert isinstance(loaded.normal, tuple) and all(isinstance(edge, tuple) for edge in loaded.normal)
    assert isinstance(loaded.reduce_concat, tuple)


def test_json_is_darts_shaped_and_matches_the_bundled_darts_v2():
    assert json.loads(GENOTYPES["DARTS_V2"].to_json()) == DARTS_V2_JSON
    assert Genotype.from_json(json.dumps(DARTS_V2_JSON)) == GENOTYPES["DARTS_V2"]


def test_genotype_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        GENOTYPES["DARTS_V2"].normal = ()


def test_bundled_names():
    assert {"DARTS_V1", "DARTS_V2", "PC_DARTS"} <= set(GENOTYPES)
    assert GENOTYPES["DARTS"] is GENOTYPES["DARTS_V2"]


def test_darts_v1_differs_from_v2_where_the_paper_says():
    v1, v2 = GENOTYPES["DARTS_V1"], GENOTYPES["DARTS_V2"]
    assert v1.normal[0] == ("sep_conv_3x3", 1) and v2.normal[0] == ("sep_conv_3x3", 0)
    assert v1.reduce[-1] == ("avg_pool_3x3", 0) and v2.reduce[-1] == ("max_pool_3x3", 1)


def test_cell_picks_the_cell_type():
    genotype = GENOTYPES["PC_DARTS"]
    assert genotype.cell(reduction=True) == (genotype.reduce, (2, 3, 4, 5))
    assert genotype.cell(reduction=False) == (genotype.normal, (2, 3, 4, 5))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (edit(normal=DARTS_V2_JSON["normal"][:7]), "genotype normal has 7 edges: every intermediate node takes exactly 2 inputs"),
        (edit(reduce=[["max_pool_3x3", 0], ["conv_9x9", 1]]), "genotype reduce uses the unknown op 'conv_9x9': known ops are"),
        (edit(normal=[["sep_conv_3x3", 0], ["sep_conv_3x3", 2]]), r"edge 1 \('sep_conv_3x3', 2\) feeds node 2, which can only read states 0..1"),
        (edit(normal=[["sep_conv_3x3", -1], ["sep_conv_3x3", 1]]), "feeds node 2"),
        (edit(normal=[["sep_conv_3x3", 0, 1], ["sep_conv_3x3", 1]]), "expected an \\[op name, integer input index\\] pair"),
        (edit(normal=[["sep_conv_3x3", "0"], ["sep_conv_3x3", 1]]), "expected an \\[op name, integer input index\\] pair"),
        (edit(normal=[["sep_conv_3x3", True], ["sep_conv_3x3", 1]]), "expected an \\[op name, integer input index\\] pair"),
        (edit(normal="sep_conv_3x3"), "must be a list of \\[op, input_index\\] pairs"),
        (edit(normal_concat=[2, 3, 4, 6]), r"normal_concat \[2, 3, 4, 6\] must list distinct intermediate nodes among 2..5"),
        (edit(reduce_concat=[]), "reduce_concat"),
        (edit(reduce_concat=[2, 2]), "distinct"),
        (edit(normal_concat=[2.0, 3]), "integer state indices"),
        (json.dumps({k: v for k, v in DARTS_V2_JSON.items() if k != "reduce"}), "exactly the keys"),
        (json.dumps([1, 2]), "exactly the keys"),
        ("Genotype(normal=[...])", "a genotype must be JSON"),
    ],
)
def test_malformed_genotype_gives_a_clear_error(text, message):
    with pytest.raises(UserInputError, match=message):
        Genotype.from_json(text)


def test_load_genotype_by_name_and_path(tmp_path):
    assert load_genotype("PC_DARTS") is GENOTYPES["PC_DARTS"]
    path = tmp_path / "genotype.json"
    path.write_text(GENOTYPES["PDARTS"].to_json())
    assert load_genotype(path) == load_genotype(str(path)) == GENOTYPES["PDARTS"]


def test_load_genotype_errors_name_the_file(tmp_path):
    with pytest.raises(UserInputError, match="neither a bundled name .*DARTS_V2.* nor a genotype JSON file"):
        load_genotype("DARTS_V3")
    broken = tmp_path / "genotype.json"
    broken.write_text(edit(reduce=[["max_pool_3x3", 0], ["conv_9x9", 1]]))
    with pytest.raises(UserInputError, match=f"{broken}: genotype reduce uses the unknown op 'conv_9x9'"):
        load_genotype(broken)
