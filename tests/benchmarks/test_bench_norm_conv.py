"""benchmarks/bench_norm_conv.py: each way it times gives the same output and gradients as its group's first."""
from __future__ import annotations

import pytest
import torch

from benchmarks import bench_norm_conv as bench


@pytest.mark.parametrize("group", ["batch norm", "depthwise 3x3", "depthwise 5x5"])
def test_every_way_gives_the_same_output_and_input_gradient(group):
    torch.manual_seed(0)
    x = torch.randn(6, 16, 7, 5) * 2 + 0.5
    upstream = torch.randn_like(x)
    ways = (bench.batch_norm_variants(16, x.device) if group == "batch norm"
            else bench.conv_variants(16, int(group[-1]), x.device))
    results = []
    for label, way in ways.items():
        layout = torch.channels_last if "channels_last" in label else torch.contiguous_format
        xin = x.to(memory_format=layout).requires_grad_()
        out = way(xin)
        learned = [way.weight] if hasattr(way, "weight") else []  # the convs' weight gradient too
        results.append((out.detach(), *torch.autograd.grad(out, [xin, *learned], upstream.to(memory_format=layout))))
    assert len(results) >= 2 and (results[0][0] != 0).any()
    assert len(results[0]) == (2 if group == "batch norm" else 3)
    for got in results[1:]:
        for value, want in zip(got, results[0]):
            torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-5)
