"""Does α pick the ops the supernet's weights need? Each edge's ops judged by the supernet's accuracy.

A search derives its cell from α (DARTS's rule: per node the two edges with the strongest op). Here a search's
checkpoint is judged by its weights instead, on test images, by ``aso_se.search.strength`` (what ``search.py
derive=strength`` does on the α split at the end of a search): each edge's ops by the accuracy of the single path
they join, and DARTS's rule on those strengths gives a second cell. Prints a per-edge table and both cells'
parameter-free edges; writes DIR/op_strength.json:

    python benchmarks/op_strength.py --run <search run dir> [--images 1000] [--split test|arch] [data.root=<cifar10>]
"""
from __future__ import annotations

import argparse
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
from aso_se.search.derive import NONE_OP, supernet_genotype  # noqa: E402
from aso_se.search.strength import cells_record, decided_edges, mixed_batches, strength_genotype, strengths  # noqa: E402
from benchmarks.common import with_overrides  # noqa: E402
from search_space.errors import UserInputError  # noqa: E402


def load_supernet(run_dir: Path, overrides: Sequence[str], images: int, device: str, split: str = "test"):
    """The searched supernet of ``run_dir``'s last checkpoint, its config, and a loader of the images that judge it:
    the first ``images`` of the test set, or (``split="arch"``) all of α's split (``mixed_batches`` takes the first
    ``images``), as ``search.py derive=strength`` judges."""
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
    _, loader = data.search_loaders(cfg.batch_size, seed=cfg.seed) if split == "arch" else \
        data.train_loaders(cfg.batch_size, seed=cfg.seed)
    return engine.supernet, cfg, loader


def report(result: dict, primitives: Sequence[str], alpha: dict[str, torch.Tensor]) -> str:
    images = "test" if result.get("split", "test") == "test" else "α's split"
    lines = [f"base path (every edge its α-argmax op): accuracy on {images} {result['base_accuracy']:.4f}", "",
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
    if "decided_edges" in result:  # judgings before it kept no runner-up
        lines.append("edges whose strongest op leads the runner-up by 2 SE: " + ", ".join(
            f"{kind} {count} of {len(result['lead'][kind])}" for kind, count in result["decided_edges"].items()))
    for name in ("alpha_genotype", "strength_genotype"):
        lines.append(f"{name}: parameter-free edges {result[name + '_parameter_free']}: {result[name]}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a search run dir with checkpoints/last.pt")
    parser.add_argument("--images", type=int, default=1000, help="images that judge the paths: the test set's first "
                        "(stratified) or α's split's first; default 1000")
    parser.add_argument("--split", choices=("test", "arch"), default="test",
                        help="the images: the test set's, or α's split as search.py derive=strength uses (writes "
                             "op_strength_arch.json)")
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
        supernet, cfg, loader = load_supernet(args.run, args.overrides, args.images, args.device, args.split)
        batches = mixed_batches(loader, cfg.batch_size, cfg.seed, args.device, max_images=args.images)
        result = strengths(supernet, batches)
        space = supernet.search_space
        evolution = cfg.search.evolution
        # caps absent in runs from before they existed
        caps = evolution.max_skip_connect, evolution.get("max_parameter_free"), evolution.get("max_normal_pools")
        alpha_cell = supernet_genotype(supernet, *caps)
        strong_cell = strength_genotype(result["accuracy"], space.primitives, space.steps, space.multiplier, *caps)
        result.update(images=sum(len(y) for _, y in batches), primitives=list(space.primitives),
                      **cells_record(alpha_cell, strong_cell))
        result["decided_edges"] = decided_edges(result)
    except (UserInputError, FileNotFoundError) as error:
        print(f"op_strength: {error}", file=sys.stderr)
        return 2
    save_json({**result, "split": args.split},
              args.run / ("op_strength.json" if args.split == "test" else "op_strength_arch.json"))
    print(report({**result, "split": args.split}, space.primitives, supernet.alpha_probabilities()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
