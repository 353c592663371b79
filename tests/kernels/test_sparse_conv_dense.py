"""kernels.sparse_conv.dense: dilated depthwise convs as undilated convs of the input's phase images (CPU)."""
import pytest
import torch
import torch.nn.functional as F

from kernels.sparse_conv.dense import conv2d_by_phases, phase_conv_applies

CL = torch.channels_last


def channels_last(*shape, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=dtype).contiguous(memory_format=CL)


def values_and_grads(conv, x, weight, bias, upstream):
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight, bias) if t is not None]
    x_, w_, b_ = leaves[0], leaves[1], leaves[2] if bias is not None else None
    out = conv(x_, w_, b_)
    return out, torch.autograd.grad(out, leaves, upstream)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("kernel", [3, 5])
@pytest.mark.parametrize(("dilation", "stride", "size"), [(2, 1, (12, 18)), (3, 1, (9, 6)), (2, 2, (12, 18)),
                                                          (2, 2, (13, 7)), (3, 3, (11, 16))], ids=str)
def test_phase_conv_equals_the_dilated_conv_with_its_gradients_in_float64(dilation, stride, size, kernel, with_bias):
    channels = 5
    x = channels_last(3, channels, *size)
    weight = torch.randn(channels, 1, kernel, kernel, dtype=torch.float64)
    bias = torch.randn(channels, dtype=torch.float64) if with_bias else None
    padding = dilation * (kernel - 1) // 2
    assert phase_conv_applies(x, weight, stride, padding, dilation, channels)
    upstream = torch.randn_like(F.conv2d(x, weight, None, stride, padding, dilation, channels))
    want, want_grads = values_and_grads(
        lambda a, w, b: F.conv2d(a, w, b, stride, padding, dilation, channels), x, weight, bias, upstream)
    got, got_grads = values_and_grads(
        lambda a, w, b: conv2d_by_phases(a, w, b, stride, dilation, channels), x, weight, bias, upstream)
    assert got.shape == want.shape and got.is_contiguous(memory_format=CL)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_phase_conv_matches_in_float32_and_bfloat16(dtype):
    x = channels_last(2, 8, 8, 10, dtype=dtype, seed=3)
    weight = torch.randn(8, 1, 3, 3, dtype=dtype)
    got = conv2d_by_phases(x, weight, None, 1, 2, 8)
    want = F.conv2d(x.double(), weight.double(), None, 1, 2, 2, 8)
    assert got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(("case", "args"), [
    ("no dilation", dict(dilation=1, padding=1)),
    ("not same padding", dict(padding=1)),
    ("stride neither 1 nor the dilation", dict(stride=3)),
    ("odd size at stride 1", dict(size=(9, 8))),
    ("not depthwise", dict(groups=1)),
    ("NCHW input", dict(layout=torch.contiguous_format)),
    ("even kernel", dict(kernel=4, padding=3)),
    ("two dilations", dict(dilation=(2, 1))),
])
def test_phase_conv_refuses_calls_it_does_not_compute(case, args):
    spec = dict(dilation=2, padding=2, stride=1, size=(8, 8), groups=4, layout=CL, kernel=3) | args
    x = torch.randn(2, 4, *spec["size"]).contiguous(memory_format=spec["layout"])
    weight = torch.randn(4, 4 // spec["groups"], spec["kernel"], spec["kernel"])
    assert not phase_conv_applies(x, weight, spec["stride"], spec["padding"], spec["dilation"], spec["groups"]), case
