"""What the entry points check and read besides the config: the genotype train.py retrains, and that the
data's frames match the neuron's time steps."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from aso_se.run.lifecycle import Run
from search_space.errors import UserInputError
from search_space.genotypes import Genotype, load_genotype

log = logging.getLogger(__name__)


def genotype_to_train(run: Run) -> Genotype:
    """train.py's genotype: the resumed run's own, else ``genotype=``'s (see find_genotype)."""
    if run.resumed:
        return Genotype.from_json(run.state["genotype"])
    return load_genotype(find_genotype(run.cfg.genotype))


def find_genotype(name_or_path: str | None, search_root: Path = Path("outputs/search")) -> str:
    """``genotype=``'s value, or the newest ``genotype.json`` that search.py wrote."""
    if name_or_path:
        return str(name_or_path)
    found = sorted(search_root.glob("*/genotype.json"), key=lambda path: path.stat().st_mtime)
    if not found:
        raise UserInputError(f"no genotype given and no {search_root}/*/genotype.json found; run "
                             f"python search.py first, or pass genotype=<genotype.json | a bundled "
                             f"name like DARTS_V2>")
    log.info("genotype: %s (the newest search result)", found[-1])
    return str(found[-1])


def check_timesteps(data: Any, neuron: Any) -> None:
    """Event data brings its own number of frames; the network must run that many steps."""
    if data.timesteps is not None and data.timesteps != neuron.timesteps:
        raise UserInputError(f"data {data.name} has {data.timesteps} frames per sample but "
                             f"neuron.timesteps={neuron.timesteps}; set both to the same T "
                             f"(data.timesteps=<T> neuron.timesteps=<T>)")
