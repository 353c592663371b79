"""Spike-sparse convolution: Triton kernels (under TRITON_INTERPRET=1 on CPU), the torch reference
and the dispatcher against F.conv2d, forward and both gradients."""
import copy
import dataclasses
import itertools
import json
import types

import pytest
import torch
import torch.nn.functional as F

from kernels.block_map import BlockMap
from kernels.sparse_conv import (
    PATH_COUNTS,
    SparseConv2d,
    capture_warmup,
    path_counts,
    reset_path_counts,
    set_backend,
    sparse_conv2d,
)
from kernels.sparse_conv import calibration as sparse_calibration
from kernels.sparse_conv import density as sparse_density
from kernels.sparse_conv import dispatch as sparse_dispatch
from kernels.sparse_conv import packed as sparse_packed
from kernels.sparse_conv import prescan as sparse_prescan
from kernels.sparse_conv import triton as sparse_triton
from kernels.sparse_conv.calibration import Crossover, CrossoverCache, _crossing, crossover_from_timings
from kernels.sparse_conv.density import DensityTracker
from kernels.sparse_conv.dispatch import EAGER_SAMPLE_EVERY, channels_innermost
from kernels.sparse_conv.function import conv_geometry
from kernels.sparse_conv.reference import block_activity, sparse_conv2d_reference, tile_activity

# Relative to the largest reference magnitude. fp32 is exact on the interpreter (TF32 on GPUs
# only); half types round inputs once and the output once, accumulating in fp32.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def spikes(shape, density: float, generator: torch.Generator, plane_silence: float = 0.0) -> torch.Tensor:
    """ST-BIF-like output: values in {-θ, 0, +θ}, non-zero with probability `density`, and a
    fraction `plane_silence` of the (sample, channel) planes silent."""
    theta = 0.5 + torch.rand((), generator=generator)
    values = torch.where(torch.rand(shape, generator=generator) < 0.5, -theta, theta)
    x = values * (torch.rand(shape, generator=generator) < density)
    planes = torch.rand(shape[:2], generator=generator) >= plane_silence
    return x * planes[:, :, None, None]


def layout(x: torch.Tensor, kind: str) -> torch.Tensor:
    """x as "nchw" (contiguous), "channels_last", or a "strided" planar view: each row padded by
    3 NaN elements in memory (x's values, other strides; a read past a row would show)."""
    if kind == "channels_last":
        return x.to(memory_format=torch.channels_last)
    if kind == "nchw":
        return x.contiguous()
    storage = torch.full((*x.shape[:3], x.shape[3] + 3), float("nan"), dtype=x.dtype)
    view = storage[..., 1 : x.shape[3] + 1]
    view.copy_(x)
    return view


def assert_matches_conv2d(x, weight, bias, stride, padding, dilation, groups, backend="triton"):
    """Output and all three gradients of `sparse_conv2d` vs F.conv2d in fp32 on the same values;
    the call took the backend's own path (planar input) or F.conv2d (channels_last)."""
    dtype = x.dtype
    x, weight, bias = (t.detach().requires_grad_() for t in (x, weight, bias))
    reset_path_counts()
    y = sparse_conv2d(x, weight, bias, stride, padding, dilation, groups, backend=backend)
    path = "dense:unsupported" if channels_innermost(x) else {"triton": "sparse", "reference": "reference"}[backend]
    assert path_counts().get(path) == 1, path_counts()
    generator = torch.Generator().manual_seed(7)
    grad_y = torch.randn(y.shape, generator=generator).to(dtype)
    grads = torch.autograd.grad(y, (x, weight, bias), grad_y)
    ref_inputs = [t.detach().float().requires_grad_() for t in (x, weight, bias)]
    ref = F.conv2d(*ref_inputs, stride, padding, dilation, groups)
    ref_grads = torch.autograd.grad(ref, ref_inputs, grad_y.float())
    assert y.dtype == dtype and y.shape == ref.shape
    expected_format = torch.channels_last if (x.is_contiguous(memory_format=torch.channels_last)
                                              and not x.is_contiguous()) else torch.contiguous_format
    assert y.is_contiguous(memory_format=expected_format)
    for name, got, want in zip(("y", "grad_x", "grad_w", "grad_b"), (y, *grads), (ref, *ref_grads)):
        scale = want.abs().max().clamp_min(1.0)
        error = (got.float() - want).abs().max() / scale
        assert error <= TOLERANCE[dtype], f"{name}: relative error {error:.2e}"


def conv_case(kind: str, kernel: int, memory: str = "nchw", dtype=torch.float32, seed: int = 0,
              density: float = 0.3, plane_silence: float = 0.5, size=(9, 11)):
    generator = torch.Generator().manual_seed(seed)
    c_in = 6
    c_out, groups = (c_in, c_in) if kind == "depthwise" else (5, 1)
    x = spikes((2, c_in, *size), density, generator, plane_silence)
    weight = torch.randn((c_out, c_in // groups, kernel, kernel), generator=generator)
    bias = torch.randn(c_out, generator=generator)
    return layout(x.to(dtype), memory), weight.to(dtype), bias.to(dtype), groups


# Every supported (kind, kernel, stride, dilation); padding cycles through none, "same" and
# more, the planar layout alternates (each kind, kernel and stride sees both).
SUPPORTED = [("dense", k, s, d) for k, s, d in itertools.product((1, 3, 5), (1, 2), (1, 2))] + \
            [("depthwise", k, s, d) for k, s, d in itertools.product((3, 5), (1, 2), (1, 2))]


@pytest.mark.parametrize("kind,kernel,stride,dilation", SUPPORTED)
def test_every_supported_config_matches_conv2d(kind, kernel, stride, dilation):
    case_index = SUPPORTED.index((kind, kernel, stride, dilation))
    padding = (0, kernel // 2 * dilation, kernel // 2 * dilation + 1)[case_index % 3]
    x, weight, bias, groups = conv_case(kind, kernel, ("nchw", "strided")[case_index % 2], seed=case_index)
    assert_matches_conv2d(x, weight, bias, stride, padding, dilation, groups)


@pytest.mark.slow
@pytest.mark.parametrize("memory", ["nchw", "strided"])
@pytest.mark.parametrize("padding", [0, 1, 2, 3])
@pytest.mark.parametrize("kind,kernel,stride,dilation", SUPPORTED)
def test_every_config_layout_and_padding(kind, kernel, stride, dilation, padding, memory):
    x, weight, bias, groups = conv_case(kind, kernel, memory, seed=padding, size=(13, 9))  # 9: k5 d2 fits unpadded
    assert_matches_conv2d(x, weight, bias, stride, padding, dilation, groups)


INPUTS = {
    "zeros": dict(density=0.0, plane_silence=0.0),
    "density_0.01": dict(density=0.01, plane_silence=0.0),
    "density_0.1": dict(density=0.1, plane_silence=0.0),
    "density_1": dict(density=1.0, plane_silence=0.0),
    "silent_planes_90%": dict(density=0.5, plane_silence=0.9),
}


@pytest.mark.parametrize("kind", ["dense", "depthwise"])
@pytest.mark.parametrize("inputs", [pytest.param(name, marks=[pytest.mark.slow] if name in ("density_0.01", "density_1")
                                                 else []) for name in [*INPUTS, "real_values"]])  # CI: 4 of 6
def test_sparsity_never_changes_the_result(kind, inputs):
    x, weight, bias, groups = conv_case(kind, 3, seed=3, size=(17, 10),
                                        **INPUTS.get(inputs, {}))
    if inputs == "real_values":  # not spikes: any values, a few exact zeros
        x = torch.randn(x.shape, generator=torch.Generator().manual_seed(4)).relu()
    assert_matches_conv2d(x, weight, bias, 1, 1, 1, groups)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("kind", ["dense", "depthwise"])
def test_half_precision(kind, dtype):
    x, weight, bias, groups = conv_case(kind, 3, "strided", dtype=dtype, seed=5)
    assert_matches_conv2d(x, weight, bias, 2, 1, 1, groups)


# ragged: 15 rows keep 2-row tiles ragged too, with few tiles (the interpreter runs programs one by one)
# Cases of many small programs take 20-60 s in the interpreter: slow (out of CI); each path keeps a CI case.
@pytest.mark.parametrize("pixels,block_c,unroll_taps,size", [
    pytest.param(pixels, block_c, unroll_taps, size, id=f"{pixels}-{block_c}-{unroll_taps}-{name}",
                 marks=[pytest.mark.slow] if pixels == 16 or (pixels == 64 and (name == "ragged" or not unroll_taps))
                 else [])
    for pixels, block_c, unroll_taps in [(16, 4, 100), (64, 2, 100), (1024, 4, 100),
                                         (64, 2, 0), (1024, 4, 0)]  # 0: channel loops not unrolled
    for name, size in [("ragged", (15, 19)), ("even", (16, 16))]  # even: unmasked planar stores
])
def test_depthwise_tiles_and_silent_channels_within_a_program(pixels, block_c, unroll_taps, size, monkeypatch):
    """Depthwise programs of several tile sizes whose channels are partly silent, per plane and per
    tile (a program skips each silent channel's loads), against F.conv2d. Programs unroll their
    channel loop for short bodies; unroll_taps=0 runs it as a loop."""
    from dataclasses import replace
    monkeypatch.setattr(sparse_triton, "DEPTHWISE_UNROLL_TAPS", unroll_taps)
    generator = torch.Generator().manual_seed(pixels + block_c)
    x = torch.randn((3, 8, *size), generator=generator)
    x *= (torch.rand((3, 8, 1, 1), generator=generator) > 0.5)  # silent planes
    x[:, 1, :10] = 0.0  # a channel silent in the top tiles only
    weight = torch.randn((8, 1, 3, 3), generator=generator)
    bias = torch.randn(8, generator=generator)
    config = replace(sparse_triton.DEFAULT_CONFIG, depthwise_pixels=pixels, depthwise_block_c=block_c)
    geometry = conv_geometry(x, weight, [1, 1], [2, 2], [2, 2], 8)
    tiled, active = sparse_triton.depthwise_activity(x, sparse_prescan.block_activity(x), geometry, config)
    assert tiled.rows.tile * tiled.cols.tile == min(pixels, 32 * 32) or tiled.tiles == 1
    assert tiled.rows.out_size % tiled.rows.tile == 0 and tiled.cols.out_size % tiled.cols.tile == 0 or size != (16, 16)
    got = sparse_triton.sparse_depthwise_fwd(x, weight, bias, tiled, active, config)
    torch.testing.assert_close(got, F.conv2d(x, weight, bias, 1, 2, 2, 8), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size,block_c", [(32, 1), (14, 4), (7, 16)])
def test_depthwise_programs_hold_about_1024_outputs(size, block_c):
    x = torch.zeros((2, 64, size, size))
    geometry = conv_geometry(x, torch.zeros((64, 1, 3, 3)), [1, 1], [1, 1], [1, 1], 64)
    tiled = sparse_triton.depthwise_geometry(geometry)
    assert sparse_triton._depthwise_block_c(x, tiled, sparse_triton.DEFAULT_CONFIG) == block_c


@pytest.mark.parametrize("groups", [1, 6], ids=["dense", "depthwise"])
def test_flattened_multistep_input_and_strided_view(groups):
    """[T, B, C, H, W] flattened to [T*B, ...], then a non-contiguous slice (FactorizedReduce; for
    depthwise, planes whose strides the planar kernel must read at run time)."""
    generator = torch.Generator().manual_seed(11)
    x = spikes((6, 6, 10, 10), 0.2, generator).view(3, 2, 6, 10, 10).flatten(0, 1)[:, :, 1:, 1:]
    kernel = 1 if groups == 1 else 3
    weight = torch.randn((6 if groups > 1 else 4, 6 // groups, kernel, kernel), generator=generator)
    bias = torch.randn(weight.shape[0], generator=generator)
    assert_matches_conv2d(x, weight, bias, 2, kernel // 2, 1, groups)


def test_non_finite_inputs_propagate_like_conv2d():
    x, weight, bias, _ = conv_case("dense", 3, plane_silence=0.0, density=0.0)
    x[1, 2, 4, 4] = float("nan")
    y = sparse_conv2d(x, weight, bias, 1, 1, backend="triton")
    assert torch.equal(y.isnan(), F.conv2d(x, weight, bias, 1, 1).isnan())


@pytest.mark.slow  # 13-27 s each in the interpreter; the block-map and sparsity tests run the prescan in CI
@pytest.mark.parametrize("memory", ["nchw", "strided", "channels_last"])
def test_prescan_matches_reference(memory):
    generator = torch.Generator().manual_seed(1)
    x = layout(spikes((2, 7, 19, 13), 0.01, generator, plane_silence=0.5), memory)
    weight = torch.zeros(3, 7, 3, 3)
    blocks = sparse_prescan.block_activity(x)
    assert torch.equal(blocks.bool(), block_activity(x).permute(0, 2, 3, 1))
    assert 0 < blocks.float().mean() < 1  # the case exercises both kinds of block
    for stride, padding, dilation in [(1, 1, 1), (2, 2, 2), (1, 0, 1)]:
        geometry = conv_geometry(x, weight, [stride] * 2, [padding] * 2, [dilation] * 2, 1)
        for tile in [(8, 8), (2, 16)]:  # the wgrad's tiles, and a forward-like row band
            active, index, count = sparse_prescan.tile_activity(blocks, geometry.retiled(tile))
            expected = tile_activity(block_activity(x), geometry.retiled(tile))
            assert torch.equal(active.bool(), expected)
            assert_lists(index, count, expected)
            for chunk in (4, 32):  # the flags-only kernel, channels split over programs
                assert torch.equal(sparse_prescan.window_activity(blocks, geometry.retiled(tile), chunk), active)


def assert_lists(index: torch.Tensor, count: torch.Tensor, expected: torch.Tensor) -> None:
    """index[..., :count] lists the True entries of `expected` along its last axis, in order."""
    assert torch.equal(count, expected.sum(dim=-1).int())
    for row in range(count.numel()):
        listed = index.flatten(0, -2)[row, : count.flatten()[row]]
        assert torch.equal(listed.long(), expected.flatten(0, -2)[row].nonzero().flatten())


FORWARD_PATHS = {  # (layout, KernelConfig.packed): the dense forward's variants
    "nchw (lists in the kernel)": ("nchw", False),
    "strided view (lists in the kernel)": ("strided", False),
    "packed nchw": ("nchw", True),
    "packed strided view": ("strided", True),
}


CI_FORWARD_CASES = {("nchw (lists in the kernel)", 2, 2), ("strided view (lists in the kernel)", 2, 2),
                    ("packed nchw", 1, 2)}  # one case per path in CI; the others take 15-25 s each


@pytest.mark.parametrize("path,stride,dilation", [  # the packed forward is stride 1 only
    pytest.param(path, stride, dilation,
                 marks=[] if (path, stride, dilation) in CI_FORWARD_CASES else [pytest.mark.slow])
    for path in FORWARD_PATHS for stride, dilation in [(1, 1), (2, 2), (1, 2)]
    if stride == 1 or not FORWARD_PATHS[path][1]
])
def test_forward_loops_over_channel_chunks_output_blocks_and_tiles(path, stride, dilation):
    """Small tiles so that one case has several K chunks (48 channels, 16 per dot), two output
    channel blocks (the second partial) and several tiles per row (the last partial)."""
    memory, packed = FORWARD_PATHS[path]
    config = sparse_triton.KernelConfig(forward_pixels=16, forward_block_k=16, forward_block_n=16, packed=packed,
                                        pack_active_pixels=32)
    generator = torch.Generator().manual_seed(8)
    x = layout(spikes((2, 48, 2, 37), 0.3, generator, plane_silence=0.2), memory)  # 2 rows: half the programs of 4
    weight, bias = torch.randn((20, 48, 3, 3), generator=generator), torch.randn(20, generator=generator)
    geometry = conv_geometry(x, weight, [stride] * 2, [dilation] * 2, [dilation] * 2, 1)
    lists = sparse_triton.forward_lists(x, sparse_prescan.block_activity(x), geometry, config)
    counts = sparse_triton.forward_counts(x, lists)
    assert lists.packed == packed
    assert counts.shape == ((2,) if packed else (2, lists.geometry.tiles))
    assert counts.max() > 2 * config.forward_block_k
    assert lists.geometry.cols.tiles > 1 and lists.geometry.cols.out_size % lists.geometry.cols.tile != 0
    y = sparse_triton.sparse_conv_fwd(x, weight, bias, lists, config)
    expected = F.conv2d(x, weight, bias, stride, dilation, dilation)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kernel,dilation,padding", [(1, 1, 0), (3, 2, 1), (5, 1, 3)])
@pytest.mark.parametrize("memory", ["nchw", "strided"])
def test_pointer_forward_at_stride_1(kernel, dilation, padding, memory):
    """The forward that reads x in place, forced at stride 1 (where the packed forward is the default)."""
    config = sparse_triton.KernelConfig(packed=False)
    x, weight, bias, _ = conv_case("dense", kernel, memory, seed=kernel + padding, size=(12, 9))
    geometry = conv_geometry(x, weight, [1, 1], [padding] * 2, [dilation] * 2, 1)
    lists = sparse_triton.forward_lists(x, sparse_prescan.block_activity(x), geometry, config)
    assert not lists.packed
    y = sparse_triton.sparse_conv_fwd(x, weight, bias, lists, config)
    torch.testing.assert_close(y, F.conv2d(x, weight, bias, 1, padding, dilation), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("memory", ["nchw", "strided"])  # the packing's planar and strided pixel loads
def test_packing_lists_each_samples_active_channels_in_order(memory, dtype):
    """Packed [N, C/16, H, W, 16]: slot s of sample n holds its s-th active channel; the lanes of
    the last chunk past the count are zeros (the forward reads whole chunks). The same launch
    copies a (non-contiguous) weight to the [KH, KW, C_in, C_out] layout. Non-spike values, inf and
    NaN are copied as they are."""
    generator = torch.Generator().manual_seed(21)
    x = spikes((4, 37, 9, 10), 0.2, generator, plane_silence=0.6) * torch.randn((4, 37, 9, 10), generator=generator)
    x[1] = 0
    x[2, :, 3:5, 4:6] = 0.7  # every plane of sample 2 active
    x[3] = 0
    x[3, 20, 2, 3] = 1.5  # one active plane
    x[2, 36, 0, 0], x[0, 5, 8, 9] = float("nan"), float("-inf")
    x = layout(x.to(dtype), memory)
    weight = torch.randn((5, 37, 3, 1), generator=generator)[:, :, :, ::1].transpose(0, 1).contiguous().transpose(0, 1)
    packed, index, count, weight_rows = sparse_packed.pack_active_channels(
        x, sparse_prescan.block_activity(x), weight, 32, 4)
    assert torch.equal(weight_rows, weight) and weight_rows.permute(2, 3, 1, 0).is_contiguous()
    active = x.ne(0).flatten(2).any(dim=2)
    assert torch.equal(count, active.sum(dim=1).int())
    for n in range(x.shape[0]):
        channels = active[n].nonzero().flatten()
        assert torch.equal(index[n, : count[n]].long(), channels)
        slots = packed[n].permute(0, 3, 1, 2).flatten(0, 1)  # [chunks * 16, H, W]
        torch.testing.assert_close(slots[: len(channels)], x[n, channels], rtol=0, atol=0, equal_nan=True)
        assert not slots[len(channels): max(-(-len(channels) // 16), 1) * 16].any()  # sample 1: chunk 0 of zeros


def test_packing_copies_a_weight_larger_than_its_grid():
    """One packing program (one sample, one pixel block) copies a 21,312-element weight in steps."""
    generator = torch.Generator().manual_seed(22)
    x = spikes((1, 37, 4, 4), 0.5, generator)
    weight = torch.randn((64, 37, 3, 3), generator=generator)
    weight_rows = sparse_packed.pack_active_channels(x, sparse_prescan.block_activity(x), weight, 512, 4)[3]
    assert torch.equal(weight_rows, weight)


def test_packed_config_on_a_strided_call_is_a_clear_error():
    x, weight, _, _ = conv_case("dense", 3)
    geometry = conv_geometry(x, weight, [2, 2], [1, 1], [1, 1], 1)
    with pytest.raises(ValueError, match=r"packed=True\) needs stride 1"):
        sparse_triton.forward_lists(x, sparse_prescan.block_activity(x), geometry,
                                    sparse_triton.KernelConfig(packed=True))


def test_nchw_forward_compacts_hundreds_of_channels():
    """300 input channels (the in-register list pads them to 512), about 150 active per tile:
    ten K chunks, windows over several 8x8 blocks, and a silent sample."""
    generator = torch.Generator().manual_seed(13)
    x = spikes((3, 300, 10, 12), 0.2, generator, plane_silence=0.5)
    x[1] = 0
    weight, bias = torch.randn((7, 300, 3, 3), generator=generator), torch.randn(7, generator=generator)
    y = sparse_conv2d(x, weight, bias, 1, 1, backend="triton")
    torch.testing.assert_close(y, F.conv2d(x, weight, bias, 1, 1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("out_size,tile", [
    ((32, 32), (4, 32)), ((28, 28), (4, 32)), ((14, 14), (8, 16)), ((7, 7), (8, 8)), ((1, 1), (2, 8)),
    ((3, 300), (1, 128)),
])
def test_forward_tiles_are_row_bands_of_at_least_16_pixels(out_size, tile):
    assert sparse_triton.forward_tile(*out_size) == tile


@pytest.mark.parametrize("kind,kernel,stride,dilation", SUPPORTED[::3])
def test_reference_matches_conv2d(kind, kernel, stride, dilation):
    x, weight, bias, groups = conv_case(kind, kernel, seed=2)
    padding = kernel // 2 * dilation
    geometry = conv_geometry(x, weight, [stride] * 2, [padding] * 2, [dilation] * 2, groups)
    expected = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    torch.testing.assert_close(sparse_conv2d_reference(x, weight, bias, geometry), expected)
    assert_matches_conv2d(x, weight, bias, stride, padding, dilation, groups, backend="reference")


@pytest.mark.parametrize("memory", ["nchw", "strided"])
@pytest.mark.parametrize("kind", ["dense", "depthwise"])
def test_work_fractions_follow_the_activity(kind, memory):
    x, weight, _, groups = conv_case(kind, 3, memory, density=1.0, plane_silence=0.0)
    geometry = conv_geometry(x, weight, [1, 1], [1, 1], [1, 1], groups)

    def fractions(x_: torch.Tensor) -> list[float]:
        return sparse_density.work_fractions(x_, sparse_prescan.block_activity(x_), geometry).tolist()

    assert fractions(x) == [1.0, 1.0] and fractions(torch.zeros_like(x)) == [0.0, 0.0]


# ---------------------------------------------------------------------------- module and API
def test_from_dense_reproduces_the_conv_and_state_dict_round_trips():
    conv = torch.nn.Conv2d(6, 5, 3, stride=2, padding=1, dilation=1, bias=True)
    sparse = SparseConv2d.from_dense(conv, backend="triton")
    x = spikes((2, 6, 9, 9), 0.3, torch.Generator().manual_seed(0), plane_silence=0.5)
    torch.testing.assert_close(sparse(x), conv(x), rtol=1e-5, atol=1e-5)
    assert list(sparse.state_dict()) == list(conv.state_dict())
    back = torch.nn.Conv2d(6, 5, 3, stride=2, padding=1)
    back.load_state_dict(sparse.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), conv.state_dict().values()))
    assert isinstance(copy.deepcopy(sparse).density, DensityTracker)


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_follows_autocast_like_conv2d(backend):
    conv = torch.nn.Conv2d(6, 5, 3, padding=1)
    sparse = SparseConv2d.from_dense(conv, backend=backend)
    x = spikes((2, 6, 9, 9), 0.3, torch.Generator().manual_seed(0), plane_silence=0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, expected = sparse(x), conv(x)
    assert y.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(y, expected, rtol=2e-2, atol=2e-2)
    y.float().sum().backward()
    assert sparse.weight.grad.dtype == torch.float32 and sparse.weight.grad.abs().sum() > 0


def test_auto_on_cpu_is_exactly_conv2d():
    reset_path_counts()
    x, weight, bias, groups = conv_case("dense", 3)
    assert torch.equal(sparse_conv2d(x, weight, bias, 1, 1), F.conv2d(x, weight, bias, 1, 1))
    assert path_counts() == {"dense:cpu": 1}


def test_compiled_module_does_not_recompile_on_its_path_count():
    """Under torch.compile the path counter is not traced: a counted call would guard the graph on the count's
    value, and every call would compile again. The first call picks the module's route (one more frame)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    conv = SparseConv2d(3, 5, 3, padding=1, backend="torch")
    x = torch.randn(2, 3, 7, 9, generator=torch.Generator().manual_seed(1))
    frames = CompileCounter()
    compiled = torch.compile(conv, backend=frames)
    reset_path_counts()
    outputs = [compiled(x) for _ in range(5)]
    assert frames.frame_count == 2
    for y in outputs:
        torch.testing.assert_close(y, F.conv2d(x, conv.weight, conv.bias, 1, 1))
    eager_counts = path_counts()
    conv(x)
    assert sum(path_counts().values()) == sum(eager_counts.values()) + 1  # eager calls still count


@pytest.mark.parametrize("weight_shape,groups,stride", [
    ((6, 3, 3, 3), 2, 1),  # grouped, not depthwise
    ((5, 6, 7, 7), 1, 1),  # k = 7
    ((5, 6, 1, 7), 1, 1),  # 1x7
    ((5, 6, 3, 3), 1, 3),  # stride 3
    ((12, 1, 3, 3), 6, 1),  # depthwise with a channel multiplier
])
def test_unsupported_configs_fall_back_and_are_counted(weight_shape, groups, stride):
    reset_path_counts()
    x = spikes((2, 6, 9, 9), 0.3, torch.Generator().manual_seed(0))
    weight = torch.randn(weight_shape)
    y = sparse_conv2d(x, weight, None, stride, 1, 1, groups, backend="triton")
    torch.testing.assert_close(y, F.conv2d(x, weight, None, stride, 1, 1, groups))
    assert path_counts() == {"dense:unsupported": 1}


@pytest.mark.parametrize("backend", ["auto", "triton", "reference"])
@pytest.mark.parametrize("kind", ["dense", "depthwise"])
def test_channels_last_input_gives_conv2d_results_through_the_public_api(kind, backend, fake_gpu):
    """The sparse kernels read planar layouts: channels_last input runs F.conv2d (its output
    channels_last too), forward and gradients, through `sparse_conv2d` and `SparseConv2d`, eager
    or captured, on every backend ("auto" as on a GPU)."""
    x, weight, bias, groups = conv_case(kind, 3, "channels_last", seed=9)
    assert channels_innermost(x) and not x.is_contiguous()
    assert_matches_conv2d(x, weight, bias, 1, 1, 1, groups, backend=backend)
    conv = torch.nn.Conv2d(6, weight.shape[0], 3, padding=1, groups=groups)
    sparse = SparseConv2d.from_dense(conv, backend=backend)
    reset_path_counts()
    for capturing in (False, True, False):
        fake_gpu.capturing = capturing
        y = sparse(x)
        assert torch.equal(y, conv(x)) and y.is_contiguous(memory_format=torch.channels_last)
    assert path_counts() == {"dense:unsupported": 3} and fake_gpu.calibrations == []


@pytest.mark.parametrize("make_call,message", [
    (lambda x, w: sparse_conv2d(x, w.double()), "weight is torch.float64"),
    (lambda x, w: sparse_conv2d(x, w.to("meta")), "on meta"),
    (lambda x, w: sparse_conv2d(x, w, torch.zeros(5, dtype=torch.float16)), "bias is torch.float16"),
    (lambda x, w: sparse_conv2d(x[0], w), "4-D input"),
    (lambda x, w: sparse_conv2d(x, w[:, :3]), "expects 3"),
    (lambda x, w: sparse_conv2d(x, w, backend="cudnn"), "unknown backend"),
    (lambda x, w: sparse_conv2d(x, w, padding="same"), "padding must be numeric"),
    (lambda x, w: sparse_conv2d(x, w, stride=(1, 2, 3)), "stride must be"),
    (lambda x, w: SparseConv2d(6, 5, 3, padding_mode="reflect"), "padding_mode"),
])
def test_bad_input_raises_a_clear_value_error(make_call, message):
    x, weight = torch.randn(2, 6, 9, 9), torch.randn(5, 6, 3, 3)
    with pytest.raises(ValueError, match=message):
        make_call(x, weight)


# --------------------------------------------------------------------- dispatcher internals
def test_a_layer_with_a_fixed_cudnn_route_skips_the_dispatcher(monkeypatch):
    conv = SparseConv2d(6, 5, 3, padding=1)
    x = (torch.rand(3, 6, 9, 9) < 0.2).float()
    reset_path_counts()
    first = conv(x)
    calls = []
    monkeypatch.setattr("kernels.sparse_conv.module.sparse_conv2d", lambda *a, **k: calls.append(a))
    second = conv(x)
    assert calls == [] and path_counts() == {"dense:cpu": 2}
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    torch.testing.assert_close(second, F.conv2d(x, conv.weight, conv.bias, padding=1), rtol=0, atol=0)
    conv(x[:2])  # another call key goes through the dispatcher again
    assert len(calls) == 1


def test_a_layer_says_its_fixed_route_and_set_backend_reaches_every_layer():
    conv = SparseConv2d(6, 5, 3, padding=1)
    model = torch.nn.Sequential(conv, torch.nn.ReLU())
    x = (torch.rand(3, 6, 9, 9) < 0.2).float()
    assert conv.fixed_route is None  # no call yet: the dispatcher decides
    model(x)
    assert conv.fixed_route.path == "dense:cpu" and conv.fixed_route.key[0] == x.shape
    set_backend(model, "torch")
    assert conv.backend == "torch"
    model(x)
    assert conv.fixed_route.path == "dense:requested"
    with pytest.raises(ValueError, match="unknown backend"):
        set_backend(model, "cudnn")


def test_path_counts_are_read_and_zeroed_in_one_call():
    x, weight, bias, _ = conv_case("dense", 3)
    PATH_COUNTS.reset()
    sparse_conv2d(x, weight, bias, 1, 1)
    sparse_conv2d(x, weight, bias, 1, 1, backend="torch")
    assert PATH_COUNTS.snapshot_and_reset() == {"dense:cpu": 1, "dense:requested": 1}
    assert PATH_COUNTS.snapshot() == {} and path_counts() == {}


def test_the_crossover_cache_file_is_found_at_first_use(tmp_path, monkeypatch):
    state = sparse_dispatch.DispatchState()  # as at import: no cache yet
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert state.crossovers.path == tmp_path / "aso_se" / "sparse_conv_crossovers.json"
    assert state.crossovers is state.crossovers and not state.crossovers.path.exists()


def test_crossing_of_the_linear_time_model():
    assert _crossing(budget=50.0, at_zero=10.0, at_full=90.0) == pytest.approx(0.5)
    assert _crossing(budget=50.0, at_zero=60.0, at_full=90.0) < 0  # never wins
    assert _crossing(budget=50.0, at_zero=10.0, at_full=40.0) == 1.0  # always wins


GRAPH_MAP = ["graph_dense", "graph_map_zero", "graph_map_full"]
GRAPH_PRESCAN = ["graph_sparse_zero", "graph_sparse_full"]
WGRAD = ["dense_wgrad", "wgrad_zero", "wgrad_full"]


@pytest.mark.parametrize("graph_zeros, wgrad_zero, timed, graph_forward, graph_map_forward, wgrad", [
    # cannot beat 0.9 x cuDNN even on zeros given the block map: stop there (the weight gradient
    # runs only after a sparse forward)
    ((45.0, 50.0), 30.0, GRAPH_MAP[:2], -1.0, -1.0, -1.0),
    ((5.0, 10.0), 30.0, GRAPH_MAP + GRAPH_PRESCAN + WGRAD, 0.5, 40 / 70, 0.25),
    # wins only given the block map (its own prescan costs too much)
    ((18.0, 48.0), 30.0, GRAPH_MAP + GRAPH_PRESCAN[:1] + WGRAD, -1.0, 27 / 32, 0.25),
    # the weight gradient never wins
    ((5.0, 10.0), 95.0, GRAPH_MAP + GRAPH_PRESCAN + WGRAD[:2], 0.5, 40 / 70, -1.0),
])
def test_calibration_stops_timing_once_the_sparse_path_cannot_win(graph_zeros, wgrad_zero, timed, graph_forward,
                                                                  graph_map_forward, wgrad):
    map_zero, prescan_zero = graph_zeros
    times = {"graph_dense": 50.0, "graph_map_zero": map_zero, "graph_map_full": 50.0 if map_zero == 18.0 else 75.0,
             "graph_sparse_zero": prescan_zero, "graph_sparse_full": 80.0,
             "dense_wgrad": 100.0, "wgrad_zero": wgrad_zero, "wgrad_full": 270.0}
    asked = []

    def time_us(name):
        asked.append(name)
        return times[name]

    crossover = crossover_from_timings(time_us)
    assert asked == timed
    assert crossover.graph_forward == pytest.approx(graph_forward)
    assert crossover.graph_map_forward == pytest.approx(graph_map_forward)
    assert crossover.wgrad == pytest.approx(wgrad)
    assert crossover.graph_dense_us == 50.0 and crossover.graph_map_zero_us == map_zero
    assert crossover.wgrad_zero_us == (wgrad_zero if "wgrad_zero" in timed else None)


class _Event:
    """A CUDA event's query() on CPU: done or not."""

    def __init__(self, done: bool) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done


def test_density_tracker_samples_every_nth_call_and_reads_back_without_waiting():
    tracker = DensityTracker()
    assert [tracker.sample_due(4) for _ in range(8)] == [True, False, False, False] * 2
    assert [tracker.sample_due(4, now=True) for _ in range(2)] == [True, True]
    tracker.poll()  # nothing in flight: no measurement, no wait
    assert tracker.forward is None and tracker.wgrad is None
    tracker.record(torch.tensor([0.25, 0.5]))  # a CPU measurement is there at once
    assert (tracker.forward, tracker.wgrad) == (0.25, 0.5)
    event = _Event(done=False)
    tracker._pending = (torch.tensor([0.75, 1.0]), event)  # a GPU measurement in flight
    assert not tracker.sample_due(1, now=True)  # one at a time
    tracker.poll()
    assert tracker.forward == 0.25
    event.done = True
    tracker.poll()
    assert (tracker.forward, tracker.wgrad) == (0.75, 1.0) and tracker.sample_due(1)


def test_crossover_cache_reads_back_and_ignores_garbage(tmp_path, monkeypatch):
    path = tmp_path / "crossovers.json"
    crossover = Crossover(0.5, 0.6, 0.25, 50.0, 5.0, 75.0, 10.0, 80.0, 100.0, 30.0, 270.0)
    never = Crossover(-1.0, -1.0, -1.0, 50.0, 45.0)  # stopped early: the other timings are None
    older = {"forward": 0.2, "wgrad": -1.0, "dense_us": 100.0, "sparse_zero_us": 30.0}  # an older version's entry
    path.write_text(json.dumps({"key": dataclasses.asdict(crossover), "small": dataclasses.asdict(never),
                                "older": older}))
    cache = CrossoverCache(path)
    assert cache.get("key") == crossover and cache.get("small") == never and cache.get("older") is None
    for garbage in ("{not json", "[1, 2]"):
        path.write_text(garbage)
        assert CrossoverCache(path).get("key") is None
    monkeypatch.setattr(sparse_calibration, "measure_crossover", lambda *args: crossover)
    assert CrossoverCache(path).measure("new", torch.zeros(1), torch.zeros(1), [1, 1], [1, 1], [1, 1], 1) == crossover
    assert CrossoverCache(path).get("new") == crossover  # written back


# ----------------------------------------- "auto" on a GPU: the decisions, on CPU tensors
WINS = Crossover(graph_forward=0.6, graph_map_forward=0.8, wgrad=0.3, graph_dense_us=50.0, graph_map_zero_us=5.0)
WINS_GIVEN_THE_MAP = dataclasses.replace(WINS, graph_forward=-1.0)
NEVER = Crossover(-1.0, -1.0, -1.0, 50.0, 45.0)


@pytest.fixture
def fake_gpu(monkeypatch):
    """"auto" decides as on a GPU, for CPU tensors (the kernels interpreted): `state.capturing`
    says whether a CUDA graph is being captured, calibrations are recorded in `state.calibrations`
    and answer `state.crossover`; plans, trackers and counters start empty."""
    state = types.SimpleNamespace(capturing=False, crossover=WINS, calibrations=[])

    def measure(*args):
        state.calibrations.append(args)
        return state.crossover

    monkeypatch.setattr(sparse_dispatch, "on_gpu", lambda x: True)
    monkeypatch.setattr(sparse_dispatch, "capturing", lambda: state.capturing)
    monkeypatch.setattr(sparse_calibration, "measure_crossover", measure)
    monkeypatch.setattr(sparse_dispatch, "STATE", sparse_dispatch.DispatchState(CrossoverCache(None)))
    reset_path_counts()
    return state


def half_silent_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, weight, bias) of a 3x3 conv whose sample 1 is silent: its forward does half the dense
    work (6 channels: one chunk per active sample)."""
    generator = torch.Generator().manual_seed(seed)
    x = spikes((2, 6, 9, 11), 0.3, generator)
    x[1] = 0
    return x, torch.randn((5, 6, 3, 3), generator=generator), torch.randn(5, generator=generator)


def taken() -> dict[str, int]:
    """The paths counted since the last reset, without the extra counters."""
    return {path: n for path, n in path_counts().items() if path not in ("probe", "sparse_wgrad")}


def test_auto_eager_calls_run_cudnn_without_calibrating(fake_gpu):
    x, weight, bias = half_silent_batch()
    for _ in range(EAGER_SAMPLE_EVERY + 1):
        y = sparse_conv2d(x, weight, bias, 1, 1)
    assert torch.equal(y, F.conv2d(x, weight, bias, 1, 1))
    assert fake_gpu.calibrations == [] and path_counts() == {"dense:eager": EAGER_SAMPLE_EVERY + 1}


@pytest.mark.parametrize("calibrated", [False, True])
@pytest.mark.parametrize("as_module", [False, True])
def test_auto_under_torch_compile_runs_cudnn_in_one_graph(fake_gpu, monkeypatch, as_module, calibrated):
    """"auto" decides from densities and timings measured at run time, which Dynamo cannot trace (a shape
    calibrated where the sparse path wins samples its density with a read-back): compiled, it runs the dense
    conv in one graph, measuring and calibrating nothing; the same layer's eager calls still dispatch."""
    torch._dynamo.reset()
    monkeypatch.setattr(sparse_dispatch, "EAGER_SAMPLE_EVERY", 1)  # every eager call of a calibrated shape samples
    x, weight, bias = half_silent_batch()
    conv = SparseConv2d(6, 5, 3, padding=1, backend="auto")
    with torch.no_grad():
        conv.weight.copy_(weight)
        conv.bias.copy_(bias)
    fn = conv if as_module else (lambda v: sparse_conv2d(v, weight, bias, 1, 1))
    if calibrated:
        with capture_warmup():
            fn(x)
    calibrations, tracker = len(fake_gpu.calibrations), conv.density if as_module else None
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), F.conv2d(x, weight, bias, 1, 1), rtol=0, atol=0)
    assert len(fake_gpu.calibrations) == calibrations == int(calibrated)
    if tracker is not None:
        assert tracker._calls == int(calibrated)  # the compiled calls sampled nothing
    reset_path_counts()
    fn(x)
    assert taken() == {"dense:eager": 1}


def test_warm_up_calibrates_once_and_measures_then_the_capture_goes_sparse(fake_gpu):
    x, weight, bias = half_silent_batch()
    tracker = DensityTracker()
    with capture_warmup():
        for _ in range(3):
            assert torch.equal(sparse_conv2d(x, weight, bias, 1, 1, tracker=tracker), F.conv2d(x, weight, bias, 1, 1))
    assert len(fake_gpu.calibrations) == 1 and path_counts() == {"dense:eager": 3, "probe": 3}
    geometry = conv_geometry(x, weight, [1, 1], [1, 1], [1, 1], 1)
    measured = sparse_density.work_fractions(x, sparse_prescan.block_activity(x), geometry).tolist()
    assert [tracker.forward, tracker.wgrad] == measured and measured[0] == 0.5
    reset_path_counts()
    fake_gpu.capturing = True
    y = sparse_conv2d(x, weight, bias, 1, 1, tracker=tracker)
    assert taken() == {"sparse": 1}
    torch.testing.assert_close(y, F.conv2d(x, weight, bias, 1, 1), rtol=1e-5, atol=1e-4)
    fake_gpu.capturing = False
    sparse_conv2d(x, weight, bias, 1, 1, tracker=tracker)  # after the capture: plain eager, no new calibration
    assert len(fake_gpu.calibrations) == 1


@pytest.mark.parametrize("case,path", [
    ("never wins", "dense:never_wins"), ("not measured", "dense:unmeasured"), ("too dense", "dense:too_dense"),
    ("prescan never wins", "dense:never_wins"), ("given the block map", "sparse"),
])
def test_a_captured_call_takes_cudnn_unless_its_measured_density_wins(fake_gpu, case, path):
    x, weight, bias = half_silent_batch()
    if case == "too dense":
        x[1] = x[0]  # forward: all of the dense work
    fake_gpu.crossover = {"never wins": NEVER, "prescan never wins": WINS_GIVEN_THE_MAP,
                          "given the block map": WINS_GIVEN_THE_MAP}.get(case, WINS)
    tracker = DensityTracker()
    with capture_warmup():
        sparse_conv2d(x, weight, bias, 1, 1, tracker=tracker)
    warm_up_path = "dense:never_wins" if case == "never wins" else "dense:eager"
    assert path_counts().get(warm_up_path) == 1 and (tracker.forward is None) == (case == "never wins")
    reset_path_counts()
    fake_gpu.capturing = True
    block_map = sparse_prescan.block_activity(x) if case == "given the block map" else None
    y = sparse_conv2d(x, weight, bias, 1, 1, tracker=DensityTracker() if case == "not measured" else tracker,
                      block_map=block_map)
    assert taken() == {path: 1}
    torch.testing.assert_close(y, F.conv2d(x, weight, bias, 1, 1), rtol=1e-5, atol=1e-4)


def test_a_shape_captured_before_its_calibration_calibrates_at_its_next_eager_call(fake_gpu):
    """A capture cannot time: its call runs cuDNN, and the next eager call of that shape (no
    warm-up marked) calibrates and measures, so that the next capture can go sparse."""
    x, weight, bias = half_silent_batch()
    tracker = DensityTracker()
    fake_gpu.capturing = True
    sparse_conv2d(x, weight, bias, 1, 1, tracker=tracker)
    assert taken() == {"dense:uncalibrated": 1} and fake_gpu.calibrations == []
    fake_gpu.capturing = False
    for _ in range(2):
        sparse_conv2d(x, weight, bias, 1, 1, tracker=tracker)
    assert len(fake_gpu.calibrations) == 1 and path_counts() == {"dense:uncalibrated": 1, "dense:eager": 2, "probe": 1}
    reset_path_counts()
    fake_gpu.capturing = True
    sparse_conv2d(x, weight, bias, 1, 1, tracker=tracker)
    assert taken() == {"sparse": 1}


def test_sparse_conv2d_module_routes_under_auto(fake_gpu, monkeypatch):
    """SparseConv2d: plain eager calls skip the dispatcher once routed (cuDNN); warm-up and
    captured calls go through it; a captured call asks for the neuron's block map exactly where
    it would take the sparse path with it."""
    from kernels.sparse_conv import module as sparse_module

    x, weight, bias = half_silent_batch()
    fake_gpu.crossover = WINS_GIVEN_THE_MAP
    conv = SparseConv2d(6, 5, 3, padding=1)
    with torch.no_grad():
        conv.weight.copy_(weight)
        conv.bias.copy_(bias)
    dispatched = []
    real = sparse_module.sparse_conv2d
    monkeypatch.setattr(sparse_module, "sparse_conv2d", lambda *a, **k: dispatched.append(a) or real(*a, **k))
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(conv(x), F.conv2d(x, weight, bias, 1, 1))
        assert len(dispatched) == 1 and path_counts() == {"dense:eager": 3} and fake_gpu.calibrations == []
        assert not conv.wants_block_map(x)  # eager calls run cuDNN
        with capture_warmup():
            conv(x)
            conv(x)
        assert len(dispatched) == 3 and len(fake_gpu.calibrations) == 1 and path_counts()["probe"] == 2
        assert conv.density.forward == 0.5 and not conv.wants_block_map(x)
        reset_path_counts()
        fake_gpu.capturing = True
        assert conv.wants_block_map(x)
        y = conv(x, block_map=sparse_prescan.block_activity(x))
        assert taken() == {"sparse": 1} and len(dispatched) == 4
        torch.testing.assert_close(y, F.conv2d(x, weight, bias, 1, 1), rtol=1e-5, atol=1e-4)
        conv.density.forward = 0.9  # denser than the crossover: no map wanted, cuDNN captured
        assert not conv.wants_block_map(x)
        conv(x)
        assert taken() == {"sparse": 1, "dense:never_wins": 1}  # without the map, the prescan never wins


@pytest.mark.parametrize("kind", ["dense", "depthwise"])
def test_block_map_from_the_st_bif_kernel_replaces_the_prescan(kind, monkeypatch):
    """ST-BIF spikes with their kernel-written map: the conv (and its gradients) match F.conv2d,
    and the prescan never runs."""
    from kernels.sparse_conv import function as sparse_function
    from kernels.st_bif import st_bif_multistep_with_block_map

    generator = torch.Generator().manual_seed(17)
    drive = torch.randn((2, 3, 6, 9, 11), generator=generator) * 2
    drive[:, :, 1:4] = 0  # silent planes
    spikes_seq, block_map = st_bif_multistep_with_block_map(drive, 0.7, 3, -4, backend="triton")
    x = spikes_seq.flatten(0, 1)
    c_out, groups = (6, 6) if kind == "depthwise" else (5, 1)
    weight = torch.randn((c_out, 6 // groups, 3, 3), generator=generator)
    monkeypatch.setattr(sparse_function, "block_activity", lambda *args: pytest.fail("the prescan ran"))
    y = sparse_conv2d(x, weight, None, 1, 1, 1, groups, backend="triton", block_map=block_map)
    torch.testing.assert_close(y, F.conv2d(x, weight, None, 1, 1, 1, groups), rtol=1e-5, atol=1e-4)
    x_grad, w_grad = x.detach().requires_grad_(), weight.detach().requires_grad_()
    y = sparse_conv2d(x_grad, w_grad, None, 1, 1, 1, groups, backend="triton", block_map=block_map)
    y.backward(torch.ones_like(y))
    ref_x, ref_w = x.detach().requires_grad_(), weight.detach().requires_grad_()
    F.conv2d(ref_x, ref_w, None, 1, 1, 1, groups).backward(torch.ones_like(y))
    torch.testing.assert_close(x_grad.grad, ref_x.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(w_grad.grad, ref_w.grad, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("bad_map", ["shape", "dtype", "planes shape", "planes dtype"])
def test_a_block_map_of_another_input_is_a_clear_error(bad_map):
    x, weight, bias, _ = conv_case("dense", 3)
    blocks = sparse_prescan.block_activity(x)
    planes = blocks.amax(dim=(1, 2))
    block_map = {"shape": blocks[:, :1], "dtype": blocks.bool(), "planes shape": BlockMap(blocks, planes[:1]),
                 "planes dtype": BlockMap(blocks, planes.float())}[bad_map]
    match = "block_map.planes must be int8" if bad_map.startswith("planes") else "block_map must be int8"
    with pytest.raises(ValueError, match=match):
        sparse_conv2d(x, weight, bias, 1, 1, backend="triton", block_map=block_map)


@pytest.mark.parametrize("size,planes_used", [(9, True), (40, False)], ids=["one-tile-planes", "row-band-tiles"])
def test_depthwise_flags_are_the_neurons_plane_flags_where_a_tile_is_a_plane(size, planes_used):
    """The depthwise forward takes the ST-BIF kernel's plane flags as its `active` flags where
    one program covers the whole output plane (no activity kernel), and ORs the block map's
    windows otherwise (40x40 planes are three row bands); both give F.conv2d's result."""
    generator = torch.Generator().manual_seed(size)
    x = spikes((3, 5, size, size), 0.3, generator, plane_silence=0.5)
    blocks = sparse_prescan.block_activity(x)
    planes = blocks.amax(dim=(1, 2))
    assert 0 < planes.float().mean() < 1
    weight = torch.randn((5, 1, 3, 3), generator=generator)
    geometry = conv_geometry(x, weight, [1, 1], [1, 1], [1, 1], 5)
    tiled, active = sparse_triton.depthwise_activity(x, blocks, geometry, planes=planes)
    assert (tiled.tiles == 1) == planes_used
    assert (active.data_ptr() == planes.data_ptr()) == planes_used
    # 3x3 with padding 1: a whole-plane tile's window is the whole plane, so the flags agree
    assert torch.equal(active, sparse_prescan.window_activity(blocks, tiled))
    y = sparse_conv2d(x, weight, None, 1, 1, 1, 5, backend="triton", block_map=BlockMap(blocks, planes))
    torch.testing.assert_close(y, F.conv2d(x, weight, None, 1, 1, 1, 5), rtol=1e-5, atol=1e-5)
