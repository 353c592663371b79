"""Spike-sparse convolution vs cuDNN, forward (and weight gradient), on one GPU.

Rows: conv3x3, conv1x1 and depthwise 3x3 at [256, 128, 32, 32] on iid spikes (densities 0.5,
0.1, 0.01) and plane-structured spikes (50% / 90% of the (sample, channel) planes silent), then
the spike-reading convs of a small ST-BIF DARTS network trained for a few seconds on MNIST-5k,
fed the activations they really receive (batch 64, T = 4: [256, C, H, W]).

Columns (median µs of triton.testing.do_bench, which clears L2 before every call); every row
feeds the same fp16 spikes to all columns:
  cuDNN fp16 CL   F.conv2d, fp16, channels_last input and weight (the fastest cuDNN set-up)
  cuDNN fp16      F.conv2d, fp16 NCHW (the layout our networks run in)
  cuDNN fp32      F.conv2d, fp32 NCHW (TF32 tensor cores, torch's default)
  ours            sparse_conv2d(backend="triton") on the fp16 NCHW input, no autograd: prescan,
                  packing and host work included
  ours graph      "ours" captured in a CUDA graph and replayed: GPU time only, no host work
  stage 2         the stage-2 work alone (packing + forward kernel; the block map given, as if
                  the neuron made it)
  ×ours           speedup of ours over the best cuDNN column
  dispatcher      SparseConv2d(backend="auto") called eagerly (it runs cuDNN: its overhead)
  ×disp           cuDNN fp16 on the same input / dispatcher, three interleaved rounds, medians
  disp path       the path most of the dispatcher's timed calls took (`path_counts`)
  cuDNN graph     cuDNN fp16 captured in a CUDA graph (GPU time)
  disp graph      the dispatcher captured after a `capture_warmup()` (calibration, density
                  measurement): the path it picks for a captured call, GPU time
  ×disp graph     cuDNN graph / disp graph, interleaved three rounds, medians
  graph paths     the paths of the capture's warm-up call and of the captured call
  wgrad cuDNN / wgrad ours   weight gradient alone: aten.convolution_backward vs our sparse kernel
  zero blocks     fraction of the input's 8x8 (sample, channel) blocks that are all zero
A cell that fails prints its error and reads nan; the other cells and rows go on.

Usage: python benchmarks/bench_sparse_conv.py [--train-seconds 20] [--sweep | --sweep-only] [--markdown FILE]
  --sweep  first times forward/packing tile configs, the prescan alone, the host time per call
           and calls issued back to back (--sweep-only: that, without the table)
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.testing

from kernels.sparse_conv import SparseConv2d, capture_warmup, path_counts, reset_path_counts, sparse_conv2d
from kernels.sparse_conv.function import conv_geometry
from kernels.sparse_conv.geometry import ConvGeometry
from kernels.sparse_conv.packed import pack_active_channels
from kernels.sparse_conv.prescan import block_activity, tile_activity
from kernels.sparse_conv.triton import (
    DEFAULT_CONFIG,
    KernelConfig,
    depthwise_activity,
    forward_lists,
    sparse_conv_fwd,
    sparse_depthwise_fwd,
)
from kernels.sparse_conv.wgrad import sparse_conv_wgrad, sparse_depthwise_wgrad

log = logging.getLogger("bench_sparse_conv")
BATCH, CHANNELS, SIZE = 256, 128, 32


@dataclass(frozen=True)
class Layer:
    name: str
    out_channels: int
    kernel: int
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    groups: int = 1


SYNTHETIC_LAYERS = [
    Layer("conv3x3", CHANNELS, 3, padding=1),
    Layer("conv1x1", CHANNELS, 1),
    Layer("dw3x3", CHANNELS, 3, padding=1, groups=CHANNELS),
]
SYNTHETIC_INPUTS = {  # name: (element density in active planes, fraction of silent planes)
    "iid 0.5": (0.5, 0.0),
    "iid 0.1": (0.1, 0.0),
    "iid 0.01": (0.01, 0.0),
    "planes 50% silent": (0.5, 0.5),
    "planes 90% silent": (0.5, 0.9),
}


def median_us(fn: Callable[[], object]) -> float:
    return 1000.0 * triton.testing.do_bench(fn, warmup=10, rep=30, return_mode="median")


def guarded(name: str, measure_fn: Callable[[], float]) -> float:
    """measure_fn(), or nan (the error logged) if it fails: one broken cell must not end the run."""
    try:
        return measure_fn()
    except Exception as error:  # reported, and the run goes on
        log.error("%s failed: %s: %s", name, type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        return math.nan


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """fn captured in a CUDA graph (after one warm-up call on a side stream, as capture needs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_us(fn: Callable[[], object]) -> float:
    """Median µs of fn captured in a CUDA graph and replayed (GPU time, no host work)."""
    return median_us(capture(fn).replay)


def spikes(shape, density: float, plane_silence: float, generator: torch.Generator) -> torch.Tensor:
    x = torch.randn(shape, generator=generator, device="cuda").sign()
    x *= torch.rand(shape, generator=generator, device="cuda") < density
    x *= (torch.rand(shape[:2], generator=generator, device="cuda") >= plane_silence)[:, :, None, None]
    return x


def copy_bandwidth_gbs() -> float:
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (median_us(lambda: dst.copy_(src)) * 1e-6) / 1e9


def stage2(x: torch.Tensor, weight: torch.Tensor, geometry: ConvGeometry,
           config: KernelConfig = DEFAULT_CONFIG) -> Callable[[], torch.Tensor]:
    """The stage-2 work on x (packing included), with the block map made beforehand."""
    blocks = block_activity(x)
    if geometry.is_depthwise:
        tiled, active = depthwise_activity(x, blocks, geometry, config)
        return lambda: sparse_depthwise_fwd(x, weight, None, tiled, active, config)
    lists = forward_lists(x, blocks, geometry, config)
    return lambda: sparse_conv_fwd(x, weight, None, lists, config)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).norm() / want.norm().clamp_min(1e-30)).item()


def measure(layer: Layer, x: torch.Tensor, generator: torch.Generator) -> dict[str, float]:
    """All columns for one layer on one input (x: fp16 NCHW)."""
    c_in = x.shape[1]
    conv = (layer.stride, layer.padding, layer.dilation, layer.groups)
    pairs = [layer.stride] * 2, [layer.padding] * 2, [layer.dilation] * 2
    weight = torch.randn((layer.out_channels, c_in // layer.groups, layer.kernel, layer.kernel),
                         generator=generator, device="cuda") / (c_in // layer.groups * layer.kernel**2) ** 0.5
    w16 = weight.half()
    x32, x_cl, w16_cl = x.float(), x.to(memory_format=torch.channels_last), w16.to(memory_format=torch.channels_last)
    geometry = conv_geometry(x, w16, *pairs, layer.groups)
    module = SparseConv2d(c_in, layer.out_channels, layer.kernel, stride=layer.stride, padding=layer.padding,
                          dilation=layer.dilation, groups=layer.groups, bias=False)
    module = module.cuda().half().requires_grad_(False)
    row: dict[str, float | str] = {}
    with torch.no_grad():
        module.weight.copy_(w16)
        reference = F.conv2d(x32, weight, None, *conv)
        row["rel_error"] = guarded("rel err", lambda: relative_error(
            sparse_conv2d(x, w16, None, *conv, backend="triton"), reference))
        row["zero_blocks"] = 1.0 - block_activity(x).float().mean().item()
        row["cudnn_fp16_cl"] = guarded("cuDNN fp16 CL", lambda: median_us(lambda: F.conv2d(x_cl, w16_cl, None, *conv)))
        row["cudnn_fp16"] = guarded("cuDNN fp16", lambda: median_us(lambda: F.conv2d(x, w16, None, *conv)))
        row["cudnn_fp32"] = guarded("cuDNN fp32", lambda: median_us(lambda: F.conv2d(x32, weight, None, *conv)))
        row["ours"] = guarded("ours", lambda: median_us(lambda: sparse_conv2d(x, w16, None, *conv, backend="triton")))
        row["ours_graph"] = guarded("ours graph", lambda: graph_us(
            lambda: sparse_conv2d(x, w16, None, *conv, backend="triton")))
        row["stage2"] = guarded("stage 2", lambda: median_us(stage2(x, w16, geometry)))

        def dispatcher() -> float:
            module(x)  # routes the layer
            torch.cuda.synchronize()
            reset_path_counts()
            # Interleaved with cuDNN, three rounds each: on small layers two timings of the very
            # same F.conv2d call can differ by a lot when taken minutes apart.
            cudnn, ours = [], []
            for _ in range(3):
                cudnn.append(median_us(lambda: F.conv2d(x, w16, None, *conv)))
                ours.append(median_us(lambda: module(x)))
            taken = {path: n for path, n in path_counts().items() if path not in ("probe", "sparse_wgrad")}
            row["dispatcher_path"] = max(taken, key=taken.get) if taken else "?"
            row["cudnn_fp16_paired"] = statistics.median(cudnn)
            return statistics.median(ours)

        row["dispatcher"] = guarded("dispatcher", dispatcher)

        def dispatcher_graph() -> float:
            """The module warmed up for a capture, then captured in a CUDA graph: the path the
            dispatcher picks for a captured call (graph crossover, measured density), GPU time."""
            with capture_warmup():
                for _ in range(3):  # calibrates, measures the density (read back by the next call)
                    module(x)
                    torch.cuda.synchronize()
            reset_path_counts()
            graph = capture(lambda: module(x))
            taken = {path: n for path, n in path_counts().items() if path not in ("probe", "sparse_wgrad")}
            row["dispatcher_graph_path"] = "/".join(sorted(taken))  # the warm-up call's path and the captured one's
            cudnn, ours = [], []
            cudnn_graph = capture(lambda: F.conv2d(x, w16, None, *conv))
            for _ in range(3):
                cudnn.append(median_us(cudnn_graph.replay))
                ours.append(median_us(graph.replay))
            row["cudnn_graph"] = statistics.median(cudnn)
            return statistics.median(ours)

        row["dispatcher_graph"] = guarded("dispatcher graph", dispatcher_graph)
        grad_y = torch.randn_like(reference).half()
        wgrad = sparse_depthwise_wgrad if geometry.is_depthwise else sparse_conv_wgrad
        row["wgrad_cudnn"] = guarded("wgrad cuDNN", lambda: median_us(lambda: torch.ops.aten.convolution_backward(
            grad_y, x, w16, None, *pairs, False, [0, 0], layer.groups, [False, True, False])))
        active = tile_activity(block_activity(x), geometry)[0]
        row["wgrad_ours"] = guarded("wgrad ours", lambda: median_us(
            lambda: wgrad(x, grad_y, geometry, active, w16.dtype)))
    best = min(row["cudnn_fp16_cl"], row["cudnn_fp16"], row["cudnn_fp32"])
    row["speedup"] = best / row["ours"]
    row["speedup_dispatcher"] = row.get("cudnn_fp16_paired", math.nan) / row["dispatcher"]
    row["speedup_dispatcher_graph"] = row.get("cudnn_graph", math.nan) / row["dispatcher_graph"]
    return row


def trained_layer_inputs(train_seconds: float) -> list[tuple[Layer, torch.Tensor]]:
    """Train an ST-BIF DARTS_V2 network (8 cells, 16 channels, T = 4) on MNIST-5k for
    `train_seconds`, then capture the input of every distinct spike-reading conv on a test batch."""
    from aso_se.data import MNIST5kData
    from search_space.network import build_network
    from search_space.neurons import NeuronFactory

    torch.manual_seed(0)
    data = MNIST5kData()
    train_loader, test_loader = data.train_loaders(64, seed=0)
    net = build_network("DARTS_V2", neuron=NeuronFactory("st_bif", timesteps=4), channels=16, layers=8,
                        num_classes=10, in_channels=1, image_size=28).cuda()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=3e-4)
    spike_convs = [m for m in net.modules() if isinstance(m, SparseConv2d)]
    for conv in spike_convs:  # train on cuDNN: calibrating every new shape would eat the time budget
        conv.backend = "torch"
    net.train()
    start, steps, epoch = time.time(), 0, 0
    while time.time() - start < train_seconds:
        train_loader.set_epoch(epoch)
        for images, labels in train_loader:
            logits, _ = net(images.cuda(non_blocking=True))
            loss = F.cross_entropy(logits, labels.cuda(non_blocking=True))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            if time.time() - start >= train_seconds:
                break
        epoch += 1
    net.eval()
    captured: dict[tuple, tuple[Layer, torch.Tensor]] = {}

    def hook(name):
        def capture(module, inputs):
            layer = Layer(name, module.out_channels, module.kernel_size[0], module.stride[0], module.padding[0],
                          module.dilation[0], module.groups)
            signature = (replace(layer, name=""), tuple(inputs[0].shape))
            captured.setdefault(signature, (layer, inputs[0].detach()))
        return capture

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in net.named_modules() if isinstance(m, SparseConv2d)]
    correct = total = 0
    with torch.no_grad():
        for images, labels in test_loader:
            predictions = net(images.cuda())[0].argmax(1).cpu()
            correct, total = correct + (predictions == labels).sum().item(), total + len(labels)
    for handle in handles:
        handle.remove()
    log.info("trained %d steps (%.0f s): test accuracy %.1f%% on %d MNIST-5k digits; dispatcher paths: %s",
             steps, time.time() - start, 100 * correct / total, total, path_counts())
    full_batch = [(layer, x) for layer, x in captured.values() if x.shape[0] == 64 * 4]
    return [(layer, x.half().contiguous()) for layer, x in full_batch]


def host_us_per_call(fn, calls: int = 200) -> float:
    """CPU time to issue one call (Python, checks, launches), the GPU not waited for."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return 1e6 * elapsed / calls


# (forward_pixels, forward_block_n, forward_num_warps, forward_num_stages) of the pointer forward
# (packed=False); the first is the default
FORWARD_SWEEP = [(128, 128, 4, 2)] + [
    config for config in itertools.product((64, 128, 256), (64, 128), (4, 8), (2,)) if config != (128, 128, 4, 2)]
# (forward_pixels, forward_block_n, forward_num_warps, packed_num_stages) of the packed forward; first: default
PACKED_SWEEP = [(128, 128, 4, 4)] + [
    config for config in itertools.product((64, 128, 256), (64, 128), (4, 8), (3, 4, 5)) if config != (128, 128, 4, 4)
    and config[0] * config[1] <= 128 * 128 * config[2] // 4]
ACTIVE_PACK_SWEEP = [(512, 2)] + [c for c in itertools.product((256, 512, 1024), (2, 4, 8)) if c != (512, 2)]
PRESCAN_SWEEP = list(itertools.product((4096, 8192, 16384, 32768), (4, 8)))  # (elements per program, warps)
DEPTHWISE_SWEEP = [(1, 1024), (2, 1024), (4, 128), (1, 512)]  # (fewest channels, pixels per program); first: default


def sweep(generator: torch.Generator) -> None:
    """Forward, depthwise and packing tile configs for fp16 at [256,128,32,32], the prescan alone,
    and the host time per call. Prints one line per config."""
    silent = spikes((BATCH, CHANNELS, SIZE, SIZE), 0.5, 0.9, generator).half()
    dense = spikes(silent.shape, 0.5, 0.0, generator).half()
    inputs = {"90% silent planes": silent, "dense": dense}
    weight = torch.randn((CHANNELS, CHANNELS, 3, 3), device="cuda").half()
    geometry = conv_geometry(silent, weight, [1, 1], [1, 1], [1, 1], 1)
    print("\nsweep: fp16 [256,128,32,32] NCHW, stage 2 alone (packing included), µs", flush=True)
    forward_times = {}
    x_cl, weight_cl = silent.to(memory_format=torch.channels_last), weight.to(memory_format=torch.channels_last)
    print(f"cuDNN fp16 CL conv3x3 {median_us(lambda: F.conv2d(x_cl, weight_cl, None, 1, 1)):.1f}", flush=True)
    blocks = block_activity(silent)
    for pixels, warps in ACTIVE_PACK_SWEEP:
        us = guarded("active-channel packing",
                     lambda: graph_us(lambda: pack_active_channels(silent, blocks, weight, pixels, warps)))
        print(f"active-channel packing (graph) pixels={pixels} warps={warps}: 90% silent {us:.1f}", flush=True)
    for pixels, block_n, warps, stages in PACKED_SWEEP:
        config = replace(DEFAULT_CONFIG, forward_pixels=pixels, forward_block_n=block_n, forward_num_warps=warps,
                         packed_num_stages=stages)
        forward_times[config] = guarded("forward", lambda: graph_us(stage2(silent, weight, geometry, config)))
        print(f"packed forward (packing included, graph) pixels={pixels} block_n={block_n} warps={warps} "
              f"stages={stages}: 90% silent {forward_times[config]:.1f}", flush=True)
    for pixels, block_n, warps, stages in FORWARD_SWEEP:
        config = replace(DEFAULT_CONFIG, forward_pixels=pixels, forward_block_n=block_n, forward_num_warps=warps,
                         forward_num_stages=stages, packed=False)
        forward_times[config] = guarded("forward", lambda: graph_us(stage2(silent, weight, geometry, config)))
        print(f"pointer forward (graph) pixels={pixels} block_n={block_n} warps={warps} stages={stages}: "
              f"90% silent {forward_times[config]:.1f}", flush=True)
    for config in sorted(forward_times, key=forward_times.get)[:3]:
        times = ", ".join(f"{name} {guarded(name, lambda: graph_us(stage2(x_, weight, geometry, config))):.1f}"
                          for name, x_ in inputs.items())
        stages = config.forward_num_stages if config.packed is False else config.packed_num_stages
        print(f"best forward {'pointer' if config.packed is False else 'packed'} {config.forward_pixels}/"
              f"{config.forward_block_n}/{config.forward_num_warps}/{stages}: {times}", flush=True)
    depthwise_w = torch.randn((CHANNELS, 1, 3, 3), device="cuda").half()
    depthwise_geometry = conv_geometry(silent, depthwise_w, [1, 1], [1, 1], [1, 1], CHANNELS)
    for block_c, pixels in DEPTHWISE_SWEEP:
        config = replace(DEFAULT_CONFIG, depthwise_block_c=block_c, depthwise_pixels=pixels)
        times = ", ".join(
            f"{name} {guarded(name, lambda: graph_us(stage2(x_, depthwise_w, depthwise_geometry, config))):.1f}"
            for name, x_ in inputs.items())
        print(f"dw3x3 (graph) block_c={block_c} pixels={pixels}: {times}", flush=True)
    for name, x_ in inputs.items():
        times = ", ".join(f"{elements}/{warps} {median_us(lambda: block_activity(x_, elements, warps)):.1f}"
                          for elements, warps in PRESCAN_SWEEP)
        print(f"prescan {name}: block map (elements per program/warps) {times}", flush=True)
    module = SparseConv2d(CHANNELS, CHANNELS, 3, padding=1, bias=False).cuda().half().requires_grad_(False)
    lists = forward_lists(silent, block_activity(silent), geometry)
    with torch.no_grad():
        triton_call = lambda: sparse_conv2d(silent, weight, None, 1, 1, backend="triton")  # noqa: E731
        print(f"host µs per call: F.conv2d {host_us_per_call(lambda: F.conv2d(silent, weight, None, 1, 1)):.1f}, "
              f"sparse_conv2d(triton) {host_us_per_call(triton_call):.1f}, "
              f"of which block map {host_us_per_call(lambda: block_activity(silent)):.1f} and "
              f"stage 2 {host_us_per_call(lambda: sparse_conv_fwd(silent, weight, None, lists)):.1f}; "
              f"SparseConv2d(auto) {host_us_per_call(lambda: module(silent)):.1f}", flush=True)
        print(f"back to back, µs per call (100 calls, no L2 flush): "
              f"F.conv2d fp16 CL {back_to_back_us(lambda: F.conv2d(x_cl, weight_cl, None, 1, 1)):.1f}, "
              f"sparse_conv2d(triton) {back_to_back_us(triton_call):.1f}", flush=True)


def back_to_back_us(fn, calls: int = 100) -> float:
    """GPU time per call of `calls` calls issued back to back: host work shows where it exceeds
    the GPU work (it is then the bound), unlike in do_bench's flushed single calls."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return 1000.0 * start.elapsed_time(end) / calls


COLUMNS = [("zero blocks", "zero_blocks", "{:.3f}"), ("cuDNN fp16 CL", "cudnn_fp16_cl", "{:.1f}"),
           ("cuDNN fp16", "cudnn_fp16", "{:.1f}"), ("cuDNN fp32", "cudnn_fp32", "{:.1f}"),
           ("ours", "ours", "{:.1f}"), ("ours graph", "ours_graph", "{:.1f}"), ("stage 2", "stage2", "{:.1f}"),
           ("×ours", "speedup", "{:.2f}"), ("dispatcher", "dispatcher", "{:.1f}"),
           ("×disp", "speedup_dispatcher", "{:.2f}"), ("disp path", "dispatcher_path", "{}"),
           ("cuDNN graph", "cudnn_graph", "{:.1f}"), ("disp graph", "dispatcher_graph", "{:.1f}"),
           ("×disp graph", "speedup_dispatcher_graph", "{:.2f}"), ("graph paths", "dispatcher_graph_path", "{}"),
           ("wgrad cuDNN", "wgrad_cudnn", "{:.1f}"),
           ("wgrad ours", "wgrad_ours", "{:.1f}"), ("rel err", "rel_error", "{:.1e}")]


def table(rows: list[tuple[str, str, dict[str, float]]]) -> str:
    header = "| layer | input | " + " | ".join(name for name, _, _ in COLUMNS) + " |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 2)]
    for layer, inputs, row in rows:
        cells = [fmt.format(row.get(key, math.nan)) for _, key, fmt in COLUMNS]
        lines.append(f"| {layer} | {inputs} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_row(rows: list, name: str, inputs: str, measure_fn: Callable[[], dict[str, float]]) -> None:
    """Measures one row and prints it at once; a row that fails is reported and left empty."""
    try:
        row = measure_fn()
    except Exception as error:  # reported, and the run goes on
        log.error("row %s / %s failed: %s: %s", name, inputs, type(error).__name__, error)
        row = {}
    rows.append((name, inputs, row))
    print(table(rows[-1:]).splitlines()[-1], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="time tile configs first (then the table)")
    parser.add_argument("--sweep-only", action="store_true", help="the sweep, without the table")
    parser.add_argument("--train-seconds", type=float, default=20.0)
    parser.add_argument("--markdown", help="also write the table here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("kernels.sparse_conv.calibration").setLevel(logging.WARNING)
    generator = torch.Generator("cuda").manual_seed(0)
    header = (f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
              f"cuDNN {torch.backends.cudnn.version()} | {datetime.date.today()} | "
              f"copy {copy_bandwidth_gbs():.0f} GB/s | `python {' '.join(sys.argv)}`")
    print(header, flush=True)
    if args.sweep or args.sweep_only:
        sweep(generator)
    if args.sweep_only:
        return
    rows: list[tuple[str, str, dict[str, float]]] = []
    for layer, (inputs, (density, silence)) in itertools.product(SYNTHETIC_LAYERS, SYNTHETIC_INPUTS.items()):
        x = spikes((BATCH, CHANNELS, SIZE, SIZE), density, silence, generator).half()
        add_row(rows, f"{layer.name} [{BATCH},{CHANNELS},{SIZE},{SIZE}]", inputs,
                lambda: measure(layer, x, generator))
    reset_path_counts()
    try:
        real = trained_layer_inputs(args.train_seconds)
    except Exception as error:  # reported, and the run goes on
        log.error("training for real activations failed: %s: %s", type(error).__name__, error)
        real = []
    for layer, x in real:
        shape = ",".join(map(str, x.shape))
        name = f"{layer.name} k{layer.kernel} s{layer.stride} d{layer.dilation} g{layer.groups} [{shape}]"
        add_row(rows, name, "real (trained ST-BIF)", lambda: measure(layer, x, generator))
    result = header + "\n\n" + table(rows)
    print("\n" + result)
    if args.markdown:
        with open(args.markdown, "w") as file:
            file.write(result + "\n")


if __name__ == "__main__":
    main()
