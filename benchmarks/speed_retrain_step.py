"""Speed case retrain_step: the full-size retrain step (DARTS_V2, 20 × 36, aux head, drop-path) and its input.

Where the step's time goes, row by row in one process: each row builds the network afresh (same seed) and
runs ``Retrainer``'s own step, captured in a CUDA graph as ``train.py cuda_graph=true`` does (or eager),
on device-resident batches; images/s over ``--steps`` synced steps, so the input pipeline is not in it.
Then the input pipelines alone: the host DataLoader (JPEG decode + augmentation in workers) and the
device pipeline (``data.augment_on_device``), images/s each. ``--profile`` adds GPU time per kernel
class (convs, norms, quantizer, pools, elementwise, ...) of the first row's eager step, and its roofline
(benchmarks/speed_roofline.py: the least bytes each class must move, against HBM bandwidth; rows of case "roofline").

    python benchmarks/speed.py --case retrain_step --data /tmp/cifar10 --rows 96:fp32:nchw,96:fp32:cl,256:bf16:cl
    python benchmarks/speed.py --case retrain_step --rows 1024:fp16:cl:torch,1024:fp16:cl   # node sums: ops vs kernel
    python benchmarks/speed.py --case retrain_step --tiny    # CPU smoke run of the case itself (no rows)

Each row's step time, images/s and peak memory become result rows (and with ``--profile``, the roofline's).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import functools
import gc
import re
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from aso_se.data import CIFARData  # noqa: E402
from aso_se.parallel.distributed import DistributedContext  # noqa: E402
from aso_se.train.retrain import Retrainer  # noqa: E402
from benchmarks import speed_roofline  # noqa: E402
from benchmarks.rows import Measurement  # noqa: E402
from kernels.quantizer import triton as quantizer_triton  # noqa: E402
from search_space.network import build_network  # noqa: E402
from search_space.neurons import NeuronFactory  # noqa: E402

# GPU kernel classes, first match wins (names of cuDNN, cuBLAS, ATen and our Triton kernels). Batch norm comes
# before conv: cuDNN's NHWC batch norms (cudnn::batchnorm_fwtr_nhwc_...) also match the conv pattern. Our node sums
# (_drop_path_sum_*) are elementwise, not reductions.
KERNEL_CLASSES = [
    ("batch norm", r"batch_norm|bn_|batchnorm"),
    ("conv", r"conv|depthwise|cudnn|xmma|implicit_gemm|winograd|dgrad|wgrad|fprop|sm90|sm80|gemm|cutlass|nhwc"
             r"|nchw.*kernel"),
    ("quantizer / neuron", r"quantiz|st_bif|threshold"),
    ("pool", r"pool"),
    ("optimizer", r"multi_tensor|foreach|sgd|fused_"),
    ("elementwise", r"drop_path_sum"),
    ("reduction", r"reduce|norm_kernel|sum_|mean"),
    ("copy / layout", r"copy|transpose|cat|permute|contiguous|memcpy|memset"),
    ("elementwise", r"elementwise|vectorized|unrolled|where|mul|add|fill"),
]
DEFAULT_ROWS = "96:fp32:nchw,96:fp32:cl,256:fp32:cl,256:bf16:cl"
TINY_ROWS = "4:fp32:nchw,4:fp32:cl:torch,4:fp32:cl:cat"
CLASS_NAMES = list(dict.fromkeys([label for label, _ in KERNEL_CLASSES] + ["other"]))
# The drop-path probability of every timed and profiled step: half DARTS's final value, the middle of its ramp.
DROP_PATH_PROB = 0.2 * 0.5


def kernel_class(name: str) -> str:
    lowered = name.lower()
    for label, pattern in KERNEL_CLASSES:
        if re.search(pattern, lowered):
            return label
    return "other"


def quantizer_bwd_config() -> str:
    """BLOCK:WARPS[:PROGRAMS_PER_SM] of the quantizer backward imported (older code, run for an A/B, has no grid)."""
    per_sm = getattr(quantizer_triton, "BWD_PROGRAMS_PER_SM", None)
    return f"{quantizer_triton.BWD_BLOCK}:{quantizer_triton.BWD_NUM_WARPS}" + (f":{per_sm}" if per_sm else "")


def make_trainer(args, row, device):
    batch, precision, layout, sum_backend, depthwise = row
    torch.manual_seed(0)
    network = build_network(args.genotype, neuron=NeuronFactory(args.neuron, timesteps=1), channels=args.channels,
                            layers=args.layers, num_classes=10, auxiliary=True, conv_backend=args.conv_backend,
                            depthwise_backend=depthwise)
    # "cat": our kernel's node sums, then torch.cat (before sums into the concatenation); "dense": auto with the
    # concatenation's gradients of the nodes that edges also read handed dense (cell.dense_concat_grads)
    for cell in network.cells:
        cell.drop_path_backend = "auto" if sum_backend in ("cat", "dense") else sum_backend
        cell.sums_into_concat = sum_backend != "cat"
        cell.dense_concat_grads = sum_backend == "dense"
    return retrain_trainer(network, precision, layout == "cl", device, graph=args.graph and device.type == "cuda")


def retrain_trainer(network, precision: str, channels_last: bool, device, *, graph: bool) -> Retrainer:
    """``Retrainer``'s step on ``network`` with DARTS's recipe (aux head, drop-path at DROP_PATH_PROB, clipping)."""
    # fused on a GPU, as experiment=cifar10_qann_fast trains (and fp16 in a graph needs it)
    sgd = functools.partial(torch.optim.SGD, lr=0.025, momentum=0.9, weight_decay=3e-4, fused=device.type == "cuda")
    trainer = Retrainer(network, optimizer=sgd,
                        scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=10),
                        epochs=10, auxiliary_weight=0.4, drop_path_prob=0.2, grad_clip=5.0, precision=precision,
                        ctx=DistributedContext(device=device), log_every_n_steps=10, cuda_graph=graph,
                        channels_last=channels_last)
    trainer.network.drop_path_prob = DROP_PATH_PROB
    return trainer


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_row(args, row, device):
    batch = row[0]
    trainer = make_trainer(args, row, device)
    if args.compile:
        trainer.model = torch.compile(trainer.model, mode=args.compile_mode)
    trainer.model.train()
    inputs = torch.randn(batch, 3, 32, 32, device=device)
    labels = torch.randint(10, (batch,), device=device)
    step = trainer.graphed_step or trainer._train_step
    for _ in range(args.warmup):  # warm-up steps, then the capture
        step(trainer._to_device(inputs), labels)
    sync(device)
    times = []
    for _ in range(args.repeats):
        sync(device)
        start = time.perf_counter()
        for _ in range(args.steps):
            loss, _ = step(trainer._to_device(inputs), labels)
        sync(device)
        times.append((time.perf_counter() - start) / args.steps)
    seconds = statistics.median(times)
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    return trainer, seconds, memory, float(loss)


def profile_row(trainer, row, device, steps=3) -> tuple[dict[str, float], dict[str, int]]:
    """Time per eager step by kernel class (seconds) and kernels per step, printed with the top kernels. On a GPU:
    its kernels' time; on a CPU (a smoke run): the ops' own CPU time, classed by the ops' names."""
    from torch.profiler import ProfilerActivity, profile
    batch = row[0]
    inputs = torch.randn(batch, 3, 32, 32, device=device)
    labels = torch.randint(10, (batch,), device=device)
    for _ in range(2):
        trainer._train_step(trainer._to_device(inputs), labels)
    sync(device)
    on_gpu = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * on_gpu, record_shapes=True) as prof:
        for _ in range(steps):
            trainer._train_step(trainer._to_device(inputs), labels)
        sync(device)
    by_class: dict[str, float] = collections.Counter()
    counts: dict[str, int] = collections.Counter()
    top: dict[str, float] = collections.Counter()
    kind = torch.autograd.DeviceType.CUDA if on_gpu else torch.autograd.DeviceType.CPU
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", 0.0) if on_gpu else event.self_cpu_time_total
        if us <= 0 or event.device_type != kind:
            continue
        label = kernel_class(event.key)
        by_class[label] += us / steps
        counts[label] += event.count // steps
        top[event.key[:160]] += us / steps
    total = sum(by_class.values())
    what = "GPU time per eager step by kernel class" if on_gpu else "CPU time per eager step by op class (smoke run)"
    print(f"\n{what} ({':'.join(map(str, row))}), total {total / 1e3:.2f} ms")
    print("| class | ms / step | share | kernels / step |\n|---|---:|---:|---:|")
    for label, us in sorted(by_class.items(), key=lambda item: -item[1]):
        print(f"| {label} | {us / 1e3:.2f} | {us / max(total, 1e-9):.0%} | {counts[label]} |")
    print("\ntop kernels:")
    for name, us in sorted(top.items(), key=lambda item: -item[1])[:25]:
        print(f"  {us / 1e3:7.2f} ms  {name}")
    if on_gpu:  # which op launched them: a kernel's name alone does not say (e.g. a generic elementwise kernel)
        print("\ntop ops by the GPU time of their own kernels (op, input shapes):")
        ops = [event for event in prof.key_averages(group_by_input_shape=True)
               if event.device_type == torch.autograd.DeviceType.CPU and event.self_device_time_total > 0]
        for event in sorted(ops, key=lambda event: -event.self_device_time_total)[:20]:
            ms = event.self_device_time_total / steps / 1e3
            print(f"  {ms:7.2f} ms  {event.key}  {str(event.input_shapes)[:150]}")
    return {label: us / 1e6 for label, us in by_class.items()}, dict(counts)


def step_least_bytes(trainer, batch: int, device) -> dict[str, int]:
    """The least bytes per kernel class of ``trainer``'s step at ``batch``: the byte model over one more recorded
    eager step, and the optimizer's."""
    inputs = trainer._to_device(torch.randn(batch, 3, 32, 32, device=device))
    labels = torch.randint(10, (batch,), device=device)
    calls = speed_roofline.record_step(trainer.network, lambda: trainer._train_step(inputs, labels))
    sync(device)
    parameters = [p for group in trainer.optimizer.param_groups for p in group["params"] if p.requires_grad]
    momentum = any(group.get("momentum", 0) for group in trainer.optimizer.param_groups)
    optimizer = speed_roofline.optimizer_bytes(sum(p.numel() * p.element_size() for p in parameters),
                                               momentum=momentum, clipped=trainer.grad_clip > 0)
    return speed_roofline.minimum_bytes(calls, optimizer)


def roofline_row(args, trainer, row, device, seconds_by_class, kernels, step_seconds, gbps) -> list[Measurement]:
    """The profiled step's roofline: the byte model over one more recorded eager step, against the profile's times
    per class, the eager step's summed kernel time and (graphs on) the row's timed replays."""
    batch = row[0]
    least = step_least_bytes(trainer, batch, device)
    timed = {"step, kernel time of an eager step": sum(seconds_by_class.values())}
    if step_seconds is not None:
        timed[f"step, {'CUDA graph replay' if args.graph and device.type == 'cuda' else 'eager'} (wall)"] = \
            step_seconds
    lines = speed_roofline.roofline_lines(least, seconds_by_class, kernels, CLASS_NAMES, timed)
    what = f"{args.genotype} {args.layers}×{args.channels} {args.neuron}, batch {batch}, {row[1]}, {row[2]}"
    speed_roofline.print_roofline(lines, gbps, f"Roofline of one training step ({what})")
    note = (f"HBM {gbps:,.0f} GB/s; class times from the profiled eager step; least bytes from "
            "benchmarks/speed_roofline.py's byte model")
    return speed_roofline.measurements(lines, gbps, what, note)


def loader_rates(args, device):
    rows = []
    for on_device in (False, True):
        data = CIFARData(name="cifar10", root=args.data, cutout_length=16, num_workers=args.workers,
                         augment_on_device=on_device)
        started = time.perf_counter()
        train, _ = data.train_loaders(args.loader_batch, seed=0, device=device)
        train.set_epoch(0)
        iterator = iter(train)
        next(iterator)
        setup = time.perf_counter() - started
        sync(device)
        start, images = time.perf_counter(), 0
        for index, (inputs, labels) in enumerate(iterator):
            inputs = inputs.to(device, non_blocking=True)
            images += labels.numel()
            if index + 2 >= args.loader_batches:
                break
        sync(device)
        rows.append(("device pipeline" if on_device else f"host DataLoader, {args.workers} workers",
                     images / (time.perf_counter() - start), setup))
    print(f"\nInput pipeline alone (CIFAR-10 JPEGs, batch {args.loader_batch}, cutout 16)")
    print("| pipeline | images/s | set-up + first batch (s) |\n|---|---:|---:|")
    for name, rate, setup in rows:
        print(f"| {name} | {rate:,.0f} | {setup:.1f} |")


def main(argv: list[str] | None = None, prog: str = "speed.py --case retrain_step") -> list[Measurement]:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", help="batch:precision:layout[:sum[:depthwise]], comma-separated (default: "
                        f"{DEFAULT_ROWS}; --tiny: {TINY_ROWS}), layout nchw or cl (channels_last); sum: the nodes' "
                        "drop-path sums on auto (our kernel, the default), dense (auto, the concatenation's "
                        "gradients of nodes that edges also read handed dense), cat (our kernel, nodes then "
                        "torch.cat) or torch (PyTorch's ops); depthwise: the depthwise convs on torch (cuDNN, the "
                        "default) or triton (kernels/depthwise_conv)")
    parser.add_argument("--genotype", default="DARTS_V2")
    parser.add_argument("--neuron", default="st_bif_qann")
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--channels", type=int, default=36)
    parser.add_argument("--conv-backend", default="auto")
    parser.add_argument("--eager", dest="graph", action="store_false", help="eager steps instead of graph replays")
    parser.add_argument("--compile", action="store_true", help="torch.compile the network (Inductor) in every row")
    parser.add_argument("--compile-mode", help="torch.compile's mode, e.g. reduce-overhead (its own CUDA graphs; "
                        "use with --eager) or max-autotune-no-cudagraphs")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="GPU time by kernel class of the first row's step, "
                        "and its roofline")
    parser.add_argument("--hbm-gbps", type=float, help="the roofline's HBM bandwidth in GB/s (default: by the GPU's "
                        "name, e.g. 3350 for an H100 SXM)")
    parser.add_argument("--data", help="CIFAR-10 root: also time the input pipelines alone")
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--loader-batch", type=int, default=256)
    parser.add_argument("--loader-batches", type=int, default=60)
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: 3 cells x 4 channels, 2 steps")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        args.layers, args.channels = 3, 4
        args.warmup, args.steps, args.repeats, args.loader_batches = 1, 2, 1, 3
    args.rows = args.rows or (TINY_ROWS if args.tiny else DEFAULT_ROWS)
    torch.backends.cudnn.benchmark = True
    rows = [(int(b), p, layout, rest[0] if rest else "auto", rest[1] if len(rest) > 1 else "torch")
            for b, p, layout, *rest in (spec.split(":") for spec in args.rows.split(","))]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if args.profile:  # before any row: an unknown GPU without --hbm-gbps stops here
        gbps = speed_roofline.hbm_gbps(name, speed_roofline.CPU_SMOKE_GBPS if args.tiny and args.hbm_gbps is None
                                       and device.type == "cpu" else args.hbm_gbps)
    print(f"{datetime.date.today()} {name}, torch {torch.__version__}; {args.genotype} {args.layers}x{args.channels} "
          f"{args.neuron}, aux, drop-path, {'graph replay' if args.graph and device.type == 'cuda' else 'eager'}, "
          f"conv_backend={args.conv_backend}{f', torch.compile mode={args.compile_mode}' if args.compile else ''}, "
          f"quantizer backward {quantizer_bwd_config()}")
    print("| batch | precision | layout | node sums | depthwise | ms / step | images/s | peak GiB | loss |\n"
          "|---:|---|---|---|---|---:|---:|---:|---:|")
    first, first_seconds, measured = None, None, []
    for row in rows:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        trainer, seconds, memory, loss = time_row(args, row, device)
        print(f"| {' | '.join(map(str, row))} | {seconds * 1e3:.1f} | {row[0] / seconds:,.0f} | {memory:.1f} | "
              f"{loss:.3f} |", flush=True)
        what = (f"{args.genotype} {args.layers}×{args.channels} {args.neuron}, batch {row[0]}, {row[1]}, {row[2]}, "
                f"node sums {row[3]}, {'' if row[4] == 'torch' else f'depthwise {row[4]}, '}"
                f"{'CUDA graph' if args.graph and device.type == 'cuda' else 'eager'}")
        measured += [Measurement("retrain_step", f"{what}: step", round(seconds * 1e3, 1), "ms"),
                     Measurement("retrain_step", f"{what}: throughput", round(row[0] / seconds), "images/s"),
                     Measurement("retrain_step", f"{what}: peak memory", round(memory, 1), "GiB")]
        if first is None:
            first, first_seconds = row, seconds
        del trainer
        gc.collect()  # a trainer's graph and its memory pool sit in reference cycles
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.profile and first is not None:  # a fresh trainer: the rows' graph pools are freed by now
        trainer = make_trainer(args, first, device)
        seconds_by_class, kernels = profile_row(trainer, first, device)
        measured += roofline_row(args, trainer, first, device, seconds_by_class, kernels, first_seconds, gbps)
        del trainer
    if args.data:
        loader_rates(args, device)
    return measured


if __name__ == "__main__":
    main()
