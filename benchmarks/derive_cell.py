"""A searched cell derived again from the search's α under other caps per cell, without a new search.

search.py writes each cycle's α beside its genotype (``alphas/cycle_<k>.json``); older runs have it in their
checkpoint. DARTS's rule with other caps (``--max-parameter-free``: pool and skip edges per cell,
``--max-skip-connect``: skips, ``--max-normal-pools``: pools in the normal cell; ``none`` lifts a cap; default: the
run's own) gives another cell of the same search,
e.g. issue #44's capped cell beside the one the search wrote, both retrained alike. Prints both cells' parameter-free
edges; writes the new genotype JSON (what ``train.py genotype=`` reads):

    python benchmarks/derive_cell.py --run <search run dir> --max-parameter-free 2 --out capped.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from aso_se.run.atomic_write import save_json  # noqa: E402
from aso_se.run.checkpoint import load_checkpoint  # noqa: E402
from aso_se.search.derive import derive_genotype  # noqa: E402
from aso_se.search.strength import parameter_free  # noqa: E402
from aso_se.search.supernet import CELL_TYPES  # noqa: E402
from search_space.errors import UserInputError  # noqa: E402
from search_space.genotypes import Genotype  # noqa: E402


def final_alpha(run_dir: Path) -> tuple[dict, dict]:
    """(softmax(α) of the search's last cycle with its primitives, steps and multiplier; the run's config)."""
    config = OmegaConf.load(run_dir / ".hydra" / "config.yaml") if (run_dir / ".hydra" / "config.yaml").is_file() \
        else None
    cycles = sorted((run_dir / "alphas").glob("cycle_*.json"), key=lambda path: int(path.stem.split("_")[1]))
    if cycles:
        return json.loads(cycles[-1].read_text()), config
    checkpoint = run_dir / "checkpoints" / "last.pt"
    if not checkpoint.is_file():
        raise UserInputError(f"--run {run_dir}: neither alphas/cycle_<k>.json nor checkpoints/last.pt; pass a "
                             "search run dir (runs before α was written beside the genotypes need their checkpoint)")
    state = load_checkpoint(checkpoint, kind="search")
    config = OmegaConf.create(state["config"])
    space = instantiate(config.search_space)
    supernet = state["engine"]["supernet"]
    alpha = {"primitives": list(space.primitives), "steps": space.steps, "multiplier": space.multiplier}
    for kind in CELL_TYPES:
        logits = entry(supernet, f"arch.{kind}.alpha").float().masked_fill(
            ~entry(supernet, f"arch.{kind}.op_mask").bool(), float("-inf"))
        alpha[kind] = torch.softmax(logits, dim=-1).tolist()
    return alpha, config


def entry(state: dict, suffix: str) -> torch.Tensor:
    matches = [key for key in state if key == suffix or key.endswith(f".{suffix}")]
    if len(matches) != 1:
        raise UserInputError(f"the search checkpoint has {len(matches)} entries named *{suffix}, expected 1")
    return state[matches[0]]


def derive(alpha: dict, max_skip_connect: int | None, max_parameter_free: int | None,
           max_normal_pools: int | None = None) -> Genotype:
    return derive_genotype(torch.tensor(alpha["normal"]), torch.tensor(alpha["reduce"]), alpha["primitives"],
                           steps=alpha["steps"], multiplier=alpha["multiplier"], max_skip_connect=max_skip_connect,
                           max_parameter_free=max_parameter_free, max_normal_pools=max_normal_pools)


def cap(text: str) -> int | str | None:
    """A cap's command-line value: a count >= 0, none, or run (the run's own cap, the default)."""
    if text == "run":
        return text
    if text.lower() in ("none", "null"):
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: a count of edges (0, 1, 2, ...) or none")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a finished search's run dir")
    parser.add_argument("--out", type=Path, required=True, help="where the new genotype JSON goes")
    parser.add_argument("--max-parameter-free", type=cap, default="run",
                        help="pool/skip edges per cell, none, or run (default)")
    parser.add_argument("--max-skip-connect", type=cap, default="run",
                        help="skip edges per cell, none, or run (default)")
    parser.add_argument("--max-normal-pools", type=cap, default="run",
                        help="pool edges in the normal cell, none, or run (default)")
    args = parser.parse_args(argv)
    try:
        if args.out.exists():
            raise UserInputError(f"--out {args.out} exists; pass a new path (nothing is overwritten)")
        alpha, config = final_alpha(args.run)
        evolution = config.search.evolution if config is not None else {}
        caps = {name: evolution.get(name) if getattr(args, name) == "run" else getattr(args, name)
                for name in ("max_skip_connect", "max_parameter_free", "max_normal_pools")}
        written = args.run / "genotype.json"
        found = derive(alpha, evolution.get("max_skip_connect"), evolution.get("max_parameter_free"),
                       evolution.get("max_normal_pools"))
        if written.is_file() and Genotype.from_json(written.read_text()) != found:
            raise UserInputError(f"the last cycle's α with the run's caps does not give {written}; is the search "
                                 "finished? (resume it first)")
        genotype = derive(alpha, **caps)
    except (UserInputError, FileNotFoundError) as error:
        print(f"derive_cell: {error}", file=sys.stderr)
        return 2
    save_json(json.loads(genotype.to_json()), args.out)
    print(f"the search's cell: parameter-free edges {parameter_free(found)}")
    print(f"with {caps}: parameter-free edges {parameter_free(genotype)} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
