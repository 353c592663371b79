"""kernels.depthwise_conv: the Triton depthwise conv (CPU interpreter) equals F.conv2d, its output and both
gradients, over odd sizes, kernels 3 and 5, strides 1 and 2, dilations 1 and 2, and every float dtype."""
from __future__ import annotations

import pytest
import torch

from kernels.depthwise_conv import depthwise_conv2d, depthwise_conv2d_reference
from kernels.depthwise_conv import triton as kernels
from kernels.sparse_conv import SparseConv2d
from tests.kernels.helpers import compile_for_hopper

# (x shape, kernel, stride, padding, dilation): DARTS's sep_conv_3x3/5x5 and dil_conv_3x3/5x5 geometries at odd
# sizes, a 1 x 1 image, channels over one block (70 > 64), and a padding that is not "same"
GEOMETRIES = [((2, 5, 7, 6), 3, 1, 1, 1), ((2, 5, 7, 6), 3, 2, 1, 1), ((1, 3, 9, 8), 3, 1, 2, 2),
              ((1, 3, 9, 8), 3, 2, 2, 2), ((1, 70, 5, 9), 5, 2, 2, 1), ((1, 6, 11, 7), 5, 1, 4, 2),
              ((1, 4, 1, 1), 3, 1, 1, 1), ((2, 3, 6, 5), 3, 1, 0, 1)]
# One rounding of an fp32 sum on both sides; the low-precision dtypes round the inputs and the outputs.
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}


def grads(fn, x: torch.Tensor, weight: torch.Tensor, upstream: torch.Tensor | None, seed: int = 1):
    x, weight = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    y = fn(x, weight)
    if upstream is None:
        upstream = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    grad_x, grad_w = torch.autograd.grad(y, [x, weight], upstream.to(y.dtype))
    return y.detach(), grad_x, grad_w, upstream


def operands(shape, kernel, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 2 + 0.3).to(memory_format=torch.channels_last)
    weight = torch.randn(shape[1], 1, kernel, kernel, generator=gen, dtype=torch.float64)
    return x.to(dtype), weight.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("shape", "kernel", "stride", "padding", "dilation"), GEOMETRIES, ids=str)
def test_triton_depthwise_conv_equals_pytorchs_with_both_gradients(shape, kernel, stride, padding, dilation, dtype):
    x, weight = operands(shape, kernel, dtype)
    want = grads(lambda a, w: depthwise_conv2d_reference(a, w, stride, padding, dilation), x.double(),
                 weight.double(), None)
    got = grads(lambda a, w: depthwise_conv2d(a, w, stride, padding, dilation, "triton"), x, weight, want[3])
    assert got[0].dtype == dtype and got[0].is_contiguous(memory_format=torch.channels_last)
    assert got[1].is_contiguous(memory_format=torch.channels_last) and got[2].dtype == dtype
    assert got[2].shape == weight.shape
    rtol, atol = TOLERANCE[dtype]
    scale = [max(1.0, w.abs().max().item()) for w in want[:3]]  # sums of many products: relative to their size
    for g, w, s in zip(got[:3], want[:3], scale):
        torch.testing.assert_close(g.double() / s, w / s, rtol=rtol, atol=atol)


@pytest.mark.parametrize("stride", [1, 2])
def test_programs_of_several_chunks_and_channel_blocks_sum_every_weight_gradient_partial(monkeypatch, stride):
    # The default tiles give one chunk a program at sizes the interpreter can run; these tiles give programs of 3
    # chunks, the last program partial, and 3 channel blocks (the last partial).
    monkeypatch.setattr(kernels, "tile", lambda channels, pixels: (8, 4, 3))
    x, weight = operands((3, 10, 7, 5), 3, torch.float64)
    want = grads(lambda a, w: depthwise_conv2d_reference(a, w, stride, 1, 1), x, weight, None)
    got = grads(lambda a, w: depthwise_conv2d(a, w, stride, 1, 1, "triton"), x.float(), weight.float(), want[3])
    for g, w in zip(got[:3], want[:3]):
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5)


def test_tiles_keep_the_weight_gradient_partials_small_at_the_retrains_size():
    block_p, block_c, chunks = kernels.tile(36, 1024 * 32 * 32)
    assert (block_p, block_c, chunks) == (32, 64, 16)
    programs = -(-1024 * 32 * 32 // (block_p * chunks))
    assert programs * 9 * 36 * 4 < 0.05 * 1024 * 32 * 32 * 36 * 2  # partials: under 5% of an fp16 input's bytes
    assert kernels.tile(3, 10) == (512, 4, 1)  # few channels: more pixels a tile


def test_nchw_inputs_and_gradients_are_taken_and_auto_keeps_pytorchs_conv_on_cpu():
    x, weight = operands((2, 4, 6, 5), 3, torch.float32)
    x = x.contiguous()  # NCHW: the kernels take a channels_last copy
    want = grads(lambda a, w: depthwise_conv2d_reference(a, w, 1, 1, 1), x, weight, None)
    got = grads(lambda a, w: depthwise_conv2d(a, w, 1, 1, 1, "triton"), x, weight, want[3].contiguous())
    for g, w in zip(got[:3], want[:3]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    auto = grads(lambda a, w: depthwise_conv2d(a, w, 1, 1, 1, "auto"), x, weight, want[3])
    assert all(torch.equal(a, w) for a, w in zip(auto[:3], want[:3]))


def test_under_autocast_both_operands_take_its_dtype_and_the_weight_gradient_comes_back_in_the_weights():
    x, weight = operands((2, 6, 5, 5), 3, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = grads(lambda a, w: depthwise_conv2d(a, w, 1, 1, 1, "triton"), x, weight, None)
        want = grads(lambda a, w: depthwise_conv2d_reference(a, w, 1, 1, 1), x, weight, got[3])
    assert got[0].dtype == want[0].dtype == torch.bfloat16 and got[2].dtype == torch.float32
    for g, w in zip(got[:3], want[:3]):
        torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=5e-2)


def test_only_the_gradients_asked_for_are_made():
    x, weight = operands((1, 3, 5, 5), 3, torch.float32)
    weight.requires_grad_()
    y = depthwise_conv2d(x, weight, 1, 1, 1, "triton")
    (grad_w,) = torch.autograd.grad(y.sum(), [weight])
    want = depthwise_conv2d_reference(x, weight, 1, 1, 1)
    (want_w,) = torch.autograd.grad(want.sum(), [weight])
    torch.testing.assert_close(grad_w, want_w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("call", "message"), [
    (lambda x, w: depthwise_conv2d(x, w[:, :, :2], 1, 1), r"must be \[C, 1, K, K\]"),
    (lambda x, w: depthwise_conv2d(x, w[:2], 1, 1), r"must be \[C, 1, K, K\]"),
    (lambda x, w: depthwise_conv2d(x, w, 0, 1), "stride 0 and dilation 1 must be >= 1"),
    (lambda x, w: depthwise_conv2d(x, w.half(), 1, 1, backend="triton"), "x is torch.float32 but weight is"),
    (lambda x, w: depthwise_conv2d(x.int(), w.int(), 1, 1, backend="triton"), "float16/bfloat16/float32 tensors"),
    (lambda x, w: depthwise_conv2d(x, w, 1, 1, backend="cudnn"), "unknown backend 'cudnn'"),
])
def test_bad_calls_are_refused_with_the_fix(call, message):
    x, weight = operands((1, 3, 5, 5), 3, torch.float32)
    with pytest.raises(ValueError, match=message):
        call(x, weight)


def test_a_sparse_conv_layer_sends_depthwise_calls_to_the_kernels_when_asked():
    torch.manual_seed(0)
    layer = SparseConv2d(6, 6, 3, stride=2, padding=2, dilation=2, groups=6, bias=False, backend="torch")
    x = torch.randn(2, 6, 9, 7).to(memory_format=torch.channels_last)
    layer.depthwise_backend = "triton"
    assert "depthwise_backend='triton'" in repr(layer)
    x1 = x.clone().requires_grad_()
    y = layer(x1)
    layer.depthwise_backend = "torch"
    x2 = x.clone().requires_grad_()
    y_ref = layer(x2)
    upstream = torch.randn(y.shape, generator=torch.Generator().manual_seed(3))
    got_x, got_w = torch.autograd.grad(y, [x1, layer.weight], upstream)
    ref_x, ref_w = torch.autograd.grad(y_ref, [x2, layer.weight], upstream)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_x, ref_x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_w, ref_w, rtol=1e-5, atol=1e-5)
    dense = SparseConv2d(6, 6, 3, padding=1, bias=False, backend="torch")  # not depthwise: cuDNN whatever is asked
    dense.depthwise_backend = "triton"
    assert not dense._square_depthwise(x)


COMPILE_FOR_HOPPER = """
from kernels.depthwise_conv import triton as kernels
from tests.kernels.helpers import hopper_ptx, vector_accesses_only

for dtype in ("fp16", "bf16", "fp32"):
    pointers = {"x_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "y_ptr": f"*{dtype}", "g_ptr": f"*{dtype}",
                "gx_ptr": f"*{dtype}", "gw_ptr": "*fp32"}
    for kernel, stride, dilation in ((3, 1, 1), (3, 2, 2), (5, 1, 1)):
        for channels in (36, 72):  # DARTS_V2 20 x 36's, no multiples of 16
            size = 32 // stride
            values = {"P_OUT": 1024 * size * size, "P_IN": 1024 * 32 * 32, "H": 32, "W": 32, "OH": size, "OW": size,
                      "C": channels, "C_BLOCKS": 1, "K": kernel, "STRIDE": stride,
                      "PAD": dilation * (kernel - 1) // 2, "DIL": dilation, "CHUNKS": 16, "BLOCK_P": 32,
                      "BLOCK_C": 64, "TAPS": 16 if kernel == 3 else 32}
            for compiled in (kernels._depthwise_fwd_kernel, kernels._depthwise_bwd_kernel):
                ptx = hopper_ptx(compiled, values, pointers)
                # a pixel's channels move as vectors (8 bytes at 36 fp16 channels, 16 at 72), not one by one
                assert not vector_accesses_only(ptx), (dtype, channels, sorted(set(vector_accesses_only(ptx))))
"""


def test_kernels_compile_for_a_hopper_gpu():
    """The interpreter runs Python, not Triton's compiler: compile both kernels for sm_90 in a process without
    TRITON_INTERPRET (no GPU needed), and check that their global loads are vector loads."""
    compile_for_hopper(COMPILE_FOR_HOPPER)
