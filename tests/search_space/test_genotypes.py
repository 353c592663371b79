"""Genotype: JSON round trip, validation with clear messages, bundled cells, load_genotype, random_genotype."""
import collections
import dataclasses
import json
import random
from pathlib import Path

import pytest

from search_space.errors import UserInputError
from search_space.genotypes import GENOTYPES, POOR_POOL_SKIP, Genotype, load_genotype, random_genotype
from search_space.ops import PARAMETER_FREE_OPS, POOL_OPS, PRIMITIVE_SETS

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


DARTS = PRIMITIVE_SETS["darts"]


def skips(edges) -> int:
    return sum(op == "skip_connect" for op, _ in edges)


def test_poor_pool_skip_has_only_pooling_and_capped_skips_and_reads_both_inputs():
    assert load_genotype("POOR_POOL_SKIP") is POOR_POOL_SKIP
    for kind in ("normal", "reduce"):
        edges, concat = POOR_POOL_SKIP.cell(reduction=kind == "reduce")
        assert {op for op, _ in edges} <= {"max_pool_3x3", "avg_pool_3x3", "skip_connect"}
        assert skips(edges) <= 2 and concat == (2, 3, 4, 5)
        assert {0, 1} <= {index for _, index in edges}  # both cell inputs (and their 1x1 preprocessing) are used


def check_derivable(genotype: Genotype, primitives, steps: int, max_skip_connect) -> None:
    """The derivation's rules: 2 distinct earlier states per node, no none, the skip cap per cell."""
    for kind in ("normal", "reduce"):
        edges, concat = genotype.cell(reduction=kind == "reduce")
        assert len(edges) == 2 * steps
        for node in range(steps):
            (op_a, a), (op_b, b) = edges[2 * node: 2 * node + 2]
            assert a != b and 0 <= a < node + 2 and 0 <= b < node + 2
            assert op_a in primitives and op_b in primitives and "none" not in (op_a, op_b)
        if max_skip_connect is not None:
            assert skips(edges) <= max_skip_connect


@pytest.mark.parametrize("max_skip_connect", [2, 0, None])
def test_random_genotype_follows_the_derivation_rules_over_many_draws(max_skip_connect):
    rng = random.Random(7)
    draws = [random_genotype(DARTS, 4, rng, max_skip_connect) for _ in range(300)]
    for genotype in draws:
        check_derivable(genotype, DARTS, 4, max_skip_connect)
        assert genotype.normal_concat == genotype.reduce_concat == (2, 3, 4, 5)
    ops = collections.Counter(op for genotype in draws for op, _ in genotype.normal + genotype.reduce)
    expected = set(DARTS) - {"none"} - ({"skip_connect"} if max_skip_connect == 0 else set())
    assert set(ops) == expected
    # Uniform over the ops: each convolution and pooling op takes about 1/7 (1/6 without skips) of the edges.
    share = 1 / len(expected)
    total = sum(ops.values())
    assert all(abs(ops[op] / total - share) < 0.03 for op in expected if op != "skip_connect")
    inputs = collections.Counter(index for genotype in draws for _, index in genotype.normal[6:8])
    # Node 3 reads 2 distinct states of 0..4: each state feeds about 600 / 5 = 120 of its 600 edges.
    assert set(inputs) == {0, 1, 2, 3, 4} and min(inputs.values()) > 80
    if max_skip_connect is None:
        assert max(skips(g.normal) for g in draws) > 2  # the cap is what keeps the capped draws at 2


def test_random_genotype_is_seeded_and_varies():
    first = [random_genotype(DARTS, 4, random.Random(seed), 2) for seed in range(5)]
    again = [random_genotype(DARTS, 4, random.Random(seed), 2) for seed in range(5)]
    assert first == again
    assert len(set(first)) == 5
    assert first[0].normal != first[0].reduce  # the two cell types are drawn independently


def test_random_genotype_other_spaces_and_multiplier():
    spiking = PRIMITIVE_SETS["spiking"]
    genotype = random_genotype(spiking, 3, random.Random(0), 1, multiplier=2)
    check_derivable(genotype, spiking, 3, 1)
    assert genotype.normal_concat == (3, 4)
    assert Genotype.from_json(genotype.to_json()) == genotype


@pytest.mark.parametrize(
    ("primitives", "steps", "cap", "multiplier", "message"),
    [
        (["none"], 4, 2, None, "add an op other than 'none'"),
        (["none", "skip_connect"], 4, 2, None, "only skip_connect is available"),
        (DARTS, 0, 2, None, "need steps >= 1"),
        (DARTS, 4, 2, 5, "1 <= multiplier <= steps"),
        (DARTS, 4, -1, None, "max_skip_connect=-1"),
    ],
)
def test_random_genotype_bad_input(primitives, steps, cap, multiplier, message):
    with pytest.raises(UserInputError, match=message):
        random_genotype(primitives, steps, random.Random(0), cap, multiplier=multiplier)


def test_random_genotype_keeps_the_parameter_free_cap():
    draws = [random_genotype(DARTS, 4, random.Random(seed), 2, max_parameter_free=2) for seed in range(100)]
    counts = [sum(op in PARAMETER_FREE_OPS for op, _ in edges) for g in draws for edges in (g.normal, g.reduce)]
    assert max(counts) == 2 and min(counts) == 0  # the cap binds (3 of 7 ops are free: ~3.4 edges of 8 uncapped)
    with pytest.raises(UserInputError, match="avg_pool_3x3, max_pool_3x3 is available.*raise max_parameter_free"):
        random_genotype(["none", "max_pool_3x3", "avg_pool_3x3"], 4, random.Random(0), 2, max_parameter_free=7)
    with pytest.raises(UserInputError, match="max_parameter_free=-1"):
        random_genotype(DARTS, 4, random.Random(0), 2, max_parameter_free=-1)


def test_random_genotype_keeps_the_normal_pool_cap_and_draws_as_before_without_it():
    draws = [random_genotype(DARTS, 4, random.Random(seed), 2, max_normal_pools=0) for seed in range(50)]
    assert not any(op in POOL_OPS for g in draws for op, _ in g.normal)
    assert any(op in POOL_OPS for g in draws for op, _ in g.reduce)  # the reduction cell is not capped
    # without the cap the draws are those of the committed full-budget benchmark's random cells
    committed = Path(__file__).resolve().parents[2] / "benchmarks/results/genotypes"
    assert all(random_genotype(DARTS, 4, random.Random(seed), 2, max_normal_pools=None)
               == load_genotype(committed / f"random_{seed}.json") for seed in range(3))
    with pytest.raises(UserInputError, match="avg_pool_3x3, max_pool_3x3 is available.*raise max_normal_pools"):
        random_genotype(["none", "max_pool_3x3", "avg_pool_3x3"], 4, random.Random(0), 2, max_normal_pools=0)


def test_spike_native_keeps_the_wiring_and_swaps_the_weighted_ops():
    from search_space.genotypes import spike_native
    from search_space.ops import SPIKE_NATIVE_PRIMITIVES
    darts, native = GENOTYPES["DARTS_V2"], GENOTYPES["DARTS_V2_SPIKE_NATIVE"]
    assert native == spike_native(darts)
    for kind in ("normal", "reduce"):
        for (op, index), (native_op, native_index) in zip(getattr(darts, kind), getattr(native, kind)):
            assert native_index == index and native_op in SPIKE_NATIVE_PRIMITIVES
            assert native_op == (f"spike_{op}" if "conv" in op else op)
    assert native.normal != darts.normal and native.reduce == darts.reduce  # V2's reduction cell has no convs
    with pytest.raises(UserInputError, match="sep_conv_7x7 has no spike-native version"):
        spike_native(GENOTYPES["AmoebaNet"])
