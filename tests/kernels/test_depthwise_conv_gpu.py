"""kernels.depthwise_conv on a GPU against float64 CPU convs (``pytest -m gpu``), and captured in a CUDA graph."""
import pytest
import torch

from kernels.depthwise_conv import depthwise_conv2d, depthwise_conv2d_reference
from tests.kernels.helpers import assert_replay_equals_eager

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def grads(fn, x: torch.Tensor, weight: torch.Tensor, upstream: torch.Tensor):
    x, weight = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    y = fn(x, weight)
    return (y.detach(), *torch.autograd.grad(y, [x, weight], upstream.to(y.device, y.dtype)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("shape", "kernel", "stride", "dilation"),
                         [((64, 36, 32, 32), 3, 1, 1), ((64, 72, 16, 16), 3, 2, 1), ((32, 144, 8, 8), 5, 1, 1),
                          ((32, 36, 32, 32), 3, 1, 2), ((3, 70, 9, 7), 5, 2, 2)], ids=str)
def test_cuda_kernels_equal_float64_cpu_convs(shape, kernel, stride, dilation, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    weight = torch.randn(shape[1], 1, kernel, kernel, generator=gen, dtype=torch.float64) / kernel
    padding = dilation * (kernel - 1) // 2
    y_shape = depthwise_conv2d_reference(x[:1], weight, stride, padding, dilation).shape
    upstream = torch.randn((shape[0], *y_shape[1:]), generator=gen, dtype=torch.float64)
    want = grads(lambda a, w: depthwise_conv2d_reference(a, w, stride, padding, dilation), x, weight, upstream)
    xc = x.to("cuda", dtype).contiguous(memory_format=torch.channels_last)
    got = grads(lambda a, w: depthwise_conv2d(a, w, stride, padding, dilation, "triton"), xc,
                weight.to("cuda", dtype), upstream)
    tolerance = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    for g, w in zip(got, want):
        scale = max(1.0, w.abs().max().item())
        torch.testing.assert_close(g.double().cpu() / scale, w / scale, rtol=tolerance, atol=tolerance)


def test_a_captured_step_equals_the_eager_one():
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(16, 36, 32, 32, device="cuda", generator=gen).contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    weight = torch.randn(36, 1, 3, 3, device="cuda", generator=gen, requires_grad=True)
    upstream = torch.randn(16, 36, 32, 32, device="cuda", generator=gen).contiguous(memory_format=torch.channels_last)

    def step():  # the backward into .grad, as the graphed retrain step captures it
        x.grad = weight.grad = None
        y = depthwise_conv2d(x, weight, 1, 1, 1, "triton")
        y.backward(upstream)
        return y.detach()

    assert_replay_equals_eager(step, x, lambda: [x.grad, weight.grad])
