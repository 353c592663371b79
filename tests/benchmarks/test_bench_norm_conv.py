"""benchmarks/bench_norm_conv.py: each way it times gives the same output and gradients as its group's first."""
from __future__ import annotations

import pytest
import torch

from benchmarks import bench_norm_conv as bench


def variants(group: str, device: torch.device) -> dict:
    if group == "batch norm":
        return bench.batch_norm_variants(16, device)
    if group.startswith("depthwise"):
        return bench.conv_variants(16, int(group[-1]), device)
    if group == "pointwise":
        return bench.pointwise_variants(16, device)
    average, maximum = bench.pool_variants(16, 7, 5, int(group[-1]), device)
    return average if group.startswith("avg") else maximum


@pytest.mark.parametrize("group", ["batch norm", "depthwise 3x3", "depthwise 5x5", "pointwise", "avg pool /1",
                                   "avg pool /2", "max pool /1", "max pool /2"])
def test_every_way_gives_the_same_output_and_input_gradient(group):
    torch.manual_seed(0)
    x = torch.randn(6, 16, 7, 5) * 2 + 0.5
    ways = variants(group, x.device)
    upstream = torch.randn_like(next(iter(ways.values()))(x))
    results = []
    for label, way in ways.items():
        layout = torch.channels_last if "channels_last" in label else torch.contiguous_format
        xin = x.to(memory_format=layout).requires_grad_()
        out = way(xin)
        learned = [way.weight] if hasattr(way, "weight") else []  # the convs' weight gradient too
        results.append((out.detach(), *torch.autograd.grad(out, [xin, *learned], upstream.to(memory_format=layout))))
    assert len(results) >= 2 and (results[0][0] != 0).any()
    assert len(results[0]) == (3 if group.startswith(("depthwise", "pointwise")) else 2)
    tolerance = 1e-4 if group == "pointwise" else 1e-5  # a 1x1 weight gradient sums N*H*W products in any order
    for got in results[1:]:
        for value, want in zip(got, results[0]):
            torch.testing.assert_close(value, want, rtol=tolerance, atol=tolerance)


def test_convs_only_at_given_shapes_in_half_precision(capsys):
    bench.main(["--tiny", "--convs-only", "--dtype", "bf16", "--shapes", "3x4x6x6,2x8x4x4"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 3x4x6x6") or
            line.startswith("| 2x8x4x4")]
    assert len(rows) == 8  # 2 shapes x 2 kernels x 2 layouts
    assert all("depthwise" in row for row in rows)


@pytest.mark.parametrize("args", [["--shapes", "3x4x6"], ["--shapes", "3x0x6x6"], ["--dtype", "fp16"]])
def test_bad_flags_are_refused_in_one_line(args):
    with pytest.raises(SystemExit, match="bench_norm_conv: "):
        bench.main(["--tiny", *args] + (["--convs-only"] if "--shapes" in args else []))
