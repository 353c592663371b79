"""Spike-sparse convolution vs cuDNN, forward (and weight gradient), on one GPU.

Rows: conv3x3, conv1x1 and depthwise 3x3 at [256, 128, 32, 32] on iid spikes (densities 0.5,
0.1, 0.01) and plane-structured spikes (50% / 90% of the (sample, channel) planes silent), then
the spike-reading convs of a small ST-BIF DARTS network trained for a few seconds on MNIST-5k,
fed the activations they really receive (batch 64, T = 4: [256, C, H, W]).

Columns (median µs of triton.testing.do_bench, which clears L2 before every call):
  cuDNN fp16 CL   F.conv2d, fp16, channels_last input and weight (the fastest cuDNN set-up)
  cuDNN fp32      F.conv2d, fp32 NCHW (TF32 tensor cores, torch's default)
  ours            sparse_conv2d(backend="triton") on the fp16 channels_last input: prescan included
  ours compute    the stage-2 kernel alone (activity lists given, as if the neuron made them)
  dispatcher      SparseConv2d(backend="auto") in steady state (calibrated, tracker warmed up)
  ×ours           speedup of ours over the best cuDNN column
  ×disp           speedup of the dispatcher over cuDNN on the same input (fp16 channels_last):
                  the dispatcher cannot change the caller's dtype or layout
  wgrad cuDNN / wgrad ours   weight gradient alone: aten.convolution_backward vs our sparse kernel
  zero blocks     fraction of the input's 8x8 (sample, channel) blocks that are all zero

Usage: python benchmarks/bench_sparse_conv.py [--train-seconds 45] [--markdown FILE] | --sweep
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import logging
import sys
import time
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.testing

from kernels.sparse_conv import SparseConv2d, path_counts, reset_path_counts, sparse_conv2d
from kernels.sparse_conv.function import conv_geometry
from kernels.sparse_conv.geometry import ConvGeometry
from kernels.sparse_conv.triton import (
    DEFAULT_CONFIG, KernelConfig, block_activity, prescan, sparse_conv_fwd, sparse_conv_wgrad,
    sparse_depthwise_fwd, sparse_depthwise_wgrad,
)

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


def median_us(fn) -> float:
    return 1000.0 * triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def spikes(shape, density: float, plane_silence: float, generator: torch.Generator) -> torch.Tensor:
    x = torch.randn(shape, generator=generator, device="cuda").sign()
    x *= torch.rand(shape, generator=generator, device="cuda") < density
    x *= (torch.rand(shape[:2], generator=generator, device="cuda") >= plane_silence)[:, :, None, None]
    return x


def copy_bandwidth_gbs() -> float:
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (median_us(lambda: dst.copy_(src)) * 1e-6) / 1e9


def _stage2(x: torch.Tensor, weight: torch.Tensor, geometry: ConvGeometry, config: KernelConfig):
    active, index, count = prescan(x, geometry)
    if geometry.is_depthwise:
        return lambda: sparse_depthwise_fwd(x, weight, None, geometry, active, config)
    return lambda: sparse_conv_fwd(x, weight, None, geometry, index, count, config)


def measure(layer: Layer, x: torch.Tensor, generator: torch.Generator) -> dict[str, float]:
    """All columns for one layer on one input (x: fp16 channels_last)."""
    c_in = x.shape[1]
    conv = (layer.stride, layer.padding, layer.dilation, layer.groups)
    weight = torch.randn((layer.out_channels, c_in // layer.groups, layer.kernel, layer.kernel),
                         generator=generator, device="cuda") / (c_in // layer.groups * layer.kernel**2) ** 0.5
    w16 = weight.half().to(memory_format=torch.channels_last)
    x32 = x.float().contiguous()
    geometry = conv_geometry(x, w16, [layer.stride] * 2, [layer.padding] * 2, [layer.dilation] * 2, layer.groups)
    module = SparseConv2d(c_in, layer.out_channels, layer.kernel, stride=layer.stride, padding=layer.padding,
                          dilation=layer.dilation, groups=layer.groups, bias=False)
    module = module.cuda().half().to(memory_format=torch.channels_last).requires_grad_(False)
    module.weight.copy_(w16)
    with torch.no_grad():
        ours = sparse_conv2d(x, w16, None, *conv, backend="triton")
        error = ((ours.float() - F.conv2d(x32, weight, None, *conv)).norm() / ours.float().norm()).item()
        for _ in range(40):  # calibrate and let the call site's density measurement come back
            module(x)
        torch.cuda.synchronize()
        grad_y = torch.randn_like(ours)
        active = prescan(x, geometry)[0]
        wgrad = sparse_depthwise_wgrad if geometry.is_depthwise else sparse_conv_wgrad
        row = dict(
            zero_blocks=1.0 - block_activity(x).float().mean().item(),
            cudnn_fp16_cl=median_us(lambda: F.conv2d(x, w16, None, *conv)),
            cudnn_fp32=median_us(lambda: F.conv2d(x32, weight, None, *conv)),
            ours=median_us(lambda: sparse_conv2d(x, w16, None, *conv, backend="triton")),
            ours_compute=median_us(_stage2(x, w16, geometry, DEFAULT_CONFIG)),
            dispatcher=median_us(lambda: module(x)),
            wgrad_cudnn=median_us(lambda: torch.ops.aten.convolution_backward(
                grad_y, x, w16, None, [layer.stride] * 2, [layer.padding] * 2, [layer.dilation] * 2,
                False, [0, 0], layer.groups, [False, True, False])),
            wgrad_ours=median_us(lambda: wgrad(x, grad_y, geometry, active, w16.dtype)),
            rel_error=error,
        )
    best = min(row["cudnn_fp16_cl"], row["cudnn_fp32"])
    row["speedup_ours"] = best / row["ours"]
    row["speedup_dispatcher"] = row["cudnn_fp16_cl"] / row["dispatcher"]
    return row


def trained_layer_inputs(train_seconds: float) -> list[tuple[Layer, torch.Tensor]]:
    """Train an ST-BIF DARTS_V2 network (8 cells, 16 channels, T = 4) on MNIST-5k for
    `train_seconds`, then capture the input of every distinct spike-reading conv on a test batch."""
    from aso_se.data import MNIST5kData
    from search_space.network import build_network

    torch.manual_seed(0)
    data = MNIST5kData()
    train_loader, test_loader = data.train_loaders(64, seed=0)
    net = build_network("DARTS_V2", neuron="st_bif", channels=16, layers=8, num_classes=10, in_channels=1,
                        timesteps=4, image_size=28).cuda()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=3e-4)
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
    return [(layer, x.half().to(memory_format=torch.channels_last)) for layer, x in full_batch]


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


def sweep(generator: torch.Generator) -> None:
    """Tile sizes of the conv3x3 stage-2 and weight-gradient kernels on 90%-silent-planes input,
    the prescan alone, and the host time per call."""
    x = spikes((BATCH, CHANNELS, SIZE, SIZE), 0.5, 0.9, generator).half().to(memory_format=torch.channels_last)
    dense_w = torch.randn((CHANNELS, CHANNELS, 3, 3), device="cuda").half()
    print("\nsweep (fp16, 90% silent planes; µs)")
    geometry = conv_geometry(x, dense_w, [1, 1], [1, 1], [1, 1], 1)
    for name, x_ in (("channels_last", x), ("nchw", x.contiguous())):
        print(f"prescan {name}: block map {median_us(lambda: block_activity(x_)):.1f}, "
              f"block map + tile lists {median_us(lambda: prescan(x_, geometry)):.1f}, "
              f"conv3x3 compute {median_us(_stage2(x_, dense_w, geometry, DEFAULT_CONFIG)):.1f}")
    module = SparseConv2d(CHANNELS, CHANNELS, 3, padding=1, bias=False).cuda().half().requires_grad_(False)
    dense_us = host_us_per_call(lambda: F.conv2d(x, dense_w, None, 1, 1))
    triton_us = host_us_per_call(lambda: sparse_conv2d(x, dense_w, None, 1, 1, backend="triton"))
    print(f"host µs per call: F.conv2d {dense_us:.1f}, sparse_conv2d(triton) {triton_us:.1f}, "
          f"SparseConv2d(auto) {host_us_per_call(lambda: module(x)):.1f}")
    dense_x = spikes(x.shape, 0.5, 0.0, generator).half().to(memory_format=torch.channels_last)
    for taps, tile, block_k, warps in itertools.product((1, 4, 8), ((8, 8), (8, 16)), (16,), (4, 8)):
        config = replace(DEFAULT_CONFIG, tile_h=tile[0], tile_w=tile[1], block_k=block_k, taps_per_dot=taps,
                         num_warps=warps)
        geometry = ConvGeometry.of(x, dense_w, 1, 1, 1, 1, tile=tile)
        print(f"conv3x3 taps/dot={taps} tile={tile} block_k={block_k} warps={warps}: "
              f"90% silent planes {median_us(_stage2(x, dense_w, geometry, config)):.1f}, "
              f"dense {median_us(_stage2(dense_x, dense_w, geometry, config)):.1f}")
    geometry = conv_geometry(x, dense_w, [1, 1], [1, 1], [1, 1], 1)
    active = prescan(x, geometry)[0]
    grad_y = torch.randn_like(F.conv2d(x, dense_w, None, 1, 1))
    for rows, block_n, warps in ((128, 128, 4), (128, 128, 8), (256, 128, 8)):
        config = replace(DEFAULT_CONFIG, wgrad_rows=rows, wgrad_block_n=block_n, wgrad_num_warps=warps)
        us = median_us(lambda: sparse_conv_wgrad(x, grad_y, geometry, active, x.dtype, config))
        print(f"wgrad3x3 rows={rows} block_n={block_n} warps={warps}: {us:.1f}")


COLUMNS = [("zero blocks", "zero_blocks", "{:.3f}"), ("cuDNN fp16 CL", "cudnn_fp16_cl", "{:.1f}"),
           ("cuDNN fp32", "cudnn_fp32", "{:.1f}"), ("ours", "ours", "{:.1f}"),
           ("ours compute", "ours_compute", "{:.1f}"), ("dispatcher", "dispatcher", "{:.1f}"),
           ("×ours", "speedup_ours", "{:.2f}"), ("×disp", "speedup_dispatcher", "{:.2f}"),
           ("wgrad cuDNN", "wgrad_cudnn", "{:.1f}"), ("wgrad ours", "wgrad_ours", "{:.1f}"),
           ("rel err", "rel_error", "{:.1e}")]


def table(rows: list[tuple[str, str, dict[str, float]]]) -> str:
    header = "| layer | input | " + " | ".join(name for name, _, _ in COLUMNS) + " |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 2)]
    for layer, inputs, row in rows:
        cells = [fmt.format(row[key]) for _, key, fmt in COLUMNS]
        lines.append(f"| {layer} | {inputs} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="time tile sizes (instead of the table)")
    parser.add_argument("--train-seconds", type=float, default=45.0)
    parser.add_argument("--markdown", help="also write the table here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("kernels.sparse_conv.calibration").setLevel(logging.WARNING)
    generator = torch.Generator("cuda").manual_seed(0)
    header = (f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
              f"cuDNN {torch.backends.cudnn.version()} | {datetime.date.today()} | "
              f"copy {copy_bandwidth_gbs():.0f} GB/s | `python {' '.join(sys.argv)}`")
    print(header, flush=True)
    if args.sweep:
        sweep(generator)
        return
    rows = []
    for layer, (inputs, (density, silence)) in itertools.product(SYNTHETIC_LAYERS, SYNTHETIC_INPUTS.items()):
        x = spikes((BATCH, CHANNELS, SIZE, SIZE), density, silence, generator).half()
        rows.append((f"{layer.name} [{BATCH},{CHANNELS},{SIZE},{SIZE}]", inputs,
                     measure(layer, x.to(memory_format=torch.channels_last), generator)))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    reset_path_counts()
    for layer, x in trained_layer_inputs(args.train_seconds):
        shape = ",".join(map(str, x.shape))
        name = f"{layer.name} k{layer.kernel} s{layer.stride} d{layer.dilation} g{layer.groups} [{shape}]"
        rows.append((name, "real (trained ST-BIF)", measure(layer, x, generator)))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    result = header + "\n\n" + table(rows)
    print("\n" + result)
    if args.markdown:
        with open(args.markdown, "w") as file:
            file.write(result + "\n")


if __name__ == "__main__":
    main()
