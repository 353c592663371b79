"""bench_quantizer.py's parts that run on a CPU: the step's quantizer calls, and a backward launch configuration
that computes what the kernels' own does (the benchmark must not time a wrong variant)."""
import pytest
import torch

from benchmarks.bench_quantizer import step_shapes, use_bwd_config
from kernels.quantizer import triton as qt
from kernels.quantizer.reference import quantize_backward_reference


def test_step_shapes_are_the_networks_quantizer_inputs_at_the_batch():
    shapes = step_shapes(batch=8)
    assert sum(shapes.values()) == 241  # DARTS_V2 20 x 36 with its aux head, as profiled on the GPU
    assert all(shape[0] == 8 and len(shape) == 4 for shape in shapes)
    assert {shape[1] for shape in shapes} >= {36, 72, 144}


@pytest.mark.parametrize("config", [(1024, 4), (2048, 8)])
def test_another_bwd_config_equals_the_reference(config):
    kept = qt.BWD_BLOCK, qt.BWD_NUM_WARPS
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 17, 29, generator=gen)  # 7,395 elements: several programs of either block
    grad, theta = torch.randn(x.shape, generator=gen), torch.tensor([0.3])
    try:
        use_bwd_config(*config)
        grad_x, grad_theta = qt.quantize_bwd(grad, x, theta, -4, 3, True)
    finally:
        use_bwd_config(*kept)
    want_x, want_theta = quantize_backward_reference(grad, x, theta, -4, 3, True)
    torch.testing.assert_close(grad_x, want_x, rtol=0, atol=0)
    torch.testing.assert_close(grad_theta.reshape(()), want_theta.to(grad_theta.dtype), rtol=1e-5, atol=1e-5)
