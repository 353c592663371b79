"""ST-BIF neuron → conv3x3 and depthwise 3x3, on one GPU: the sparse conv with the block map the
neuron kernel writes (no prescan) against cuDNN, and the whole neuron + conv pair.

The neuron makes the spikes: a drive [T=4, B=64, 128, 32, 32] (fp16) whose silent planes (a
fraction of the (sample, channel) pairs, for all steps) are 0, so those neurons never fire;
the others get N(0, 2²) and fire at most steps. The conv is 3x3, 128 -> 128, padding 1 (dense,
and depthwise: groups=128), on the spikes flattened to [256, 128, 32, 32].

Columns, µs, median of triton.testing.do_bench (L2 cleared before every call). "graph" is GPU
time: the calls captured in one CUDA graph and replayed, so host work is not counted.
  neuron / neuron+map   st_bif_multistep alone, and st_bif_multistep_with_block_map (its
                        kernel also writes the map; the map's memset included), graph
  neuron CL             st_bif_multistep over the drive laid out [T, B, H, W, C], so that its
                        spikes come out channels_last (cuDNN CL's input), graph
  cuDNN CL              F.conv2d fp16 channels_last on the spikes (laid out beforehand), graph
  ours+map              sparse_conv2d(backend="triton", block_map=map): stage 2 only (dense: packing
                        + forward; depthwise: the forward on the map's plane flags), graph
  ours prescan          sparse_conv2d(backend="triton") without the map (its own prescan), graph
  pair cuDNN CL         one graph: the neuron writing channels_last spikes (the same elementwise
                        kernel over a [T, B, H, W, C] drive), then cuDNN CL on them
  pair ours             one graph: the neuron writing spikes and the map, then ours+map
  conv ×                (pair cuDNN CL − neuron CL) / (pair ours − neuron): what each conv adds
                        to its pair's GPU time, the map's cost charged to ours
  pair ×                pair cuDNN CL / pair ours
  ours+map eager        ours+map called eagerly, host work included (host-bound on a slow CPU)
  auto graph / path     sparse_conv2d(backend="auto", block_map=map) after three eager calls in
                        `capture_warmup()` (calibration, density measurement), captured in a CUDA
                        graph: GPU time, and the paths of capture()'s eager call and the captured one
  cuDNN NCHW            F.conv2d fp16 on the NCHW spikes (what "auto" falls back to), graph
  ×auto graph           cuDNN CL / auto graph: against the best cuDNN set-up, not the fallback
  zero blocks           fraction of the spikes' 8x8 blocks that are all zero
  rel err               ours+map against an fp32 F.conv2d of the same spikes

Usage: PYTHONPATH=. python benchmarks/bench_st_bif_conv.py [--markdown FILE] [--pdl-ab] [--conv dw3x3 ...]
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from benchmarks.bench_sparse_conv import capture, copy_bandwidth_gbs, graph_us, median_us, relative_error  # noqa: E402
from kernels import dependent_launch  # noqa: E402
from kernels.sparse_conv import DensityTracker, capture_warmup, path_counts, reset_path_counts, sparse_conv2d  # noqa: E402
from kernels.st_bif import level_bounds, st_bif_multistep, st_bif_multistep_with_block_map  # noqa: E402

STEPS, BATCH, CHANNELS, SIZE = 4, 64, 128, 32
SILENT_PLANES = (0.9, 0.5, 0.0)
CONVS = {"conv3x3": 1, "dw3x3": CHANNELS}  # name: groups
POS_MAX, NEG_MIN = level_bounds(8, sym=True)

COLUMNS = [("zero blocks", "zero_blocks", "{:.3f}"), ("neuron", "neuron", "{:.1f}"),
           ("neuron+map", "neuron_map", "{:.1f}"), ("neuron CL", "neuron_cl", "{:.1f}"),
           ("cuDNN CL", "cudnn_cl", "{:.1f}"),
           ("ours+map", "ours_map", "{:.1f}"), ("ours prescan", "ours_prescan", "{:.1f}"),
           ("pair cuDNN CL", "pair_cudnn", "{:.1f}"), ("pair ours", "pair_ours", "{:.1f}"),
           ("conv ×", "conv_speedup", "{:.2f}"), ("pair ×", "pair_speedup", "{:.2f}"),
           ("ours+map eager", "ours_map_eager", "{:.1f}"), ("cuDNN NCHW", "cudnn_nchw", "{:.1f}"),
           ("auto graph", "auto_graph", "{:.1f}"),
           ("×auto graph", "auto_graph_speedup", "{:.2f}"), ("path", "auto_graph_path", "{}"),
           ("rel err", "rel_error", "{:.1e}")]


def measure(silent: float, generator: torch.Generator, groups: int = 1) -> dict[str, float]:
    shape = (STEPS, BATCH, CHANNELS, SIZE, SIZE)
    drive = torch.randn(shape, generator=generator, device="cuda") * 2.0
    drive *= (torch.rand((1, BATCH, CHANNELS, 1, 1), generator=generator, device="cuda") >= silent)
    drive = drive.half()
    drive_hwc = drive.permute(0, 1, 3, 4, 2).contiguous()  # same neurons; the spikes come out channels_last
    fan_in = CHANNELS // groups * 9
    weight = torch.randn((CHANNELS, CHANNELS // groups, 3, 3), generator=generator, device="cuda") / fan_in**0.5
    weight = weight.half()
    weight_cl = weight.to(memory_format=torch.channels_last)
    with torch.no_grad():
        spikes_seq, block_map = st_bif_multistep_with_block_map(drive, 1.0, POS_MAX, NEG_MIN)
        x = spikes_seq.flatten(0, 1)
        x_cl = x.to(memory_format=torch.channels_last)
        def ours_map() -> torch.Tensor:
            return sparse_conv2d(x, weight, None, 1, 1, 1, groups, backend="triton", block_map=block_map)

        def pair_cudnn() -> torch.Tensor:
            spikes_cl = st_bif_multistep(drive_hwc, 1.0, POS_MAX, NEG_MIN).flatten(0, 1).permute(0, 3, 1, 2)
            return F.conv2d(spikes_cl, weight_cl, None, 1, 1, 1, groups)

        def pair_ours() -> torch.Tensor:
            spikes, spikes_map = st_bif_multistep_with_block_map(drive, 1.0, POS_MAX, NEG_MIN)
            return sparse_conv2d(spikes.flatten(0, 1), weight, None, 1, 1, 1, groups, backend="triton",
                                 block_map=spikes_map)

        reference = F.conv2d(x.float(), weight.float(), None, 1, 1, 1, groups)
        if relative_error(pair_cudnn(), reference) > 1e-2:
            raise RuntimeError("the channels_last pair computes a different conv: the benchmark is broken")
        row = {
            "zero_blocks": 1.0 - block_map.blocks.float().mean().item(),
            "neuron": graph_us(lambda: st_bif_multistep(drive, 1.0, POS_MAX, NEG_MIN)),
            "neuron_map": graph_us(lambda: st_bif_multistep_with_block_map(drive, 1.0, POS_MAX, NEG_MIN)),
            "neuron_cl": graph_us(lambda: st_bif_multistep(drive_hwc, 1.0, POS_MAX, NEG_MIN)),
            "cudnn_cl": graph_us(lambda: F.conv2d(x_cl, weight_cl, None, 1, 1, 1, groups)),
            "ours_map": graph_us(ours_map),
            "ours_prescan": graph_us(lambda: sparse_conv2d(x, weight, None, 1, 1, 1, groups, backend="triton")),
            "pair_cudnn": graph_us(pair_cudnn), "pair_ours": graph_us(pair_ours),
            "ours_map_eager": median_us(ours_map),
            "rel_error": max(relative_error(ours_map(), reference), relative_error(pair_ours(), reference)),
        }
        tracker = DensityTracker()

        def auto() -> torch.Tensor:
            return sparse_conv2d(x, weight, None, 1, 1, 1, groups, tracker=tracker, block_map=block_map)

        with capture_warmup():
            for _ in range(3):  # calibrates this call shape, measures the density
                auto()
        torch.cuda.synchronize()
        auto()  # reads the measurement back
        reset_path_counts()
        graph = capture(auto)  # its warm-up call is eager, the second one captured
        paths = [path for path in path_counts() if path not in ("probe", "sparse_wgrad")]
        row["auto_graph_path"] = "/".join(sorted(paths))
        row["auto_graph"] = median_us(graph.replay)
        row["auto_graph_speedup"] = row["cudnn_cl"] / row["auto_graph"]
        row["cudnn_nchw"] = graph_us(lambda: F.conv2d(x, weight, None, 1, 1, 1, groups))
    row["conv_speedup"] = (row["pair_cudnn"] - row["neuron_cl"]) / (row["pair_ours"] - row["neuron"])
    row["pair_speedup"] = row["pair_cudnn"] / row["pair_ours"]
    return row


def dependent_launch_ab(generator: torch.Generator, repeats: int = 3) -> list[str]:
    """Graph µs of the conv at 90% silent planes with dependent launches off and on, alternating."""
    drive = torch.randn((STEPS, BATCH, CHANNELS, SIZE, SIZE), generator=generator, device="cuda") * 2.0
    drive = (drive * (torch.rand((1, BATCH, CHANNELS, 1, 1), generator=generator, device="cuda") >= 0.9)).half()
    weight = (torch.randn((CHANNELS, CHANNELS, 3, 3), generator=generator, device="cuda") / 34).half()
    lines = ["", "Dependent launches (kernels/dependent_launch.py) off and on, 90% silent planes, graph µs:", "",
             "| PDL | ours+map | ours prescan | pair ours |", "|---|---|---|---|"]
    with torch.no_grad():
        spikes, block_map = st_bif_multistep_with_block_map(drive, 1.0, POS_MAX, NEG_MIN)
        x = spikes.flatten(0, 1)

        def pair_ours() -> torch.Tensor:
            out, out_map = st_bif_multistep_with_block_map(drive, 1.0, POS_MAX, NEG_MIN)
            return sparse_conv2d(out.flatten(0, 1), weight, None, 1, 1, backend="triton", block_map=out_map)

        previous = dependent_launch.set_enabled(True)
        try:
            for _ in range(repeats):
                for enabled in (False, True):
                    dependent_launch.set_enabled(enabled)
                    cells = [graph_us(lambda: sparse_conv2d(x, weight, None, 1, 1, backend="triton",
                                                            block_map=block_map)),
                             graph_us(lambda: sparse_conv2d(x, weight, None, 1, 1, backend="triton")),
                             graph_us(pair_ours)]
                    lines.append(f"| {'on' if enabled else 'off'} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
                    print(lines[-1], flush=True)
        finally:
            dependent_launch.set_enabled(previous)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", help="also write the table here")
    parser.add_argument("--pdl-ab", action="store_true", help="also time dependent launches off against on")
    parser.add_argument("--conv", choices=list(CONVS), action="append", help="only these convs (default: all)")
    args = parser.parse_args()
    header = (f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
              f"cuDNN {torch.backends.cudnn.version()} | {datetime.date.today()} | "
              f"copy {copy_bandwidth_gbs():.0f} GB/s | `python {' '.join(sys.argv)}`")
    lines = [header, "", "| conv | silent planes | " + " | ".join(name for name, _, _ in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    print("\n".join(lines), flush=True)
    generator = torch.Generator("cuda").manual_seed(0)
    for conv in args.conv or CONVS:
        groups = CONVS[conv]
        for silent in SILENT_PLANES:
            row = measure(silent, generator, groups)
            cells = " | ".join(fmt.format(row[key]) for _, key, fmt in COLUMNS)
            lines.append(f"| {conv} | {silent:.0%} | {cells} |")
            print(lines[-1], flush=True)
    if args.pdl_ab:
        lines += dependent_launch_ab(generator)
    if args.markdown:
        with open(args.markdown, "w") as file:
            file.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
