"""kernels.pool3x3 on a GPU against float64 CPU pools (``pytest -m gpu``).

The reference is PyTorch's pools on the CPU (or CUDA NCHW), never CUDA channels_last: PyTorch's NHWC CUDA
average-pool backward drops the padding offset when it maps an input pixel to its windows (pytorch/pytorch#188344,
fixed upstream in mid-2026), so with padding 1 its input gradient is wrong in releases without that fix.
"""
import pytest
import torch

from kernels.pool3x3 import pool3x3, pool3x3_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def grad_of(fn, x: torch.Tensor, upstream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().clone().requires_grad_()
    y = fn(x)
    return y.detach(), torch.autograd.grad(y, [x], upstream)[0]


@pytest.mark.parametrize("grad_format", [torch.channels_last, torch.contiguous_format])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("kind", ["avg", "max"])
@pytest.mark.parametrize("shape", [(64, 16, 32, 32), (3, 20, 6, 9), (2, 65, 5, 7)], ids=str)
def test_cuda_kernels_equal_float64_cpu_pools(shape, kind, stride, grad_format):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out_shape = pool3x3_reference(x, kind, stride).shape
    upstream = torch.randn(out_shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want_y, want_grad = grad_of(lambda t: pool3x3_reference(t, kind, stride), x, upstream)
    xc = x.float().cuda().to(memory_format=torch.channels_last)
    got_y, got_grad = grad_of(lambda t: pool3x3(t, kind, stride, "triton"), xc,
                              upstream.float().cuda().contiguous(memory_format=grad_format))
    assert got_grad.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got_y.double().cpu(), want_y, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_grad.double().cpu(), want_grad, rtol=1e-6, atol=1e-6)
    # PyTorch's CUDA NCHW pools agree too (its channels_last average backward may not: see the docstring)
    _, nchw_grad = grad_of(lambda t: pool3x3_reference(t, kind, stride), xc.contiguous(), upstream.float().cuda())
    torch.testing.assert_close(got_grad, nchw_grad.contiguous(memory_format=torch.channels_last), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["avg", "max"])
def test_kept_launches_of_later_calls_equal_the_first(kind, dtype):
    """From the second call of a key on, the launches skip Triton's run (kernels/launch.py): new data, other
    shapes in between and an input one element off (another pointer alignment) must still give the reference."""
    gen = torch.Generator().manual_seed(2)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    for n, c, h, w in [(4, 16, 8, 8), (4, 16, 8, 8), (2, 24, 7, 5), (4, 16, 8, 8)]:
        for offset in (0, 1):
            # values exact in dtype, so the reference's maxima (and ties) are the kernel's
            flat = torch.randn(offset + n * h * w * c, generator=gen).to(dtype).double()
            x = flat[offset:].view(n, h, w, c).permute(0, 3, 1, 2)  # channels_last strides
            upstream = torch.randn(pool3x3_reference(x, kind, 2).shape, generator=gen, dtype=torch.float64)
            want_y, want_grad = grad_of(lambda t: pool3x3_reference(t, kind, 2), x, upstream)
            flat_cuda = flat.to("cuda", dtype).requires_grad_()
            x_cuda = flat_cuda[offset:].view(n, h, w, c).permute(0, 3, 1, 2)  # no copy: the offset pointer
            y = pool3x3(x_cuda, kind, 2, "triton")
            (grad,) = torch.autograd.grad(y, [flat_cuda], upstream.to("cuda", dtype))
            got_grad = grad[offset:].view(n, h, w, c).permute(0, 3, 1, 2)
            torch.testing.assert_close(y.detach().double().cpu(), want_y, rtol=tol, atol=tol)
            torch.testing.assert_close(got_grad.double().cpu(), want_grad, rtol=tol, atol=tol)
