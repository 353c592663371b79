"""Triton quantizer (under TRITON_INTERPRET=1 on CPU) against its torch reference, and the API."""
import pytest
import torch

from kernels.quantizer import quantize
from kernels.quantizer.reference import quantize_reference
from tests.kernels.helpers import compile_for_hopper

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# The interpreter rounds fp32 -> bf16 by truncation, the GPU to nearest: 1 bf16 ulp apart.
RTOL = {torch.float32: 0.0, torch.float16: 0.0, torch.bfloat16: 2**-7}
BOUNDS = [(0, 7), (-4, 3), (0, 1)]  # unsigned 8 levels, signed 8 levels, 2 levels
# odd sizes, one element, a partial forward block, and three backward blocks (on the CPU two programs: one walks two)
SHAPES = [(1,), (7, 13), (3, 5, 7, 2), (2, 3, 5, 7), (1031,), (3, 1367)]


def random_input(shape, dtype, theta, seed):
    """Random values with exact zeros and exact level boundaries (x/θ = k + 0.5) mixed in."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * 3 * theta
    halves = (torch.randint(-6, 9, shape, generator=gen) + 0.5) * theta
    pick = torch.randint(0, 4, shape, generator=gen)
    x = torch.where(pick == 0, halves, torch.where(pick == 1, torch.zeros(()), x))
    return x.to(dtype)


def both_backends(x, theta, neg_min, pos_max, grad):
    results = []
    for backend in ("torch", "triton"):
        xi, ti = x.clone().requires_grad_(), theta.clone().requires_grad_()
        y = quantize(xi, ti, neg_min, pos_max, 0.3, backend=backend)
        y.backward(grad)
        results.append((y.detach(), xi.grad, ti.grad))
    return results


@pytest.mark.parametrize("bounds", BOUNDS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_triton_equals_reference(shape, dtype, bounds):
    theta = torch.tensor(0.37)
    x = random_input(shape, dtype, 0.37, seed=len(shape) + bounds[0])
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    (y_ref, gx_ref, gt_ref), (y, gx, gt) = both_backends(x, theta, *bounds, grad)
    assert y.dtype == x.dtype and gx.dtype == x.dtype
    torch.testing.assert_close(y, y_ref, atol=0, rtol=RTOL[dtype])
    torch.testing.assert_close(gx, gx_ref, atol=0, rtol=0)
    torch.testing.assert_close(gt, gt_ref, atol=1e-4, rtol=1e-5)  # summed in another order
    # the reference itself: levels are integers in the bounds, and halves round up
    levels = quantize_reference(x, theta, *bounds).float() / 0.37
    assert levels.round().sub(levels).abs().max() < 0.02
    assert bounds[0] - 0.02 < levels.min() and levels.max() < bounds[1] + 0.02


def test_reference_matches_the_formula_in_float64():
    x = random_input((257,), torch.float64, 0.5, seed=3)
    y = quantize_reference(x, torch.tensor(0.5, dtype=torch.float64), 0, 7)
    expected = 0.5 * torch.clamp(torch.floor(x / 0.5 + 0.5), 0, 7)
    assert torch.equal(y, expected)
    assert torch.equal(quantize_reference(torch.tensor([0.25, -0.25, 3.75]), torch.tensor(0.5), -4, 3),
                       torch.tensor([0.5, 0.0, 1.5]))  # 0.5 rounds up, -0.5 up to 0, 7.5 clips to 3


@pytest.mark.parametrize("layout", ["channels_last", "transposed", "expanded_grad"])
def test_triton_layouts(layout):
    theta = torch.tensor(0.5)
    x = random_input((2, 3, 5, 7), torch.float32, 0.5, seed=7)
    grad = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(2))
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = x.transpose(1, 3)
        grad = grad.transpose(1, 3).contiguous()
    else:
        grad = torch.ones(()).expand(x.shape)
    (y_ref, gx_ref, gt_ref), (y, gx, gt) = both_backends(x, theta, 0, 7, grad)
    if layout == "channels_last":
        assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, y_ref, atol=0, rtol=0)
    torch.testing.assert_close(gx, gx_ref, atol=0, rtol=0)
    torch.testing.assert_close(gt, gt_ref, atol=1e-4, rtol=1e-5)


def test_fixed_theta_and_empty_input():
    x = random_input((4, 9), torch.float32, 1.0, seed=5).requires_grad_()
    theta = torch.tensor(1.0)  # no grad: the kernel writes no partials
    y = quantize(x, theta, 0, 7, backend="triton")
    y.backward(torch.ones_like(y))
    assert torch.equal(y, quantize_reference(x.detach(), theta, 0, 7))
    assert torch.equal(x.grad, ((x.detach() >= -0.5) & (x.detach() < 7.5)).float())
    empty = torch.empty(0, 3, requires_grad=True)
    out = quantize(empty, theta.clone().requires_grad_(), 0, 7, backend="triton")
    out.sum().backward()
    assert out.shape == (0, 3) and empty.grad.shape == (0, 3)


def test_bad_backend_and_dtype():
    x = torch.randn(3)
    with pytest.raises(ValueError, match="backend 'cuda'"):
        quantize(x, torch.tensor(1.0), 0, 7, backend="cuda")
    with pytest.raises(ValueError, match="float16/bfloat16/float32"):
        quantize(x.double(), torch.tensor(1.0), 0, 7, backend="triton")


COMPILE_FOR_HOPPER = """
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.quantizer import triton as kernels
target = GPUTarget("cuda", 90, 32)
fwd = kernels._quantize_fwd_kernel
signature = dict(zip(fwd.arg_names, ["*fp16", "*fp16", "*fp32", "i32"] + ["constexpr"] * 3))
constexprs = {"NEG_MIN": -8, "POS_MAX": 7, "BLOCK": kernels.BLOCK}
compile(ASTSource(fwd, signature, constexprs=constexprs), target=target)
bwd = kernels._quantize_bwd_kernel
pointers = ["*fp16", "*fp16", "*fp16", "*fp32", "*fp32", "*i32", "*fp32", "i32", "fp32"]
signature = dict(zip(bwd.arg_names, pointers + ["constexpr"] * 4))
for grad_theta in (True, False):
    constexprs = {"NEG_MIN": -8, "POS_MAX": 7, "GRAD_THETA": grad_theta, "BLOCK": kernels.BWD_BLOCK}
    compile(ASTSource(bwd, signature, constexprs=constexprs), target=target)
"""


def test_kernels_compile_for_a_hopper_gpu():
    """The interpreter runs Python, not Triton's compiler: compile both kernels (and the backward with and without
    θ's gradient) for sm_90 in a process without TRITON_INTERPRET, as a GPU would."""
    compile_for_hopper(COMPILE_FOR_HOPPER)
