"""kernels.pool3x3: the Triton pools (CPU interpreter) equal PyTorch's, values and input gradients."""
from __future__ import annotations

import pytest
import torch

from kernels.pool3x3 import pool3x3, pool3x3_reference
from tests.kernels.helpers import compile_for_hopper

SHAPES = [(2, 16, 7, 5), (1, 3, 1, 1), (1, 20, 6, 9), (1, 65, 4, 3), (2, 1, 8, 8)]
TOLERANCE = {torch.float32: (1e-6, 1e-6), torch.bfloat16: (1e-2, 1e-2), torch.float16: (1e-3, 1e-3)}


def run(x: torch.Tensor, kind: str, stride: int, backend: str, upstream: torch.Tensor | None = None):
    xin = x.clone().requires_grad_()
    out = pool3x3(xin, kind, stride, backend) if backend else pool3x3_reference(xin, kind, stride)
    if upstream is None:
        upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(x.dtype)
    (grad,) = torch.autograd.grad(out, [xin], upstream.to(memory_format=torch.channels_last))
    return out.detach(), grad, upstream


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("kind", ["avg", "max"])
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_pool_equals_pytorchs_with_its_gradient(shape, kind, stride, dtype):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3 + 0.5).to(dtype)
    x = x.to(memory_format=torch.channels_last)
    want, want_grad, upstream = run(x.float(), kind, stride, None)
    got, got_grad, _ = run(x, kind, stride, "triton", upstream)
    assert got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last)
    assert got_grad.is_contiguous(memory_format=torch.channels_last)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), want, rtol=rtol, atol=atol)
    torch.testing.assert_close(got_grad.float(), want_grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("stride", [1, 2])
def test_max_pool_ties_send_the_gradient_to_the_first_largest_tap_as_pytorch(stride):
    x = torch.randint(0, 3, (2, 5, 7, 6), generator=torch.Generator().manual_seed(0)).float()
    x = x.to(memory_format=torch.channels_last)  # few values: most windows tie
    want, want_grad, upstream = run(x, "max", stride, None)
    got, got_grad, _ = run(x, "max", stride, "triton", upstream)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)


@pytest.mark.parametrize("grad_format", [torch.channels_last, torch.contiguous_format])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("kind", ["avg", "max"])
@pytest.mark.parametrize("shape", [(2, 16, 9, 8), (1, 65, 5, 7)])
def test_launches_of_several_programs_with_either_gradient_layout_equal_float64_cpu_pools(shape, kind, stride,
                                                                                          grad_format):
    # SHAPES above take one or a few programs (BLOCK elements each); these take 2 to 5 a launch, the last one partial
    # (kept that few: each program is slow under the interpreter), with the upstream gradient in either layout
    # (randn_like of a channels_last output is channels_last; torch.randn(shape) is NCHW).
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    want_x = x.clone().requires_grad_()
    want_y = pool3x3_reference(want_x, kind, stride)
    upstream = torch.randn(want_y.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (want_grad,) = torch.autograd.grad(want_y, [want_x], upstream)
    got_x = x.float().to(memory_format=torch.channels_last).requires_grad_()
    got_y = pool3x3(got_x, kind, stride, "triton")
    (got_grad,) = torch.autograd.grad(got_y, [got_x], upstream.float().contiguous(memory_format=grad_format))
    torch.testing.assert_close(got_y.double(), want_y.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_grad.double(), want_grad, rtol=1e-6, atol=1e-6)


def test_nchw_gradients_and_inputs_are_taken_and_auto_keeps_pytorchs_pools_on_cpu():
    x = torch.randn(2, 4, 5, 5)  # NCHW: the kernels take a channels_last copy
    want, want_grad, upstream = run(x, "avg", 1, None)
    got, got_grad, _ = run(x, "avg", 1, "triton", upstream)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-6, atol=1e-6)
    auto, auto_grad, _ = run(x, "avg", 1, "auto", upstream)
    assert torch.equal(auto, want) and torch.equal(auto_grad, want_grad)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kind": "mean", "stride": 1}, "must be one of"),
    ({"kind": "avg", "stride": 3}, "must be one of"),
    ({"kind": "avg", "stride": 1, "backend": "cuda"}, "expected one of"),
])
def test_bad_arguments_name_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pool3x3(torch.randn(1, 2, 3, 3), **kwargs)


def test_tensors_beyond_the_kernels_int32_element_index_are_refused_with_the_fix(monkeypatch):
    import kernels.pool3x3 as pools
    x = torch.randn(1, 4, 6, 6).to(memory_format=torch.channels_last)
    monkeypatch.setattr(pools, "MAX_ELEMENTS", x.numel() - 1)  # stands for 2**31 - 1: x is one element over
    with pytest.raises(ValueError, match="at most 2\\*\\*31 - 1 elements.*use backend='torch'"):
        pool3x3(x, "max", 1, "triton")


COMPILE_FOR_HOPPER = """
from kernels.pool3x3 import triton as kernels
from tests.kernels.helpers import hopper_ptx, vector_accesses_only

for dtype in ("fp16", "bf16", "fp32"):
    pointers = {"x_ptr": f"*{dtype}", "y_ptr": f"*{dtype}", "g_ptr": f"*{dtype}", "gx_ptr": f"*{dtype}",
                "idx_ptr": "*i8"}
    for channels in (36, 72):  # DARTS_V2 20 x 36's widths that are no multiples of 16 (its pools see 72 and 144)
        for stride in (1, 2):
            for pooled in (True, False):
                size = 32 // stride
                values = {"E": 1024 * 32 * 32 * channels, "H": 32, "W": 32, "OH": size, "OW": size, "C": channels,
                          "STRIDE": stride, "MAX": pooled, "BLOCK": kernels.BLOCK}
                for kernel in (kernels._pool_fwd_kernel, kernels._pool_bwd_kernel):
                    ptx = hopper_ptx(kernel, values, pointers)
                    # a pixel's 16-bit channels are read as vectors, not one element at a time (fp32's scalar loads
                    # would look like four int8 tap indices: compiled, not checked)
                    scalar = [a for a in vector_accesses_only(ptx) if a.startswith("ld.") and a.endswith(".b16")]
                    assert dtype == "fp32" or not scalar, (dtype, channels, stride, pooled, sorted(set(scalar)))
"""


def test_kernels_compile_for_a_hopper_gpu_with_vector_loads():
    """The interpreter runs Python, not Triton's compiler: compile both kernels for sm_90 in a process without
    TRITON_INTERPRET (no GPU needed), as a launch at DARTS's channel counts specializes them, and check that the
    inputs are read as vectors."""
    compile_for_hopper(COMPILE_FOR_HOPPER)
