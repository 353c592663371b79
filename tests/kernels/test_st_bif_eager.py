"""The eager ST-BIF path (STBIFFunction) equals the custom ops that torch.compile traces."""
import pytest
import torch

from kernels.st_bif.function import STBIFFunction, _st_bif_forward_op


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("surrogate", ["sigmoid", "rectangular"])
def test_eager_function_equals_custom_op(dtype, surrogate):
    generator = torch.Generator().manual_seed(0)
    x = (2 * torch.randn(4, 3, 5, 7, generator=generator)).to(dtype)
    grad_out = torch.randn(x.shape, generator=generator).to(dtype)
    results = []
    for run in (STBIFFunction.apply, _st_bif_forward_op):
        x_seq = x.clone().requires_grad_()
        theta = torch.tensor(0.7, requires_grad=True)
        out = run(x_seq, theta, 3, -4, surrogate)
        out.backward(grad_out)
        results.append((out, x_seq.grad, theta.grad))
    for eager, op in zip(*results):
        assert torch.equal(eager, op)
    assert results[0][0].count_nonzero() > 0 and results[0][2] != 0
