"""Does α pick the ops the supernet's weights need? Each edge's ops judged by the supernet's accuracy.

A search derives its cell from α (DARTS's rule: per node the two edges with the strongest op). Here a search's
checkpoint is judged by its weights instead (DARTS-PT's question, without its fine-tuning): the supernet's single
best path (every edge its α-argmax op) is the base; each edge in turn takes every other op, or none (the edge cut),
and the test accuracy of that path is measured. An op's strength on its edge is that accuracy minus the accuracy
with the edge cut; DARTS's rule on the strengths instead of α gives a second cell. Batch norms use the batch's
statistics (their running ones were gathered on sampled mixtures of ops, not on one path), on batches that mix the
classes (``mixed_batches``). Prints a per-edge table and both cells' parameter-free edges; writes
DIR/op_strength.json:

    python benchmarks/op_strength.py --run <search run dir> [--images 1000] [data.root=<cifar10>]
"""
from __future__ import annotations

import argparse
import dataclasses
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

from aso_se.run.checkpoint import load_checkpoint, save_json  # noqa: E402
from aso_se.search.arch_params import ArchSample  # noqa: E402
from aso_se.search.derive import NONE_OP, derive_genotype, supernet_genotype  # noqa: E402
from aso_se.search.supernet import CELL_TYPES, SearchNetwork  # noqa: E402
from benchmarks.common import with_overrides  # noqa: E402
from search_space.errors import UserInputError  # noqa: E402
from search_space.genotypes import Genotype  # noqa: E402
from search_space.ops import PARAMETER_FREE_OPS  # noqa: E402


def load_supernet(run_dir: Path, overrides: Sequence[str], images: int, device: str):
    """The searched supernet of ``run_dir``'s last checkpoint, its config, and a test loader of ``images`` images."""
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt", kind="search")
    cfg = with_overrides(OmegaConf.create(state["config"]), overrides)
    cfg.data.max_test_samples = images
    data, neuron = instantiate(cfg.data), instantiate(cfg.neuron)
    engine = instantiate(cfg.search, _convert_="object")(
        search_space=instantiate(cfg.search_space), neuron=neuron, num_classes=data.num_classes,
        in_channels=data.in_channels, optim=instantiate(cfg.optim, _convert_="object"), device=device,
        precision="fp32", seed=cfg.seed)
    # the analysis draws no Gumbel noise, and a GPU run's generator state does not load into a CPU generator
    engine.load_state_dict({**state["engine"], "gumbel_rng": engine.step.draws.generator_state()})
    _, test = data.train_loaders(cfg.batch_size, seed=cfg.seed)
    return engine.supernet, cfg, test


def with_op(sample: ArchSample, edge: int, op: int) -> ArchSample:
    """``sample`` (one op per edge) with ``edge`` computing ``op`` instead."""
    chosen = sample.chosen.clone()
    chosen[edge, 0] = op
    active = tuple((op,) if e == edge else ops for e, ops in enumerate(sample.active_ops))
    return dataclasses.replace(sample, chosen=chosen, active_ops=active)


@torch.no_grad()
def correct(supernet: SearchNetwork, samples: Sequence[ArchSample], batches: Sequence[tuple[torch.Tensor, ...]]
            ) -> torch.Tensor:
    """Which test images the path ``samples`` classifies right (bool, on the CPU); batch norms on the batch's
    statistics, everything else in eval mode."""
    supernet.eval()
    for module in supernet.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.train()
    return torch.cat([(supernet(x, samples, arch_grad=False).argmax(dim=1) == y).cpu() for x, y in batches])


def mixed_batches(loader, batch_size: int, seed: int, device: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The loader's images in one fixed shuffled order, in batches of ``batch_size``. The test set comes sorted by
    class, and batch norms on the statistics of a one-class batch misjudge every path (RESULTS.md, issue #44)."""
    images, labels = (torch.cat(parts) for parts in zip(*((x, y) for x, y, *_ in loader)))
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    return [(images[part].to(device), labels[part].to(device)) for part in torch.split(order, batch_size)]


def strengths(supernet: SearchNetwork, batches: Sequence[tuple[torch.Tensor, ...]]) -> dict:
    """Per cell type ``[edges, ops]`` accuracies of the base path with one edge changed, the base's, and how many
    images each changed path judges otherwise than the base (``discordant``: the paired difference's standard error
    is about sqrt(discordant) / images, McNemar's)."""
    primitives = supernet.search_space.primitives
    none = primitives.index(NONE_OP) if NONE_OP in primitives else None
    base = supernet.argmax_sample()
    base_correct = correct(supernet, base, batches)
    result = {"base_accuracy": base_correct.float().mean().item(), "accuracy": {}, "discordant": {}}
    for kind_index, kind in enumerate(CELL_TYPES):
        mask = supernet.arch[kind].op_mask.cpu()
        accuracies, discordant = [], []
        for edge in range(mask.shape[0]):
            edge_accuracies, edge_discordant = [], []
            for op in range(len(primitives)):
                right = None  # an op pruned for good (stale weights) is not judged; a cut needs no weights
                if mask[edge, op] or op == none:
                    samples = list(base)
                    samples[kind_index] = with_op(base[kind_index], edge, op)
                    right = correct(supernet, samples, batches)
                edge_accuracies.append(None if right is None else right.float().mean().item())
                edge_discordant.append(None if right is None else int((right != base_correct).sum()))
            accuracies.append(edge_accuracies)
            discordant.append(edge_discordant)
        result["accuracy"][kind], result["discordant"][kind] = accuracies, discordant
    return result


def strength_genotype(accuracies: dict, primitives: Sequence[str], steps: int, multiplier: int,
                      max_skip_connect: int | None, max_parameter_free: int | None) -> Genotype:
    """DARTS's rule on strengths: an op's accuracy on its edge minus the accuracy with the edge cut (``none``);
    the search's caps as for its α cell."""
    if NONE_OP not in primitives:
        raise UserInputError(f"the search space {list(primitives)} has no none op to cut an edge with")
    none = primitives.index(NONE_OP)
    scores = {}
    for kind, table in accuracies.items():
        scores[kind] = torch.tensor([[-float("inf") if acc is None else acc - row[none] for acc in row]
                                     for row in table], dtype=torch.float64)
    return derive_genotype(scores["normal"], scores["reduce"], primitives, steps=steps, multiplier=multiplier,
                           max_skip_connect=max_skip_connect, max_parameter_free=max_parameter_free)


def parameter_free(genotype: Genotype) -> dict[str, int]:
    return {kind: sum(op in PARAMETER_FREE_OPS for op, _ in getattr(genotype, kind)) for kind in CELL_TYPES}


def report(result: dict, primitives: Sequence[str], alpha: dict[str, torch.Tensor]) -> str:
    lines = [f"base path (every edge its α-argmax op): test accuracy {result['base_accuracy']:.4f}", "",
             "| cell | edge | α-argmax op (p) | strongest op (accuracy ± 2 SE of its gain) | edge cut |",
             "|---|---:|---|---|---:|"]
    none = primitives.index(NONE_OP)
    for kind, table in result["accuracy"].items():
        for edge, row in enumerate(table):
            probs = alpha[kind][edge]
            chosen = max((op for op in range(len(primitives)) if op != none), key=lambda op: float(probs[op]))
            best = max((op for op in range(len(primitives)) if op != none and row[op] is not None),
                       key=lambda op: row[op])
            error = 2 * result["discordant"][kind][edge][best] ** 0.5 / result["images"]
            lines.append(f"| {kind} | {edge} | {primitives[chosen]} ({float(probs[chosen]):.2f}) | "
                         f"{primitives[best]} ({row[best]:.4f} ± {error:.4f}) | {row[none]:.4f} |")
    for name in ("alpha_genotype", "strength_genotype"):
        lines.append(f"{name}: parameter-free edges {result[name + '_parameter_free']}: {result[name]}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a search run dir with checkpoints/last.pt")
    parser.add_argument("--images", type=int, default=1000, help="test images (stratified); default 1000")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("overrides", nargs="*", help="where this machine keeps the data, e.g. data.root=<cifar10>")
    args = parser.parse_args(argv)
    try:
        if args.images < 1:
            raise UserInputError(f"--images {args.images}: need at least 1")
        if not (args.run / "checkpoints" / "last.pt").is_file():
            raise UserInputError(f"--run {args.run}: no checkpoints/last.pt; pass a search run dir that kept its "
                                 "checkpoint (the benchmark dirs in git keep none)")
        bad = [o for o in args.overrides if o.split("=", 1)[0].lstrip("+") not in ("data.root", "data.num_workers")]
        if bad:
            raise UserInputError(f"overrides {bad}: only data.root and data.num_workers may change")
        supernet, cfg, test = load_supernet(args.run, args.overrides, args.images, args.device)
        batches = mixed_batches(test, cfg.batch_size, cfg.seed, args.device)
        result = strengths(supernet, batches)
        space = supernet.search_space
        evolution = cfg.search.evolution
        caps = evolution.max_skip_connect, evolution.get("max_parameter_free")  # absent in runs before that cap
        alpha_cell = supernet_genotype(supernet, *caps)
        strong_cell = strength_genotype(result["accuracy"], space.primitives, space.steps, space.multiplier, *caps)
        result.update(images=sum(len(y) for _, y in batches), primitives=list(space.primitives),
                      alpha_genotype=json.loads(alpha_cell.to_json()),
                      alpha_genotype_parameter_free=parameter_free(alpha_cell),
                      strength_genotype=json.loads(strong_cell.to_json()),
                      strength_genotype_parameter_free=parameter_free(strong_cell))
    except (UserInputError, FileNotFoundError) as error:
        print(f"op_strength: {error}", file=sys.stderr)
        return 2
    save_json(result, args.run / "op_strength.json")
    print(report(result, space.primitives, supernet.alpha_probabilities()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
