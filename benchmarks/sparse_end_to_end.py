"""Does the spike-sparse convolution pay in a whole retrain? The dispatcher on vs cuDNN only, eager and graphed.

Runs train.py four times: `cuda_graph` false/true x `model.network.conv_backend` torch (cuDNN only) / auto
(the sparse kernels where their calibration says they win), with the same overrides otherwise; per step
mode one Hydra multirun over the backend (DIR/train/<eager|graphed>_<torch|auto>), its command printed.
The default launcher runs them one at a time (timings must not share a GPU; --launcher local_gpus puts
each on a GPU of its own). Then measures, on the test set, how sparse the
spike-reading convs' real inputs are: the share of zero elements and of all-zero 8x8 blocks (the unit
the sparse kernels skip). Writes DIR/summary.json and summary.md and prints the table last:

    python benchmarks/sparse_end_to_end.py --out DIR data=cifar10 data.root=<cifar10> model=small neuron=lif
    python benchmarks/sparse_end_to_end.py --out DIR --smoke --modes eager   # in seconds on a CPU

The cell is DARTS_V2 unless a `genotype=` override names another.
Images/s are those of the last epoch (the first also pays Triton compiles, calibration and graph
capture) and of the whole run. "sparse share": of the convolution calls that could take the sparse
path (those inside a captured step), the share that did; eager calls always run cuDNN.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from aso_se.run.atomic_write import save_json  # noqa: E402
from aso_se.run.checkpoint import load_checkpoint  # noqa: E402
from benchmarks.common import (  # noqa: E402
    SMOKE,
    BenchmarkError,
    Sweep,
    add_launcher_args,
    check_launcher_args,
    check_overrides,
    compose_config,
    read_run_json,
    run_into_out,
    run_sweeps,
)
from kernels.sparse_conv import SparseConv2d  # noqa: E402
from kernels.sparse_conv.geometry import BLOCK  # noqa: E402
from search_space.genotypes import Genotype  # noqa: E402

ARMS = (("eager", False, "torch"), ("eager", False, "auto"), ("graphed", True, "torch"), ("graphed", True, "auto"))
# Calls that never consult the crossover: eager (cuDNN by design), CPU and backend="torch" calls.
NOT_ELIGIBLE = ("dense:eager", "dense:cpu", "dense:requested", "probe", "sparse_wgrad")


def plan_sweeps(out: Path, overrides: Sequence[str], modes: Sequence[str]) -> list[Sweep]:
    """Per step mode (eager, graphed), one multirun over the conv backends (torch, auto)."""
    sweeps = []
    for mode in modes:
        backends = tuple(backend for arm_mode, _, backend in ARMS if arm_mode == mode)
        graphed = next(graphed for arm_mode, graphed, _ in ARMS if arm_mode == mode)
        sweeps.append(Sweep(label=mode, script="train.py", stage_dir=out / "train",
                            overrides=(*overrides, f"cuda_graph={str(graphed).lower()}"),
                            key="model.network.conv_backend", values=backends,
                            names=tuple(f"{mode}_{backend}" for backend in backends),
                            subdir=f"{mode}_${{model.network.conv_backend}}"))
    return sweeps


def sparse_share(paths: dict[str, int]) -> float | None:
    """Share of the dispatcher-eligible conv calls that ran the sparse kernels (None: no eligible call)."""
    eligible = sum(count for path, count in paths.items() if path not in NOT_ELIGIBLE)
    return paths.get("sparse", 0) / eligible if eligible else None


def block_sparsity(x: torch.Tensor) -> tuple[float, float]:
    """(share of zero elements, share of all-zero BLOCK x BLOCK blocks per (sample, channel) plane)."""
    active = (x != 0).to(torch.float32)
    blocks = F.max_pool2d(active.flatten(0, -3).unsqueeze(1), BLOCK, ceil_mode=True)
    return 1.0 - active.mean().item(), 1.0 - blocks.mean().item()


@torch.no_grad()
def activation_sparsity(overrides: Sequence[str], run_dir: Path, max_batches: int) -> dict[str, Any]:
    """Zero elements and zero blocks at every SparseConv2d's input, the trained network on test batches."""
    from hydra.utils import instantiate

    cfg = compose_config("train", overrides)
    data, neuron = instantiate(cfg.data), instantiate(cfg.neuron)
    state = load_checkpoint(run_dir / "checkpoints" / "best.pt", kind="train")
    network = instantiate(cfg.model.network)(Genotype.from_json(state["genotype"]), neuron=neuron,
                                             num_classes=data.num_classes, in_channels=data.in_channels,
                                             image_size=data.image_size)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    network.load_state_dict(state["model"])
    network.to(device).eval()
    per_conv: dict[str, list[tuple[float, float]]] = {}
    hooks = [module.register_forward_pre_hook(
        lambda _, args, name=name: per_conv.setdefault(name, []).append(block_sparsity(args[0])))
        for name, module in network.named_modules() if isinstance(module, SparseConv2d)]
    _, test = data.train_loaders(cfg.batch_size, seed=0)
    try:
        for batch, (inputs, _) in enumerate(test):
            if batch == max_batches:
                break
            network(inputs.to(device))
    finally:
        for hook in hooks:
            hook.remove()
    if not per_conv:
        raise BenchmarkError("the network has no spike-reading convolution (SparseConv2d) to measure")
    zeros = {name: statistics.fmean(z for z, _ in values) for name, values in per_conv.items()}
    blocks = {name: statistics.fmean(b for _, b in values) for name, values in per_conv.items()}
    return {"convs": len(per_conv), "zero_elements_mean": statistics.fmean(zeros.values()),
            "zero_blocks_mean": statistics.fmean(blocks.values()), "zero_blocks_max": max(blocks.values()),
            "convs_with_90pct_zero_blocks": sum(share >= 0.9 for share in blocks.values()),
            "per_conv": {name: {"zero_elements": zeros[name], "zero_blocks": blocks[name]} for name in per_conv}}


def collect(run_dir: Path) -> dict[str, Any]:
    metrics = read_run_json(run_dir / "metrics.json")
    paths = metrics.get("sparse_conv_paths", {})
    return {"arm": run_dir.name, "images_per_second_last_epoch": metrics["history"][-1]["images_per_second"],
            "images_per_second_run": metrics["train_images_per_second"], "test_acc": metrics["test_acc"],
            "firing_rate_mean": metrics.get("firing_rate_mean"), "sparse_conv_paths": paths,
            "sparse_share": sparse_share(paths), "device": metrics.get("device")}


def table(runs: Sequence[dict[str, Any]]) -> str:
    lines = ["| step | convs | images/s, last epoch | vs cuDNN only | images/s, whole run | vs cuDNN only "
             "| sparse share | firing rate | test acc |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    by_arm = {run["arm"]: run for run in runs}
    for run in runs:
        mode, backend = run["arm"].split("_")
        base = by_arm[f"{mode}_torch"]
        share = "—" if run["sparse_share"] is None else f"{run['sparse_share']:.1%}"
        rate = "—" if run["firing_rate_mean"] is None else f"{run['firing_rate_mean']:.3f}"
        last, whole = run["images_per_second_last_epoch"], run["images_per_second_run"]
        lines.append(
            f"| {mode} | {'dispatcher' if backend == 'auto' else 'cuDNN only'} "
            f"| {last:.0f} | {last / base['images_per_second_last_epoch']:.3f}x "
            f"| {whole:.0f} | {whole / base['images_per_second_run']:.3f}x "
            f"| {share} | {rate} | {run['test_acc']:.4f} |")
    return "\n".join(lines)


# What the benchmark sets for every run (a genotype= or seed= of the user's is taken as given).
RESERVED_KEYS = ("resume", "cuda_graph", "model.network.conv_backend")


def run(args: argparse.Namespace) -> dict[str, Any]:
    overrides = (*(SMOKE if args.smoke else ()),
                 *check_overrides(args.overrides, RESERVED_KEYS, "steps: --modes; convs: both arms run"))
    if not any(override.startswith("genotype=") for override in overrides):
        overrides = ("genotype=DARTS_V2", *overrides)
    compose_config("train", (*overrides, "model.network.conv_backend=auto"), args.launcher)  # refused first
    out = args.out.resolve()
    run_dirs = run_sweeps(plan_sweeps(out, overrides, args.modes), args.launcher, args.resume, out / "logs")
    runs = [collect(run_dir) for run_dir in run_dirs]
    sparsity = activation_sparsity((*overrides, "model.network.conv_backend=auto"), run_dirs[-1],
                                   args.sparsity_batches)
    summary = {"runs": runs, "activation_sparsity": sparsity, "overrides": list(overrides),
               "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    save_json(summary, out / "summary.json")
    sparsity_line = (f"Inputs of the {sparsity['convs']} spike-reading convs (trained network, test batches): "
                     f"{sparsity['zero_elements_mean']:.1%} zero elements, {sparsity['zero_blocks_mean']:.1%} "
                     f"all-zero {BLOCK}x{BLOCK} blocks on average (max {sparsity['zero_blocks_max']:.1%}; "
                     f"{sparsity['convs_with_90pct_zero_blocks']} convs at >= 90%).")
    (out / "summary.md").write_text(f"# Sparse convolution end to end\n\nOverrides: `{' '.join(overrides)}`.\n\n"
                                    f"{table(runs)}\n\n{sparsity_line}\n")
    summary["sparsity_line"] = sparsity_line
    return summary


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a new or empty directory: the runs and the summary")
    parser.add_argument("--smoke", action="store_true", help="experiment=smoke for every run: seconds each on a CPU")
    parser.add_argument("--modes", default="eager,graphed",
                        help="steps to time, comma-separated: eager, graphed (cuda_graph=true: needs a GPU)")
    parser.add_argument("--sparsity-batches", type=int, default=8, help="test batches for the activation sparsity")
    add_launcher_args(parser)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. data=cifar10 neuron=lif")
    args = parser.parse_args(argv)
    check_launcher_args(parser, args)
    if args.sparsity_batches < 1:
        parser.error("--sparsity-batches must be at least 1")
    args.modes = tuple(mode.strip() for mode in args.modes.split(","))
    if not args.modes or any(mode not in ("eager", "graphed") for mode in args.modes):
        parser.error(f"--modes {','.join(args.modes)}: expected eager, graphed or both")
    if "graphed" in args.modes and not torch.cuda.is_available():
        parser.error("--modes graphed needs a CUDA GPU (cuda_graph=true); on a CPU pass --modes eager")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    code, summary = run_into_out("sparse_end_to_end", args, run)
    if code:
        return code
    print(f"summary: {args.out / 'summary.json'}, {args.out / 'summary.md'}")
    print(summary["sparsity_line"])
    print(table(summary["runs"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
