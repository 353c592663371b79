"""kernels.sparse_conv.dense on a GPU (``pytest -m gpu``): dilated depthwise convs by phases equal cuDNN's, eager
and captured in a CUDA graph."""
import pytest
import torch
import torch.nn.functional as F

from kernels.sparse_conv import SparseConv2d
from kernels.sparse_conv.dense import dense_conv2d, phase_conv_applies

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def grads(conv, x, weight, upstream):
    x_, w_ = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    out = conv(x_, w_)
    return (out.detach(), *torch.autograd.grad(out, (x_, w_), upstream))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("channels", "size", "kernel", "stride"), [(16, 32, 3, 1), (16, 32, 5, 2), (32, 16, 5, 1),
                                                                     (12, 9, 3, 2)], ids=str)
def test_cuda_phase_conv_equals_the_float64_dilated_conv(channels, size, kernel, stride, dtype):
    generator = torch.Generator().manual_seed(channels + kernel)
    x = torch.randn(6, channels, size, size, generator=generator).to(dtype)
    weight = torch.randn(channels, 1, kernel, kernel, generator=generator).to(dtype)
    padding = 2 * (kernel - 1) // 2
    want_shape = F.conv2d(x.double(), weight.double(), None, stride, padding, 2, channels).shape
    upstream = torch.randn(want_shape, generator=generator).to(dtype)
    x_cuda = x.cuda().contiguous(memory_format=torch.channels_last)
    assert phase_conv_applies(x_cuda, weight.cuda(), stride, padding, 2, channels)
    got = grads(lambda a, w: dense_conv2d(a, w, None, stride, padding, 2, channels), x_cuda, weight.cuda(),
                upstream.cuda().contiguous(memory_format=torch.channels_last))
    want = grads(lambda a, w: F.conv2d(a, w, None, stride, padding, 2, channels), x.double(), weight.double(),
                 upstream.double())
    assert got[0].dtype == dtype and got[0].is_contiguous(memory_format=torch.channels_last)
    for g, w in zip(got, want):
        scale = w.abs().max().item()
        torch.testing.assert_close(g.cpu().double() / scale, w / scale, rtol=0, atol=TOLERANCE[dtype])


def test_a_sparse_conv_module_takes_the_phases_and_its_cuda_graph_replays_the_eager_call():
    conv = SparseConv2d(16, 16, 5, stride=1, padding=4, dilation=2, groups=16, bias=False).cuda()
    x = torch.randn(8, 16, 16, 16, device="cuda").contiguous(memory_format=torch.channels_last)
    eager = conv(x)
    torch.testing.assert_close(eager, F.conv2d(x, conv.weight, None, 1, 4, 2, 16), rtol=1e-5, atol=1e-5)
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        conv(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = conv(static_x)
    for seed in (1, 2):
        static_x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).cuda())
        graph.replay()
        torch.testing.assert_close(static_y, conv(static_x), rtol=0, atol=0)
