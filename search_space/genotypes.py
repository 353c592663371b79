"""Genotype: the discrete cell architecture shared by search (derivation) and retraining.

The format is DARTS's: ``normal``/``reduce`` are flat lists of edges ``(op_name, input_index)``,
two consecutive edges per intermediate node (node ``i`` of ``steps`` may read states
``0 .. i+1``: the two cell inputs and the earlier nodes), and ``*_concat`` lists the states
concatenated into the cell output. ``random_genotype`` draws a cell under the search's derivation
rules, and ``POOR_POOL_SKIP`` is a deliberately poor cell: both are baselines for a search.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from search_space.errors import UserInputError
from search_space.ops import OPS, PARAMETER_FREE_OPS, POOL_OPS

Edge = tuple[str, int]


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _edges(field: str, value: Any) -> tuple[Edge, ...]:
    """``value`` as a tuple of ``(op, index)`` pairs (lists from JSON accepted), else UserInputError."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise UserInputError(f"genotype {field} must be a list of [op, input_index] pairs, got {value!r}")
    edges = tuple(tuple(edge) if isinstance(edge, (list, tuple)) else edge for edge in value)
    for edge in edges:
        if not (isinstance(edge, tuple) and len(edge) == 2 and isinstance(edge[0], str) and _is_index(edge[1])):
            raise UserInputError(f"genotype {field} has the edge {edge!r}: expected an [op name, integer input index] pair")
    return edges


def _indices(field: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise UserInputError(f"genotype {field} must be a list of state indices, got {value!r}")
    indices = tuple(value)
    if not all(_is_index(index) for index in indices):
        raise UserInputError(f"genotype {field} must hold integer state indices, got {list(indices)}")
    return indices


def _check_cell(kind: str, edges: tuple[Edge, ...], concat: tuple[int, ...]) -> None:
    if not edges or len(edges) % 2:
        raise UserInputError(
            f"genotype {kind} has {len(edges)} edges: every intermediate node takes exactly 2 inputs, "
            "so give 2 edges per node"
        )
    for position, (op, index) in enumerate(edges):
        node = position // 2
        if op not in OPS:
            raise UserInputError(f"genotype {kind} uses the unknown op {op!r}: known ops are {sorted(OPS)}")
        if not 0 <= index < node + 2:
            raise UserInputError(
                f"genotype {kind} edge {position} ({op!r}, {index}) feeds node {node + 2}, which can only read "
                f"states 0..{node + 1} (the two cell inputs and earlier nodes)"
            )
    steps = len(edges) // 2
    if not concat or len(set(concat)) != len(concat) or not all(2 <= index < steps + 2 for index in concat):
        raise UserInputError(
            f"genotype {kind}_concat {list(concat)} must list distinct intermediate nodes among 2..{steps + 1}"
        )


@dataclass(frozen=True)
class Genotype:
    """A cell architecture as in DARTS; lists are stored as tuples, and it is validated on creation."""

    normal: tuple[Edge, ...]
    normal_concat: tuple[int, ...]
    reduce: tuple[Edge, ...]
    reduce_concat: tuple[int, ...]

    def __post_init__(self) -> None:
        for kind in ("normal", "reduce"):
            edges = _edges(kind, getattr(self, kind))
            concat = _indices(f"{kind}_concat", getattr(self, f"{kind}_concat"))
            _check_cell(kind, edges, concat)
            object.__setattr__(self, kind, edges)  # frozen: normalize once, here
            object.__setattr__(self, f"{kind}_concat", concat)

    def cell(self, reduction: bool) -> tuple[tuple[Edge, ...], tuple[int, ...]]:
        """The edges and concat list of the reduction cell or the normal cell."""
        return (self.reduce, self.reduce_concat) if reduction else (self.normal, self.normal_concat)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Genotype:
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as error:
            raise UserInputError(f"a genotype must be JSON ({error}); write it with Genotype.to_json()") from None
        expected = {"normal", "normal_concat", "reduce", "reduce_concat"}
        if not isinstance(fields, dict) or set(fields) != expected:
            found = sorted(fields) if isinstance(fields, dict) else type(fields).__name__
            raise UserInputError(f"a genotype JSON must be an object with exactly the keys {sorted(expected)}, got {found}")
        return cls(**fields)


# Transcribed from quark0/darts cnn/genotypes.py (commit f276dd34): DARTS's transcriptions of
# NASNet-A and AmoebaNet-A, and the cells DARTS found (first-order V1, second-order V2).
_NASNET = Genotype(
    normal=[
        ("sep_conv_5x5", 1), ("sep_conv_3x3", 0), ("sep_conv_5x5", 0), ("sep_conv_3x3", 0),
        ("avg_pool_3x3", 1), ("skip_connect", 0), ("avg_pool_3x3", 0), ("avg_pool_3x3", 0),
        ("sep_conv_3x3", 1), ("skip_connect", 1),
    ],
    normal_concat=[2, 3, 4, 5, 6],
    reduce=[
        ("sep_conv_5x5", 1), ("sep_conv_7x7", 0), ("max_pool_3x3", 1), ("sep_conv_7x7", 0),
        ("avg_pool_3x3", 1), ("sep_conv_5x5", 0), ("skip_connect", 3), ("avg_pool_3x3", 2),
        ("sep_conv_3x3", 2), ("max_pool_3x3", 1),
    ],
    reduce_concat=[4, 5, 6],
)
_AMOEBANET = Genotype(
    normal=[
        ("avg_pool_3x3", 0), ("max_pool_3x3", 1), ("sep_conv_3x3", 0), ("sep_conv_5x5", 2),
        ("sep_conv_3x3", 0), ("avg_pool_3x3", 3), ("sep_conv_3x3", 1), ("skip_connect", 1),
        ("skip_connect", 0), ("avg_pool_3x3", 1),
    ],
    normal_concat=[4, 5, 6],
    reduce=[
        ("avg_pool_3x3", 0), ("sep_conv_3x3", 1), ("max_pool_3x3", 0), ("sep_conv_7x7", 2),
        ("sep_conv_7x7", 0), ("avg_pool_3x3", 1), ("max_pool_3x3", 0), ("max_pool_3x3", 1),
        ("conv_7x1_1x7", 0), ("sep_conv_3x3", 5),
    ],
    reduce_concat=[3, 4, 6],
)
_DARTS_V1 = Genotype(
    normal=[
        ("sep_conv_3x3", 1), ("sep_conv_3x3", 0), ("skip_connect", 0), ("sep_conv_3x3", 1),
        ("skip_connect", 0), ("sep_conv_3x3", 1), ("sep_conv_3x3", 0), ("skip_connect", 2),
    ],
    normal_concat=[2, 3, 4, 5],
    reduce=[
        ("max_pool_3x3", 0), ("max_pool_3x3", 1), ("skip_connect", 2), ("max_pool_3x3", 0),
        ("max_pool_3x3", 0), ("skip_connect", 2), ("skip_connect", 2), ("avg_pool_3x3", 0),
    ],
    reduce_concat=[2, 3, 4, 5],
)
_DARTS_V2 = Genotype(
    normal=[
        ("sep_conv_3x3", 0), ("sep_conv_3x3", 1), ("sep_conv_3x3", 0), ("sep_conv_3x3", 1),
        ("sep_conv_3x3", 1), ("skip_connect", 0), ("skip_connect", 0), ("dil_conv_3x3", 2),
    ],
    normal_concat=[2, 3, 4, 5],
    reduce=[
        ("max_pool_3x3", 0), ("max_pool_3x3", 1), ("skip_connect", 2), ("max_pool_3x3", 1),
        ("max_pool_3x3", 0), ("skip_connect", 2), ("skip_connect", 2), ("max_pool_3x3", 1),
    ],
    reduce_concat=[2, 3, 4, 5],
)
# Transcribed from yuhuixu1993/PC-DARTS genotypes.py (commit b74702f8): PC_DARTS_cifar, PC_DARTS_image.
_PC_DARTS_CIFAR = Genotype(
    normal=[
        ("sep_conv_3x3", 1), ("skip_connect", 0), ("sep_conv_3x3", 0), ("dil_conv_3x3", 1),
        ("sep_conv_5x5", 0), ("sep_conv_3x3", 1), ("avg_pool_3x3", 0), ("dil_conv_3x3", 1),
    ],
    normal_concat=range(2, 6),
    reduce=[
        ("sep_conv_5x5", 1), ("max_pool_3x3", 0), ("sep_conv_5x5", 1), ("sep_conv_5x5", 2),
        ("sep_conv_3x3", 0), ("sep_conv_3x3", 3), ("sep_conv_3x3", 1), ("sep_conv_3x3", 2),
    ],
    reduce_concat=range(2, 6),
)
_PC_DARTS_IMAGENET = Genotype(
    normal=[
        ("skip_connect", 1), ("sep_conv_3x3", 0), ("sep_conv_3x3", 0), ("skip_connect", 1),
        ("sep_conv_3x3", 1), ("sep_conv_3x3", 3), ("sep_conv_3x3", 1), ("dil_conv_5x5", 4),
    ],
    normal_concat=range(2, 6),
    reduce=[
        ("sep_conv_3x3", 0), ("skip_connect", 1), ("dil_conv_5x5", 2), ("max_pool_3x3", 1),
        ("sep_conv_3x3", 2), ("sep_conv_3x3", 1), ("sep_conv_5x5", 0), ("sep_conv_3x3", 3),
    ],
    reduce_concat=range(2, 6),
)
# Transcribed from chenxin061/pdarts genotypes.py (commit b880e873): PDARTS.
_PDARTS = Genotype(
    normal=[
        ("skip_connect", 0), ("dil_conv_3x3", 1), ("skip_connect", 0), ("sep_conv_3x3", 1),
        ("sep_conv_3x3", 1), ("sep_conv_3x3", 3), ("sep_conv_3x3", 0), ("dil_conv_5x5", 4),
    ],
    normal_concat=range(2, 6),
    reduce=[
        ("avg_pool_3x3", 0), ("sep_conv_5x5", 1), ("sep_conv_3x3", 0), ("dil_conv_5x5", 2),
        ("max_pool_3x3", 0), ("dil_conv_3x3", 1), ("dil_conv_3x3", 1), ("dil_conv_5x5", 3),
    ],
    reduce_concat=range(2, 6),
)

# A deliberately poor cell for sanity baselines: only pooling and (at most 2) skip ops, so the cells
# learn nothing beyond their 1x1 preprocessing; a search worth its cost should beat it clearly.
POOR_POOL_SKIP = Genotype(
    normal=[
        ("max_pool_3x3", 0), ("avg_pool_3x3", 1), ("skip_connect", 0), ("max_pool_3x3", 1),
        ("avg_pool_3x3", 0), ("max_pool_3x3", 2), ("avg_pool_3x3", 1), ("skip_connect", 3),
    ],
    normal_concat=[2, 3, 4, 5],
    reduce=[
        ("max_pool_3x3", 0), ("avg_pool_3x3", 1), ("max_pool_3x3", 1), ("skip_connect", 2),
        ("avg_pool_3x3", 0), ("max_pool_3x3", 3), ("skip_connect", 2), ("avg_pool_3x3", 4),
    ],
    reduce_concat=[2, 3, 4, 5],
)


def spike_native(genotype: Genotype) -> Genotype:
    """The same cell with DARTS's separable and dilated convs replaced by their spike-native versions
    (``spike_sep_conv_*``, ``spike_dil_conv_*``: a neuron before every conv, the 1x1 ones included)."""
    def native(op: str) -> str:
        if not op.startswith(("sep_conv_", "dil_conv_")):
            return op
        if f"spike_{op}" not in OPS:
            raise UserInputError(f"{op} has no spike-native version (known: the spike_sep_conv_* and spike_dil_conv_* "
                                 "ops); pick a genotype without it")
        return f"spike_{op}"

    def edges(cell: tuple[Edge, ...]) -> list[Edge]:
        return [(native(op), index) for op, index in cell]

    return Genotype(normal=edges(genotype.normal), normal_concat=genotype.normal_concat,
                    reduce=edges(genotype.reduce), reduce_concat=genotype.reduce_concat)


GENOTYPES: dict[str, Genotype] = {
    "NASNet": _NASNET,
    "AmoebaNet": _AMOEBANET,
    "DARTS_V1": _DARTS_V1,
    "DARTS_V2": _DARTS_V2,
    "DARTS": _DARTS_V2,  # DARTS's own alias, the default of its train.py
    "PC_DARTS": _PC_DARTS_CIFAR,
    "PC_DARTS_IMAGENET": _PC_DARTS_IMAGENET,
    "PDARTS": _PDARTS,
    "POOR_POOL_SKIP": POOR_POOL_SKIP,
    # DARTS_V2's wiring in the spike-native space: the cell that issue #45 compares with its ReLU network.
    "DARTS_V2_SPIKE_NATIVE": spike_native(_DARTS_V2),
}

_NONE_OP = "none"
_SKIP_OP = "skip_connect"


def _random_cell(candidates: Sequence[str], steps: int, rng: random.Random) -> tuple[Edge, ...]:
    """Per node, two distinct predecessors drawn uniformly, each with an op drawn uniformly."""
    edges: list[Edge] = []
    for node in range(steps):
        edges += [(rng.choice(candidates), index) for index in rng.sample(range(node + 2), 2)]
    return tuple(edges)


def check_edge_caps(candidates: Iterable[str], steps: int, caps: Sequence[tuple[str, int, Iterable[str]]]) -> None:
    """Per-cell caps ``(name, cap, ops it counts)`` that some cell of these ``candidates`` (ops other than none) can
    meet: a cap >= 0, and below the cell's 2·steps edges only with an op it does not count."""
    candidates = set(candidates)
    for name, cap, counted in caps:
        if cap < 0:
            raise UserInputError(f"{name}={cap}: pass None or a count >= 0")
        if cap < 2 * steps and candidates <= set(counted):
            raise UserInputError(f"only {', '.join(sorted(candidates))} is available but at most {cap} of "
                                 f"{2 * steps} edges may use it; add other ops or raise {name}")


def random_genotype(
    primitives: Sequence[str], steps: int, rng: random.Random, max_skip_connect: int | None,
    multiplier: int | None = None, max_parameter_free: int | None = None, max_normal_pools: int | None = None,
) -> Genotype:
    """A genotype drawn uniformly from the cells the search's derivation can produce.

    The derivation's rules hold: each node reads two distinct earlier states, never with ``none``,
    and each cell has at most ``max_skip_connect`` skip_connect edges and ``max_parameter_free`` edges of
    PARAMETER_FREE_OPS, and the normal cell at most ``max_normal_pools`` edges of POOL_OPS (None = no cap; cells
    over a cap are redrawn, so the draw stays uniform over the allowed cells). The output concatenates the last ``multiplier`` nodes (None = all ``steps``), as ``derive_genotype``
    does.
    """
    candidates = [name for name in primitives if name != _NONE_OP]
    multiplier = steps if multiplier is None else multiplier
    if steps < 1 or not 1 <= multiplier <= steps:
        raise UserInputError(f"random_genotype got steps={steps}, multiplier={multiplier}: "
                             "need steps >= 1 and 1 <= multiplier <= steps")
    if not candidates:
        raise UserInputError(f"random_genotype got the primitives {list(primitives)}: add an op other than 'none'")
    caps = [(name, cap, counted) for name, cap, counted in (("max_skip_connect", max_skip_connect, {_SKIP_OP}),
                                                            ("max_parameter_free", max_parameter_free,
                                                             PARAMETER_FREE_OPS)) if cap is not None]
    normal_caps = caps if max_normal_pools is None else [*caps, ("max_normal_pools", max_normal_pools, POOL_OPS)]
    check_edge_caps(candidates, steps, normal_caps)

    def draw(caps: list[tuple[str, int, Iterable[str]]]) -> tuple[Edge, ...]:
        while True:
            edges = _random_cell(candidates, steps, rng)
            if all(sum(op in counted for op, _ in edges) <= cap for _, cap, counted in caps):
                return edges

    concat = tuple(range(2 + steps - multiplier, 2 + steps))
    normal = draw(normal_caps)
    return Genotype(normal=normal, normal_concat=concat, reduce=draw(caps), reduce_concat=concat)


def load_genotype(name_or_path: str | Path) -> Genotype:
    """A bundled genotype by name, or one read from a JSON file written by ``Genotype.to_json``."""
    if isinstance(name_or_path, str) and name_or_path in GENOTYPES:
        return GENOTYPES[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise UserInputError(
            f"genotype {str(name_or_path)!r} is neither a bundled name ({', '.join(GENOTYPES)}) "
            "nor a genotype JSON file; pass one of those names or the path of a genotype.json"
        )
    try:
        return Genotype.from_json(path.read_text())
    except UserInputError as error:
        raise UserInputError(f"{path}: {error}") from None
