"""Spiking ops on a CUDA GPU: the ST-BIF kernel's block map reaches the sparse convs.
Run with `pytest -m gpu tests/search_space/test_ops_gpu.py` on a machine with a GPU."""
import copy

import pytest
import torch

from kernels.sparse_conv import SparseConv2d
from kernels.sparse_conv import function as sparse_function
from search_space.neurons import NeuronFactory
from search_space.ops import OPS, UnitAffineBatchNorm2d

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["spike_conv_3x3", "spike_conv_1x1", "sep_conv_3x3", "dil_conv_5x5"])
def test_ops_with_block_maps_match_cudnn(name, dtype, monkeypatch):
    torch.manual_seed(0)
    timesteps, batch, channels, size = 2, 8, 32, 16
    op = OPS[name](channels, 1, True, NeuronFactory("st_bif", timesteps=timesteps)).cuda().to(dtype)
    reference = copy.deepcopy(op)
    for conv in (m for m in op.modules() if isinstance(m, SparseConv2d)):
        conv.backend = "triton"
    for conv in (m for m in reference.modules() if isinstance(m, SparseConv2d)):
        conv.backend = "torch"
    x = (2.0 * torch.randn(timesteps * batch, channels, size, size, device="cuda")).to(dtype)
    x[:, ::3] = 0  # silent channels
    with torch.no_grad():
        expected = reference(x)
        monkeypatch.setattr(sparse_function, "block_activity", lambda *args: pytest.fail("the prescan ran"))
        got = op(x)
    error = ((got.double() - expected.double()).norm() / expected.double().norm()).item()
    assert error <= (2e-3 if dtype == torch.float32 else 5e-3), error


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_unit_affine_batch_norm_on_cudnn_matches_the_native_kernels(dtype):
    torch.manual_seed(0)
    unit = UnitAffineBatchNorm2d(16).cuda()
    native = copy.deepcopy(unit)
    native.weight = native.bias = None  # no weight: PyTorch's native batch norm
    x = (3 * torch.randn(64, 16, 9, 11, device="cuda") + 1).to(dtype).requires_grad_()
    upstream = torch.randn_like(x)
    outputs = [norm(x) for norm in (unit, native)]
    grads = [torch.autograd.grad(out, x, upstream)[0] for out in outputs]
    tol = {"rtol": 1e-3, "atol": 1e-3} if dtype == torch.float16 else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(outputs[0], outputs[1], **tol)
    torch.testing.assert_close(grads[0], grads[1], **tol)
    torch.testing.assert_close(unit.running_var, native.running_var, rtol=1e-4, atol=1e-6)
