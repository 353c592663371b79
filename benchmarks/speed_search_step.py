"""Speed case search_step: one ASO-SE search step (one α step + one weight step) and its peak memory.

One supernet layout (8 cells, C = 16, batch 64, T = 4, 32x32 CIFAR-10, DARTS's 8 ops and optimizers) and
the same inputs for every row of ``ROWS``: from DARTS's all-op MixedOp with LIF (the hand-written baseline)
through top-2, ST-BIF, recompute, the sparse-conv dispatcher and bf16, to the ReLU (ANN) references.
Each row: median wall time of ``--steps`` synced steps after ``--warmup``, peak memory, and from one
profiled step the CUDA kernels, their GPU time and the host syncs. ``--anchor`` also runs the
hand-written DARTS supernet script in this process.

    python benchmarks/speed.py --case search_step --images /tmp/cifar10/train [--anchor <darts_snn_supernet.py>]
    python benchmarks/speed.py --case search_step --tiny    # CPU smoke run of the case itself (no rows)

Each row's step time, images/s and peak memory become result rows.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import gc
import importlib.util
import statistics
import sys
import time
import traceback
import unittest.mock
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from PIL import Image
from torchvision.transforms.functional import normalize, pil_to_tensor

if __package__ in (None, ""):  # run as a script: the repository on the path, for `benchmarks.rows`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aso_se.search import supernet as supernet_module
from aso_se.search.arch_params import SamplingConfig
from aso_se.search.engine import ASOSEEngine
from aso_se.search.mixed_op import sum_terms
from aso_se.search.schedule import SearchSchedule
from aso_se.search.supernet import build_supernet
from benchmarks.rows import Measurement
from kernels.sparse_conv import SparseConv2d
from search_space.neurons import NeuronFactory, set_firing_rate_recording
from search_space.ops import DARTS_PRIMITIVES, UnitAffineBatchNorm2d
from search_space.space import SearchSpace

REPO = str(Path(__file__).resolve().parents[1])
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
# conf/neuron/*.yaml defaults
NEURON_PARAMS = {
    "lif": {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0, "surrogate": "sigmoid"},
    "st_bif": {"q_threshold": 1.0, "level": 8, "sym": True, "learn_threshold": True, "surrogate": "sigmoid"},
    "relu": {},
    "st_bif_qann": {"q_threshold": 0.5, "level": 16, "sym": False, "learn_threshold": True},
}


@dataclass(frozen=True)
class Row:
    name: str
    neuron: str
    timesteps: int
    k: int | None
    recompute: bool = False
    sparse_conv: bool = False
    precision: str = "fp32"
    per_term_sum: bool = False  # a node summed as before: a multiply per term and an add per pair
    native_bn: bool = False  # the supernet's BatchNorms without a weight, as before: PyTorch's native kernels
    channels_last: bool = False  # supernet weights and images in channels_last (NHWC) memory
    draw_ahead: bool = True  # the next step's ops drawn during the step, as the engine's loop does
    graph_ops: bool = False  # each sampled op's forward and backward replayed from CUDA graphs


ROWS = (
    Row("DARTS MixedOp all ops, LIF", "lif", 4, None),
    Row("FastMixedOp top-2, LIF", "lif", 4, 2),
    Row("top-2, ST-BIF", "st_bif", 4, 2),
    Row("top-2, ST-BIF, recompute", "st_bif", 4, 2, recompute=True),
    Row("top-2, ST-BIF, recompute, sparse conv", "st_bif", 4, 2, recompute=True, sparse_conv=True),
    Row("top-2, ST-BIF, recompute, sparse, bf16", "st_bif", 4, 2, recompute=True, sparse_conv=True, precision="bf16"),
    Row("top-2, ReLU (ANN)", "relu", 1, 2),
    Row("DARTS MixedOp all ops, ReLU (ANN)", "relu", 1, None),
    Row("top-2, ST-BIF QANN (T = 1)", "st_bif_qann", 1, 2),
    Row("top-2, ST-BIF QANN (T = 1), bf16", "st_bif_qann", 1, 2, precision="bf16"),
    Row("top-2, ReLU (ANN), bf16", "relu", 1, 2, precision="bf16"),
    Row("top-2, ST-BIF, per-term node sums", "st_bif", 4, 2, per_term_sum=True),
    Row("top-2, ST-BIF QANN, per-term node sums", "st_bif_qann", 1, 2, per_term_sum=True),
    Row("top-2, ST-BIF, native BN", "st_bif", 4, 2, native_bn=True),
    Row("top-2, ST-BIF QANN, native BN", "st_bif_qann", 1, 2, native_bn=True),
    Row("top-2, ReLU (ANN), native BN", "relu", 1, 2, native_bn=True),
    Row("FastMixedOp top-2, LIF, native BN", "lif", 4, 2, native_bn=True),
    Row("top-2, ST-BIF, channels_last", "st_bif", 4, 2, channels_last=True),
    Row("top-2, ST-BIF QANN, channels_last", "st_bif_qann", 1, 2, channels_last=True),
    Row("top-2, ReLU (ANN), channels_last", "relu", 1, 2, channels_last=True),
    Row("FastMixedOp top-2, LIF, channels_last", "lif", 4, 2, channels_last=True),
    Row("top-2, ST-BIF, channels_last, bf16", "st_bif", 4, 2, channels_last=True, precision="bf16"),
    Row("FastMixedOp top-2, LIF, channels_last, bf16", "lif", 4, 2, channels_last=True, precision="bf16"),
    Row("top-2, ST-BIF, draw at step start", "st_bif", 4, 2, draw_ahead=False),
    Row("top-2, ST-BIF QANN, draw at step start", "st_bif_qann", 1, 2, draw_ahead=False),
    Row("top-2, ST-BIF, channels_last, draw at step start", "st_bif", 4, 2, channels_last=True, draw_ahead=False),
    Row("top-2, ST-BIF QANN, op graphs", "st_bif_qann", 1, 2, graph_ops=True),
    Row("top-2, ST-BIF, op graphs", "st_bif", 4, 2, graph_ops=True),
    Row("top-2, ST-BIF, channels_last, op graphs", "st_bif", 4, 2, channels_last=True, graph_ops=True),
    Row("top-2, ST-BIF QANN, channels_last, op graphs", "st_bif_qann", 1, 2, channels_last=True, graph_ops=True),
    Row("top-2, ReLU (ANN), op graphs", "relu", 1, 2, graph_ops=True),
    Row("FastMixedOp top-2, LIF, op graphs", "lif", 4, 2, graph_ops=True),
    Row("FastMixedOp top-2, LIF, channels_last, op graphs", "lif", 4, 2, channels_last=True, graph_ops=True),
    Row("top-2, ST-BIF, bf16, op graphs", "st_bif", 4, 2, precision="bf16", graph_ops=True),
    Row("top-2, ST-BIF, bf16", "st_bif", 4, 2, precision="bf16"),
    Row("top-2, ST-BIF, channels_last, bf16, op graphs", "st_bif", 4, 2, channels_last=True, precision="bf16",
        graph_ops=True),
)


def per_term_sum(terms: list[torch.Tensor], weights: torch.Tensor, grad_buffers=None, out=None) -> torch.Tensor:
    """The node sum as it was before ``weighted_sum``: the baseline of rows with ``per_term_sum`` (no graphed
    ops, so no buffers to use)."""
    return sum_terms(w * term for w, term in zip(weights.unbind(), terms))


def load_images(folder: Path | None, count: int) -> torch.Tensor:
    """``count`` CIFAR-10 training images, class by class in turn (so labels are ``i % 10``), normalized.
    Random 32x32 images when no folder is given."""
    if folder is None:
        return torch.randn(count, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    per_class = [sorted(path.glob("*.jpg")) for path in sorted(folder.iterdir()) if path.is_dir()]
    files = [per_class[i % len(per_class)][i // len(per_class)] for i in range(count)]
    pixels = torch.stack([pil_to_tensor(Image.open(file).convert("RGB")) for file in files]).float() / 255
    return normalize(pixels, CIFAR_MEAN, CIFAR_STD)


def make_engine(row: Row, channels: int, layers: int, device: torch.device) -> ASOSEEngine:
    """``row``'s engine, seeded; convs on cuDNN (SparseConv2d backend "torch") unless ``row.sparse_conv`` ("auto")."""
    torch.manual_seed(0)
    neuron = NeuronFactory(row.neuron, timesteps=row.timesteps, **NEURON_PARAMS[row.neuron])
    supernet = build_supernet(
        search_space=SearchSpace(DARTS_PRIMITIVES), neuron=neuron, channels=channels, layers=layers,
        num_classes=10, timesteps=row.timesteps, recompute=row.recompute,
    )
    set_firing_rate_recording(supernet, False)  # a logging option, not part of the search step
    if row.channels_last:
        supernet = supernet.to(memory_format=torch.channels_last)
    for module in supernet.modules():
        if isinstance(module, SparseConv2d):
            module.backend = "auto" if row.sparse_conv else "torch"
        if row.native_bn and isinstance(module, UnitAffineBatchNorm2d):
            module.weight = module.bias = None  # F.batch_norm without a weight: PyTorch's native kernels
    return ASOSEEngine(
        supernet,
        weights_optimizer=functools.partial(torch.optim.SGD, lr=0.025, momentum=0.9, weight_decay=3e-4),
        arch_optimizer=functools.partial(torch.optim.Adam, lr=3e-4, betas=(0.5, 0.999), weight_decay=1e-3),
        schedule=SearchSchedule(),
        sampling=SamplingConfig(k=row.k, gumbel=row.k is not None),
        device=device,
        precision=row.precision,
        graph_ops=row.graph_ops,
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_times_ms(step, device: torch.device, steps: int) -> list[float]:
    """Wall time of each of `steps` calls of `step`, waiting for the GPU after each (ms)."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1000)
    return times


def back_to_back_ms(step, device: torch.device, steps: int) -> float:
    """Mean wall time of ``steps`` calls of ``step`` run as the engine's loop runs them: no wait for the
    GPU between steps (the host runs ahead until the step's own syncs), one at the end (ms)."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return (time.perf_counter() - start) * 1000 / steps


def profile_step(step, device: torch.device, top_kernels: int = 0) -> tuple[int, float, int]:
    """(CUDA kernels launched, their summed GPU time in ms, host syncs) of one step; with ``top_kernels``
    also prints the kernels that took the most GPU time (name, calls, ms)."""
    if device.type != "cuda":
        return 0, 0.0, 0
    sites: list[str] = []

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" in str(message):  # where in our code: the innermost repo frame that is not this file
            frames = [f for f in traceback.extract_stack()[:-1]
                      if f.filename.startswith(REPO) and not f.filename.endswith("speed_search_step.py")]
            sites.append(f"{frames[-1].filename}:{frames[-1].lineno}" if frames else f"{filename}:{lineno}")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        step()
        torch.cuda.set_sync_debug_mode("default")
    syncs = len(sites)
    if top_kernels:
        for site in sites:
            print(f"SYNC | {site}", flush=True)
    synchronize(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        synchronize(device)
    kernels = [
        event for event in prof.events()
        if event.device_type == torch.autograd.DeviceType.CUDA and not event.name.startswith(("Memcpy", "Memset"))
    ]
    by_name: dict[str, list[float]] = {}
    for event in kernels:
        by_name.setdefault(event.name, []).append(event.device_time / 1000)
    for name, times in sorted(by_name.items(), key=lambda item: -sum(item[1]))[:top_kernels]:
        print(f"KERNEL | {sum(times):8.2f} ms | {len(times):5d} calls | {name[:110]}", flush=True)
    return len(kernels), sum(e.device_time for e in kernels) / 1000, syncs


def profile_host(step, device: torch.device, top_ops: int) -> None:
    """Prints the ``top_ops`` ops with the most host (CPU) time in one step, self time and total time."""
    synchronize(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
        synchronize(device)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top_ops, max_name_column_width=60)
    for line in table.splitlines():
        print(f"HOST | {line}", flush=True)


def bench_row(
    row: Row, images: torch.Tensor, labels: torch.Tensor, args: argparse.Namespace, device: torch.device
) -> dict:
    if not row.per_term_sum:
        return _bench_row(row, images, labels, args, device)
    with unittest.mock.patch.object(supernet_module, "weighted_sum", per_term_sum):
        return _bench_row(row, images, labels, args, device)


def _bench_row(
    row: Row, images: torch.Tensor, labels: torch.Tensor, args: argparse.Namespace, device: torch.device
) -> dict:
    engine = make_engine(row, args.channels, args.layers, device)
    batch = args.batch
    layout = torch.channels_last if row.channels_last else torch.contiguous_format
    weights_batch = (images[:batch].to(device, memory_format=layout), labels[:batch].to(device))
    arch_batch = (images[batch:].to(device, memory_format=layout), labels[batch:].to(device))

    def step() -> None:
        engine.train_step(weights_batch, arch_batch, temperature=1.0, entropy_weight=0.0,
                          next_temperature=1.0 if row.draw_ahead else None)

    for _ in range(args.warmup):
        step()
    synchronize(device)
    kernels, gpu_ms, syncs = profile_step(step, device, args.top_kernels)
    if args.host_ops:
        profile_host(step, device, args.host_ops)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = step_times_ms(step, device, args.steps)
    loop_ms = back_to_back_ms(step, device, args.steps)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    result = {"row": row.name, "ms": statistics.median(times), "peak_gib": peak, "kernels": kernels,
              "gpu_ms": gpu_ms, "syncs": syncs, "loop_ms": loop_ms}
    result["images_per_s"] = 2 * batch / result["ms"] * 1000
    result["loop_images_per_s"] = 2 * batch / loop_ms * 1000
    print(f"ROW | {row.name:36s} | batch {batch} | {result['ms']:8.1f} ms | {result['images_per_s']:7.0f} images/s | "
          f"{peak:6.2f} GiB | {kernels:6d} kernels | {gpu_ms:7.1f} ms GPU | {syncs} syncs | "
          f"back to back {loop_ms:8.1f} ms, {result['loop_images_per_s']:7.0f} images/s", flush=True)
    graphs = engine.supernet.op_graphs
    if graphs is not None:
        print(f"GRAPHS | {row.name:36s} | {graphs.captured} op graph pairs captured, {graphs.replays} calls replayed "
              f"(of {len(graphs._warm)} ops warmed up), {graphs.failed} captures failed", flush=True)
    if device.type == "cuda":  # graph pools hold memory that is reserved but not allocated between replays
        print(f"MEMORY | {row.name:36s} | peak reserved {torch.cuda.max_memory_reserved(device) / 2**30:.2f} GiB",
              flush=True)
    engine = None  # frees the supernet (the step closure holds it) before the next row
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def run_anchor(path: Path) -> None:
    """The hand-written DARTS supernet script (ReLU and LIF), timed by its own code in this process."""
    spec = importlib.util.spec_from_file_location("darts_snn_supernet", path)
    anchor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(anchor)
    relu_ms = anchor.bench("relu", 1)
    lif_ms = anchor.bench("lif", 4)
    print(f"ANCHOR | hand-written DARTS supernet: ReLU T=1 {relu_ms:.1f} ms, LIF T=4 {lif_ms:.1f} ms", flush=True)


def main(argv: list[str] | None = None) -> list[Measurement]:
    parser = argparse.ArgumentParser(prog="speed.py --case search_step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, default=None, help="CIFAR-10 train/ folder (class subfolders of JPEGs)")
    parser.add_argument("--anchor", type=Path, default=None,
                        help="the hand-written DARTS supernet script (darts_snn_supernet.py), run in-process")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rows", type=str, default=None, help="comma-separated row numbers (1-based) to run")
    parser.add_argument("--batch", type=int, default=64, help="images per split (the step reads two splits)")
    parser.add_argument("--top-kernels", type=int, default=0, help="print each row's N costliest CUDA kernels")
    parser.add_argument("--host-ops", type=int, default=0, help="print each row's N ops with the most host time")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: C=4, 3 cells, batch 2, 1 step")
    args = parser.parse_args(argv)
    args.channels, args.layers = (4, 3) if args.tiny else (16, 8)
    if args.tiny:
        args.batch = 2
    if args.tiny:
        args.steps, args.warmup = 1, 1
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    torch.backends.cudnn.benchmark = True
    images = load_images(args.images, 2 * args.batch)
    labels = torch.arange(2 * args.batch) % 10
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{datetime.date.today()} | {name} | torch {torch.__version__} | triton {triton.__version__} | "
          f"images: {'CIFAR-10 ' + str(args.images) if args.images else 'random'}", flush=True)
    rows = ROWS if args.rows is None else [ROWS[int(i) - 1] for i in args.rows.split(",")]
    results = []
    for row in rows:
        try:
            results.append(bench_row(row, images, labels, args, device))
        except Exception as error:  # one broken configuration must not cost the other rows their GPU time
            print(f"ROW | {row.name:36s} | FAILED: {type(error).__name__}: {str(error).splitlines()[0]}", flush=True)
        if device.type == "cuda":  # a row's graph pools must not crowd the next row's captures
            gc.collect()
            torch.cuda.empty_cache()
    if args.anchor is not None and device.type == "cuda":
        run_anchor(args.anchor)
    by_name = {result["row"]: result for result in results}
    print(f"\nbatch {args.batch} per split")
    print("| row | step (ms) | images/s (both splits) | back to back (ms) | images/s | peak (GiB) | kernels/step "
          "| GPU busy (ms) | host syncs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for result in results:
        print(f"| {result['row']} | {result['ms']:.1f} | {result['images_per_s']:.0f} | {result['loop_ms']:.1f} | "
              f"{result['loop_images_per_s']:.0f} | {result['peak_gib']:.2f} | {result['kernels']} | "
              f"{result['gpu_ms']:.1f} | {result['syncs']} |")
    ratios = [
        ("all ops / top-2 (LIF)", "DARTS MixedOp all ops, LIF", "FastMixedOp top-2, LIF", "ms"),
        ("peak memory, stored / recomputed (ST-BIF)", "top-2, ST-BIF", "top-2, ST-BIF, recompute", "peak_gib"),
        ("spiking (ST-BIF top-2) / ANN (ReLU top-2)", "top-2, ST-BIF", "top-2, ReLU (ANN)", "ms"),
        ("baseline / best engine row", "DARTS MixedOp all ops, LIF", None, "ms"),
        ("per-term / one-shot node sums (ST-BIF)", "top-2, ST-BIF, per-term node sums", "top-2, ST-BIF", "ms"),
        ("per-term / one-shot node sums (QANN)", "top-2, ST-BIF QANN, per-term node sums",
         "top-2, ST-BIF QANN (T = 1)", "ms"),
        ("native / cuDNN BN (ST-BIF)", "top-2, ST-BIF, native BN", "top-2, ST-BIF", "ms"),
        ("native / cuDNN BN (QANN)", "top-2, ST-BIF QANN, native BN", "top-2, ST-BIF QANN (T = 1)", "ms"),
        ("native / cuDNN BN (ReLU)", "top-2, ReLU (ANN), native BN", "top-2, ReLU (ANN)", "ms"),
        ("native / cuDNN BN (LIF)", "FastMixedOp top-2, LIF, native BN", "FastMixedOp top-2, LIF", "ms"),
        ("NCHW / channels_last (ST-BIF)", "top-2, ST-BIF", "top-2, ST-BIF, channels_last", "ms"),
        ("NCHW / channels_last (QANN)", "top-2, ST-BIF QANN (T = 1)", "top-2, ST-BIF QANN, channels_last", "ms"),
        ("NCHW / channels_last (ReLU)", "top-2, ReLU (ANN)", "top-2, ReLU (ANN), channels_last", "ms"),
        ("NCHW / channels_last (LIF)", "FastMixedOp top-2, LIF", "FastMixedOp top-2, LIF, channels_last", "ms"),
        ("draw at step start / ahead, back to back (ST-BIF)", "top-2, ST-BIF, draw at step start", "top-2, ST-BIF",
         "loop_ms"),
        ("draw at step start / ahead, back to back (QANN)", "top-2, ST-BIF QANN, draw at step start",
         "top-2, ST-BIF QANN (T = 1)", "loop_ms"),
        ("draw at step start / ahead, back to back (ST-BIF NHWC)", "top-2, ST-BIF, channels_last, draw at step start",
         "top-2, ST-BIF, channels_last", "loop_ms"),
    ]
    best = min(results, key=lambda result: result["ms"])["row"] if results else None
    for label, numerator, denominator, key in ratios:
        denominator = denominator or best
        if numerator in by_name and denominator in by_name and by_name[denominator][key] > 0:
            print(f"RATIO | {label}: {by_name[numerator][key] / by_name[denominator][key]:.2f}x ({denominator})")
    note = f"{args.layers} cells, C = {args.channels}, batch {args.batch} per split"
    columns = (("step", "ms", "ms", 1), ("throughput", "images_per_s", "images/s", 0),
               ("peak memory", "peak_gib", "GiB", 2))
    return [Measurement("search_step", f"{result['row']}: {what}", round(result[key], digits), unit, note)
            for result in results for what, key, unit, digits in columns]


if __name__ == "__main__":
    main()
