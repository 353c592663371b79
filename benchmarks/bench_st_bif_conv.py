"""ST-BIF neuron → conv3x3, on one GPU: the sparse conv with the block map the neuron kernel
writes (no prescan) against cuDNN, and the whole neuron + conv pair.

The neuron makes the spikes: a drive [T=4, B=64, 128, 32, 32] (fp16) whose silent planes (a
fraction of the (sample, channel) pairs, for all steps) are 0, so those neurons never fire;
the others get N(0, 2²) and fire at most steps. The conv is 3x3, 128 -> 128, padding 1, on the
spikes flattened to [256, 128, 32, 32] (issue 4's shape).

Columns, µs, median of triton.testing.do_bench (L2 cleared before every call):
  neuron / neuron+map   st_bif_multistep alone, and st_bif_multistep_with_block_map (its
                        kernel also writes the map; the map's memset included)
  cuDNN CL / cuDNN      F.conv2d fp16 on the spikes in channels_last (converted beforehand, not
                        timed) / as the neuron writes them (NCHW)
  ours+map              sparse_conv2d(backend="triton", block_map=map): packing + forward, host
                        work included (eager)
  ours+map graph        the same replayed as a CUDA graph (GPU time only)
  ours prescan          sparse_conv2d(backend="triton") without the map (its own prescan)
  conv ×                best cuDNN / (ours+map + (neuron+map − neuron)): the conv's speedup
                        with what writing the map costs the neuron charged to it
  pair ×                (neuron + cuDNN NCHW) / (neuron+map + ours+map), both eager: what a
                        user of the two layers gets (cuDNN CL would add a layout conversion)
  zero blocks           fraction of the spikes' 8x8 blocks that are all zero
  rel err               ours+map against an fp32 F.conv2d of the same spikes

Usage: PYTHONPATH=. python benchmarks/bench_st_bif_conv.py [--markdown FILE]
"""
from __future__ import annotations

import argparse
import datetime
import sys

import torch
import torch.nn.functional as F
import triton

from benchmarks.bench_sparse_conv import copy_bandwidth_gbs, graph_us, median_us, relative_error
from kernels.sparse_conv import sparse_conv2d
from kernels.st_bif import level_bounds, st_bif_multistep, st_bif_multistep_with_block_map

STEPS, BATCH, CHANNELS, SIZE = 4, 64, 128, 32
SILENT_PLANES = (0.9, 0.5, 0.0)
POS_MAX, NEG_MIN = level_bounds(8, sym=True)

COLUMNS = [("zero blocks", "zero_blocks", "{:.3f}"), ("neuron", "neuron", "{:.1f}"),
           ("neuron+map", "neuron_map", "{:.1f}"), ("cuDNN CL", "cudnn_cl", "{:.1f}"), ("cuDNN", "cudnn", "{:.1f}"),
           ("ours+map", "ours_map", "{:.1f}"), ("ours+map graph", "ours_map_graph", "{:.1f}"),
           ("ours prescan", "ours_prescan", "{:.1f}"), ("conv ×", "conv_speedup", "{:.2f}"),
           ("pair ×", "pair_speedup", "{:.2f}"), ("rel err", "rel_error", "{:.1e}")]


def measure(silent: float, generator: torch.Generator) -> dict[str, float]:
    shape = (STEPS, BATCH, CHANNELS, SIZE, SIZE)
    drive = torch.randn(shape, generator=generator, device="cuda") * 2.0
    drive *= (torch.rand((1, BATCH, CHANNELS, 1, 1), generator=generator, device="cuda") >= silent)
    drive = drive.half()
    weight = (torch.randn((CHANNELS, CHANNELS, 3, 3), generator=generator, device="cuda") / 34).half()
    weight_cl = weight.to(memory_format=torch.channels_last)
    with torch.no_grad():
        spikes_seq, block_map = st_bif_multistep_with_block_map(drive, 1.0, POS_MAX, NEG_MIN)
        x = spikes_seq.flatten(0, 1)
        x_cl = x.to(memory_format=torch.channels_last)
        neuron = lambda: st_bif_multistep(drive, 1.0, POS_MAX, NEG_MIN)
        neuron_map = lambda: st_bif_multistep_with_block_map(drive, 1.0, POS_MAX, NEG_MIN)
        ours_map = lambda: sparse_conv2d(x, weight, None, 1, 1, backend="triton", block_map=block_map)
        row = {
            "zero_blocks": 1.0 - block_map.float().mean().item(),
            "neuron": median_us(neuron), "neuron_map": median_us(neuron_map),
            "cudnn_cl": median_us(lambda: F.conv2d(x_cl, weight_cl, None, 1, 1)),
            "cudnn": median_us(lambda: F.conv2d(x, weight, None, 1, 1)),
            "ours_map": median_us(ours_map), "ours_map_graph": graph_us(ours_map),
            "ours_prescan": median_us(lambda: sparse_conv2d(x, weight, None, 1, 1, backend="triton")),
            "rel_error": relative_error(ours_map(), F.conv2d(x.float(), weight.float(), None, 1, 1)),
        }
    map_cost = max(row["neuron_map"] - row["neuron"], 0.0)
    row["conv_speedup"] = min(row["cudnn_cl"], row["cudnn"]) / (row["ours_map"] + map_cost)
    row["pair_speedup"] = (row["neuron"] + row["cudnn"]) / (row["neuron_map"] + row["ours_map"])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", help="also write the table here")
    args = parser.parse_args()
    header = (f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
              f"cuDNN {torch.backends.cudnn.version()} | {datetime.date.today()} | "
              f"copy {copy_bandwidth_gbs():.0f} GB/s | `python {' '.join(sys.argv)}`")
    lines = [header, "", "| silent planes | " + " | ".join(name for name, _, _ in COLUMNS) + " |",
             "|---|" + "---|" * len(COLUMNS)]
    print("\n".join(lines), flush=True)
    generator = torch.Generator("cuda").manual_seed(0)
    for silent in SILENT_PLANES:
        row = measure(silent, generator)
        lines.append(f"| {silent:.0%} | " + " | ".join(fmt.format(row[key]) for _, key, fmt in COLUMNS) + " |")
        print(lines[-1], flush=True)
    if args.markdown:
        with open(args.markdown, "w") as file:
            file.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
