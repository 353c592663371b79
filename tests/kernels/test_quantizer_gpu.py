"""The Triton quantizer on a GPU: against the torch reference, and captured in a CUDA graph (``pytest -m gpu``)."""
import pytest
import torch

from kernels.quantizer import quantize
from tests.kernels.helpers import assert_replay_equals_eager
from tests.kernels.test_quantizer import BOUNDS, DTYPES, random_input

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def run(x, theta, bounds, grad, backend):
    xi, ti = x.clone().requires_grad_(), theta.clone().requires_grad_()
    y = quantize(xi, ti, *bounds, 0.1, backend=backend)
    y.backward(grad)
    return y.detach(), xi.grad, ti.grad


@pytest.mark.parametrize("bounds", BOUNDS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (3, 5, 7, 11), (64, 48, 32, 32)], ids=str)
def test_cuda_equals_reference(shape, dtype, bounds):
    theta = torch.tensor(0.41, device="cuda")
    x = random_input(shape, dtype, 0.41, seed=3).cuda()
    grad = torch.randn(shape, device="cuda").to(dtype)
    y_ref, gx_ref, gt_ref = run(x, theta, bounds, grad, "torch")
    y, gx, gt = run(x, theta, bounds, grad, "auto")
    assert torch.equal(y, y_ref) and torch.equal(gx, gx_ref)  # same IEEE math and rounding on the GPU
    torch.testing.assert_close(gt, gt_ref, rtol=1e-4, atol=1e-4)


def test_cuda_graph_replay_equals_eager():
    theta = torch.tensor(0.5, device="cuda", requires_grad=True)
    x = random_input((8, 16, 9, 9), torch.float32, 0.5, seed=4).cuda().requires_grad_()
    grad = torch.randn(8, 16, 9, 9, device="cuda")

    def step():
        x.grad = theta.grad = None
        y = quantize(x, theta, 0, 7, 0.1)
        y.backward(grad)
        return y.detach()

    assert_replay_equals_eager(step, x, lambda: [x.grad, theta.grad])
