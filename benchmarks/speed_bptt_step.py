"""Speed case bptt_step: the binary SNN's BPTT fine-tuning step beside the QANN step of the same network and batch.

    python benchmarks/speed.py --case bptt_step       # DARTS_V2_SPIKE_NATIVE and DARTS_V2, 20×36, T = 4 and 8, fp16
    python benchmarks/speed.py --case bptt_step --genotypes DARTS_V2_SPIKE_NATIVE --timesteps 4 --modes graph
    python benchmarks/speed.py --case bptt_step --tiny  # CPU smoke run of the case itself (no rows)

Why: fine-tuning the binary ST-BIF SNN of a QANN (train.py ``snn_finetune``, experiment=cifar10_binary_snn) runs the
network T times per image, through the fused multi-step ST-BIF kernel. Issue 98 asks that T be paid once: the BPTT
step's time against the QANN step's, at the same batch, in the same process, says how far it is from that.

Per genotype (a 4-level QANN of random weights, DARTS's 20×36 network; ``conv_backend=torch`` as the fast recipe), in
each mode (a CUDA graph replay as ``cuda_graph=true`` trains, and eager): the QANN's retrain step (aux head,
drop-path, clipping: speed_retrain_step's) and the fine-tuning step of its SNN (``finetune_trainer``: BPTT at T, no
aux head, no drop-path), each on device-resident batches. The batch is ``--image-steps`` / T (the activations BPTT
keeps grow with T·batch), and the QANN runs at each batch the SNN does. Each row: the host's wall clock per step
(Python included; the images/s), the time per step between CUDA events around the same steps, the host's time to
issue one step (its Python and launches; it also waits once the GPU's launch queue is full), and the peak memory.

Peers (``--peers``, first genotype, T = ``--peer-timesteps``, every mode): the same SNN with each ST-BIF neuron
swapped for spikingjelly 2.0's multi-step IFNode on its torch backend (``spikingjelly``: its kernels picked with
SJ_IF_CUDA_IMPLEMENTATION=torch; a soft-reset IF neuron with a sigmoid surrogate fed fp32, so a timing peer, not the
same function), or for our ST-BIF neuron's torch reference (``reference``); or our SNN with each batch norm's scale
as a pass of its own over the T steps instead of folded into the conv before it (``separate_scales``,
``trainable_snn(fold_scales=False)``). Each as its step time over ours. A peer that fails (e.g. cannot be captured in
a graph) prints why and loses its row, not the case's other rows.

``--profile`` (first genotype, first T) then says where the BPTT step's time goes: one eager BPTT step at batch B
and one eager QANN step at batch B·T (the same image-steps through the convs) profiled by kernel class
(speed_retrain_step.KERNEL_CLASSES), each class's time per step as a row. What BPTT spends beyond the QANN of
B·T images is what paying for T more than once costs, class by class. Each profiled step also gets its roofline
(case ``roofline``): the least bytes per class by benchmarks/speed_roofline.py's byte model against those times.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import functools
import gc
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from spikingjelly.activation_based import neuron as sj_neuron
from spikingjelly.activation_based import surrogate as sj_surrogate

if __package__ in (None, ""):  # run as a script: the repository on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aso_se.parallel.distributed import DistributedContext
from aso_se.train.snn_finetune import FinetuneSettings, finetune_trainer
from benchmarks import speed_roofline
from benchmarks.rows import Measurement
from benchmarks.speed_retrain_step import CLASS_NAMES, profile_row, retrain_trainer, step_least_bytes, sync
from search_space.errors import UserInputError
from search_space.network import build_network
from search_space.neurons import NeuronFactory
from search_space.trainable_snn import trainable_snn, with_neuron_backend, with_neurons

MODES = ("graph", "eager")
PEERS = ("spikingjelly", "reference", "separate_scales")
# spikingjelly 2.0 picks its IF neuron's CUDA implementation from this variable when its IF ops are first loaded.
SJ_IF_IMPLEMENTATION = "SJ_IF_CUDA_IMPLEMENTATION"
# A graphed step warms up on GraphedTrainStep's eager steps, then captures: at least this many calls before timing.
GRAPH_WARMUP = 4


@dataclass(frozen=True)
class StepTime:
    """Seconds per training step, three ways, and the peak GPU memory of the row."""

    wall: float          # host wall clock over synced runs of steps, Python included
    gpu: float | None    # between CUDA events around the same runs (None on a CPU)
    issue: float         # host time to issue one step (median), no sync
    peak_gib: float


def time_steps(trainer, batch: int, device: torch.device, *, warmup: int, steps: int, repeats: int) -> StepTime:
    """Median times of ``trainer``'s step (its graph replay, or eager) over ``repeats`` runs of ``steps``."""
    inputs = trainer._to_device(torch.randn(batch, 3, 32, 32, device=device))
    labels = torch.randint(10, (batch,), device=device)
    step = trainer.graphed_step or trainer.eager_step
    trainer.model.train()
    for _ in range(max(warmup, GRAPH_WARMUP if trainer.graphed_step is not None else 1)):
        step(inputs, labels)
    sync(device)
    on_gpu = device.type == "cuda"
    walls, gpus, issues = [], [], []
    for _ in range(repeats):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if on_gpu else None
        sync(device)
        started = time.perf_counter()
        if events:
            events[0].record()
        for _ in range(steps):
            issued = time.perf_counter()
            step(inputs, labels)
            issues.append(time.perf_counter() - issued)
        if events:
            events[1].record()
        sync(device)
        walls.append((time.perf_counter() - started) / steps)
        if events:
            gpus.append(events[0].elapsed_time(events[1]) / 1e3 / steps)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if on_gpu else 0.0
    return StepTime(statistics.median(walls), statistics.median(gpus) if gpus else None, statistics.median(issues),
                    peak)


@dataclass(frozen=True)
class Row:
    """One timed step: which network, at which T (0: the QANN) and batch, in which mode, against which step."""

    genotype: str
    network: str
    timesteps: int
    batch: int
    mode: str
    time: StepTime | None           # None: out of GPU memory
    baseline: str = ""              # what ``ratio`` divides by
    ratio: float | None = None

    def images_per_second(self) -> float | None:
        return self.batch / self.time.wall if self.time else None


def measurements(rows: list[Row], args) -> list[Measurement]:
    """Each timed row's images/s, wall and CUDA-event step times, ratio and peak memory as result rows."""
    found = []
    for row in rows:
        if row.time is None:
            continue
        t = f", T = {row.timesteps}" if row.timesteps else ""
        what = (f"{row.genotype} {args.layers}×{args.channels}, {row.network}{t}, batch {row.batch}, "
                f"{args.precision}{depthwise_label(args)}, {'CUDA graph' if row.mode == 'graph' else 'eager'}")
        note = f"level-{args.level} QANN of random weights; device-resident batches"
        found += [Measurement("bptt_step", f"{what}: throughput", round(row.images_per_second()), "images/s", note),
                  Measurement("bptt_step", f"{what}: step, host wall clock", round(row.time.wall * 1e3, 2), "ms",
                              "Python included")]
        if row.time.gpu is not None:
            found.append(Measurement("bptt_step", f"{what}: step, CUDA events", round(row.time.gpu * 1e3, 2), "ms"))
        if row.ratio is not None:
            found.append(Measurement("bptt_step", f"{what}: step / {row.baseline}", round(row.ratio, 2), "x",
                                     "host wall clock, same batch and mode, same process"))
        if row.time.peak_gib:
            found.append(Measurement("bptt_step", f"{what}: peak memory", round(row.time.peak_gib, 1), "GiB"))
    return found


def print_row(row: Row) -> None:
    if row.time is None:
        print(f"| {row.genotype} | {row.network} | {row.timesteps or ''} | {row.batch} | {row.mode} | "
              "out of memory | | | | | |", flush=True)
        return
    gpu = "" if row.time.gpu is None else f"{row.time.gpu * 1e3:.1f}"
    ratio = "" if row.ratio is None else f"{row.ratio:.2f} ({row.baseline})"
    print(f"| {row.genotype} | {row.network} | {row.timesteps or ''} | {row.batch} | {row.mode} | "
          f"{row.time.wall * 1e3:.1f} | {gpu} | {row.time.issue * 1e3:.1f} | {row.images_per_second():,.0f} | "
          f"{ratio} | {row.time.peak_gib:.1f} |", flush=True)


def depthwise_label(args) -> str:
    """The rows' mention of the depthwise convs' backend where it is not the default (cuDNN)."""
    return "" if args.depthwise_backend == "torch" else f", depthwise {args.depthwise_backend}"


def qann_network(genotype: str, args) -> torch.nn.Module:
    """The QANN of ``genotype`` (random weights, seed 0) as experiment=cifar10_binary_snn builds it, on the CPU."""
    torch.manual_seed(0)
    return build_network(genotype, neuron=NeuronFactory("st_bif_qann", timesteps=1, level=args.level),
                         channels=args.channels, layers=args.layers, num_classes=10, auxiliary=True,
                         conv_backend="torch", depthwise_backend=args.depthwise_backend)


def bptt_trainer(qann, timesteps: int, args, device, *, graph: bool, snn=None):
    """The fine-tuning Retrainer of ``qann``'s SNN (or of ``snn``, that SNN with other neurons) at ``timesteps``."""
    sgd = functools.partial(torch.optim.SGD, momentum=0.9, weight_decay=3e-4, fused=device.type == "cuda")
    return finetune_trainer(qann, FinetuneSettings(epochs=1, timesteps=timesteps), optimizer=sgd, grad_clip=5.0,
                            precision=args.precision, ctx=DistributedContext(device=device), log_every_n_steps=10,
                            cuda_graph=graph, channels_last=args.channels_last, snn=snn)


class Float32IFNode(sj_neuron.IFNode):
    """spikingjelly 2.0's multi-step IF neuron fed fp32, its output in its input's dtype.

    Its state takes its input's dtype, and spikingjelly's registered implementations (its torch backend among them)
    take only an fp32 state: an fp16 input would send it to its reference formulas, or stop it where the torch backend
    is asked for. Under fp16 autocast the SNN's neurons are fed fp16 (the folded batch norms' maps run in their input's
    dtype), so every IFNode pays a cast each way: the peer's ratio includes those casts."""

    def multi_step_forward(self, x_seq: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return super().multi_step_forward(x_seq.float(), *args, **kwargs).to(x_seq.dtype)


def spikingjelly_if(neuron: torch.nn.Module) -> torch.nn.Module:
    """The peer's neuron in place of ``neuron``: a soft-reset IF neuron with a sigmoid surrogate."""
    return Float32IFNode(v_threshold=1.0, v_reset=None, surrogate_function=sj_surrogate.Sigmoid(), step_mode="m")


def spikingjelly_torch_backend(device: torch.device) -> str:
    """Asks spikingjelly for its IF neuron's torch implementation on ``device`` and returns the one it binds."""
    from spikingjelly.activation_based import functional as sj_functional

    requested = os.environ.setdefault(SJ_IF_IMPLEMENTATION, "torch")
    bound = str(sj_functional.neuron_implementation("if", device)["implementation"])
    if requested != "torch" or "torch" not in bound:
        raise UserInputError(f"spikingjelly's IF neuron runs {bound!r} ({SJ_IF_IMPLEMENTATION}={requested}); the "
                             f"peer is its torch backend: unset {SJ_IF_IMPLEMENTATION} or pass --peers reference")
    return bound


def peer_snn(peer: str, qann, timesteps: int, device: torch.device) -> tuple[torch.nn.Module, str]:
    """The peer's SNN (the QANN's trainable SNN with its neurons swapped) and its name in the table."""
    if peer == "separate_scales":
        return (trainable_snn(qann, timesteps, fold_scales=False),
                "binary SNN BPTT, norm scales as passes of their own")
    snn = trainable_snn(qann, timesteps)
    if peer == "reference":
        return with_neuron_backend(snn, "torch"), "binary SNN BPTT, ST-BIF torch reference"
    bound = spikingjelly_torch_backend(device)
    return with_neurons(snn, spikingjelly_if), f"BPTT, spikingjelly 2.0 IFNode ({bound})"


def run_row(make, genotype: str, network: str, timesteps: int, batch: int, mode: str, args, device) -> Row:
    """Times the trainer ``make()`` builds; a row without a time if it runs out of GPU memory."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer = None
    try:
        trainer = make()
        timed = time_steps(trainer, batch, device, warmup=args.warmup, steps=args.steps, repeats=args.repeats)
    except torch.OutOfMemoryError:
        timed = None
    finally:
        del trainer
        gc.collect()  # a trainer's graph and its memory pool sit in reference cycles
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return Row(genotype, network, timesteps, batch, mode, timed)


def compared(row: Row, baseline: Row | None, name: str) -> Row:
    if row.time is None or baseline is None or baseline.time is None:
        return row
    return Row(row.genotype, row.network, row.timesteps, row.batch, row.mode, row.time, name,
               row.time.wall / baseline.time.wall)


def genotype_rows(genotype: str, args, device, peers: list[str], rows: list[Row]) -> None:
    qann = qann_network(genotype, args)
    for mode in args.modes:
        graph = mode == "graph" and device.type == "cuda"
        batches = {timesteps: max(1, args.image_steps // timesteps) for timesteps in args.timesteps}
        qann_rows = {}
        for batch in sorted(set(batches.values()), reverse=True):
            row = run_row(lambda: retrain_trainer(copy.deepcopy(qann), args.precision, args.channels_last, device,
                                                  graph=graph),
                          genotype, "QANN step", 0, batch, mode, args, device)
            qann_rows[batch] = row
            rows.append(row)
            print_row(row)
        for timesteps, batch in batches.items():
            ours = compared(run_row(lambda: bptt_trainer(qann, timesteps, args, device, graph=graph), genotype,
                                    "binary SNN BPTT", timesteps, batch, mode, args, device),
                            qann_rows[batch], "QANN step")
            rows.append(ours)
            print_row(ours)
            if timesteps != args.peer_timesteps:
                continue
            for peer in peers:
                try:
                    snn, name = peer_snn(peer, qann, timesteps, device)
                    row = compared(run_row(lambda: bptt_trainer(qann, timesteps, args, device, graph=graph, snn=snn),
                                           genotype, name, timesteps, batch, mode, args, device),
                                   ours, "ours")
                except UserInputError:
                    raise
                except Exception as error:  # a peer that fails (e.g. cannot be captured) loses its row, not the case
                    print(f"| {genotype} | peer {peer} | {timesteps} | {batch} | {mode} | failed: "
                          f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''} |", flush=True)
                    continue
                rows.append(row)
                print_row(row)


def profile_rows(genotype: str, timesteps: int, batch: int, args, device) -> list[Measurement]:
    """GPU time per eager step by kernel class: the BPTT step at ``batch`` and the QANN step at ``batch`` × T, each
    with its roofline (the least bytes per class of benchmarks/speed_roofline.py's byte model against those times)."""
    gbps = (speed_roofline.hbm_gbps(torch.cuda.get_device_name(device), args.hbm_gbps) if device.type == "cuda"
            else speed_roofline.CPU_SMOKE_GBPS)
    qann = qann_network(genotype, args)
    steps = {"QANN step": (timesteps * batch, lambda: retrain_trainer(copy.deepcopy(qann), args.precision,
                                                                       args.channels_last, device, graph=False)),
             f"binary SNN BPTT, T = {timesteps}": (batch, lambda: bptt_trainer(qann, timesteps, args, device,
                                                                               graph=False))}
    found = []
    for network, (images, make) in steps.items():
        trainer = make()
        seconds, kernels = profile_row(trainer, (images, network), device)
        what = (f"{genotype} {args.layers}×{args.channels}, {network}, batch {images}, {args.precision}"
                f"{depthwise_label(args)}, eager")
        found += [Measurement("bptt_step", f"{what}: {label}: time per step", round(value * 1e3, 2), "ms",
                              f"profiled kernel time ({kernels.get(label, 0)} kernels); the QANN step at batch "
                              f"{timesteps} × {batch} beside the BPTT step at {batch}")
                  for label, value in sorted(seconds.items(), key=lambda item: -item[1])]
        least = step_least_bytes(trainer, images, device)
        lines = speed_roofline.roofline_lines(least, seconds, kernels, CLASS_NAMES,
                                              {"step, kernel time of an eager step": sum(seconds.values())})
        speed_roofline.print_roofline(lines, gbps, f"Roofline of one eager step ({what})")
        found += speed_roofline.measurements(lines, gbps, what, f"HBM {gbps:,.0f} GB/s; class times from the "
                                             "profiled eager step; least bytes from benchmarks/speed_roofline.py")
        del trainer
        gc.collect()
    return found


def positive_ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers, e.g. 4,8")
    return values


def names(choices: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        chosen = [part for part in text.split(",") if part]
        unknown = [part for part in chosen if part not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"{unknown[0]!r} is not one of {', '.join(choices)}")
        return chosen
    return parse


def main(argv: list[str] | None = None) -> list[Measurement]:
    parser = argparse.ArgumentParser(prog="speed.py --case bptt_step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--genotypes", default="DARTS_V2_SPIKE_NATIVE,DARTS_V2", help="comma-separated")
    parser.add_argument("--timesteps", type=positive_ints, default=[4, 8], help="the BPTT's T, comma-separated")
    parser.add_argument("--image-steps", type=int, default=512,
                        help="images × T per batch: the batch at T is this / T (and the QANN's, beside it)")
    parser.add_argument("--modes", type=names(MODES), default=list(MODES), help="graph (replays), eager, or both")
    parser.add_argument("--peers", type=names(PEERS), default=["spikingjelly", "separate_scales"],
                        help="comma-separated: spikingjelly (IFNode, torch backend), reference (our neuron's torch "
                        "reference), separate_scales (norm scales not folded into convs); '' for none")
    parser.add_argument("--peer-timesteps", type=int, default=4, help="the T at which the peers run")
    parser.add_argument("--level", type=int, default=4, help="the QANN's quantization levels (neuron.level)")
    parser.add_argument("--precision", default="fp16", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--layout", default="cl", choices=("cl", "nchw"), help="cl: channels_last")
    parser.add_argument("--depthwise-backend", default="torch", choices=("torch", "triton"),
                        help="the depthwise convs: cuDNN, or kernels/depthwise_conv (both gradients in one pass)")
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--channels", type=int, default=36)
    parser.add_argument("--warmup", type=int, default=5, help=f"steps before timing (graphs: at least {GRAPH_WARMUP})")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hbm-gbps", type=float, help="the GPU's HBM bandwidth for --profile's roofline (default: "
                        "by its name)")
    parser.add_argument("--profile", action="store_true", help="also profile the BPTT step and the QANN step of as "
                        "many image-steps by kernel class (first genotype, first T)")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: 3 cells × 4 channels, T = 2, batch 4, "
                        "fp32, every peer")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        args.layers, args.channels, args.timesteps, args.image_steps, args.peer_timesteps = 3, 4, [2], 8, 2
        args.precision, args.peers = "fp32", list(PEERS)
        args.warmup, args.steps, args.repeats = 1, 2, 1
    if args.image_steps < 1 or args.steps < 1 or args.repeats < 1:
        raise UserInputError("--image-steps, --steps and --repeats must be positive integers")
    if device.type != "cuda" and not args.tiny:
        raise UserInputError("bptt_step times a GPU's steps: run it with CUDA, or pass --tiny (a CPU smoke run)")
    if device.type != "cuda":
        args.modes = ["eager"]  # no graphs on a CPU
    args.channels_last = args.layout == "cl"
    genotypes = [name for name in args.genotypes.split(",") if name]
    torch.backends.cudnn.benchmark = True
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{datetime.date.today()} {name}, torch {torch.__version__}; {args.layers}×{args.channels}, level "
          f"{args.level}, {args.precision}, {args.layout}, {args.image_steps} image-steps per batch, depthwise convs "
          f"{args.depthwise_backend}")
    print("| genotype | network | T | batch | mode | wall ms / step | GPU ms / step | host issue ms / step | "
          "images/s | step / baseline | peak GiB |\n|---|---|---:|---:|---|---:|---:|---:|---:|---|---:|")
    rows: list[Row] = []  # filled as each row is timed: a stopped case (speed.py's SIGTERM) keeps the rows it has
    try:
        for index, genotype in enumerate(genotypes):
            genotype_rows(genotype, args, device, args.peers if index == 0 else [], rows)
        profiled = profile_rows(genotypes[0], args.timesteps[0], max(1, args.image_steps // args.timesteps[0]), args,
                                device) if args.profile and genotypes else []
    except KeyboardInterrupt:
        print(f"stopped after {len(rows)} rows: keeping them", file=sys.stderr)
        profiled = []
    return measurements(rows, args) + profiled
