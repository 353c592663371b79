"""Triton ST-BIF (under TRITON_INTERPRET=1 on CPU) against the torch reference, and the API."""
import pytest
import torch
from spikingjelly.activation_based import functional as sj_functional
from torch import nn

from kernels.st_bif import SURROGATES, STBIFNeuron, level_bounds, st_bif_multistep
from kernels.st_bif.plan import st_bif_fwd
from kernels.st_bif.reference import st_bif_reference

POS_MAX, NEG_MIN = 3, -4
# T = 1; odd/prime sizes; 4-D and 5-D; T > the kernels' chunk of 8 steps (two-pass backward).
SHAPES = [(1, 7, 13), (4, 3, 5, 7), (3, 2, 3, 5, 7), (11, 2, 37), (16, 3, 11)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# The interpreter rounds fp32 -> bf16 by truncation, the GPU to nearest: 1 bf16 ulp apart.
OUT_TOL = {torch.float32: 0.0, torch.float16: 0.0, torch.bfloat16: 2**-7}
GRAD_X_TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 2**-7}


def random_sequence(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * 1.5).to(dtype)


def reference_and_triton(x_seq, theta, grad_out, surrogate):
    """(out, grad_x, grad_θ) of the torch and the Triton backends, under the same grad_out."""
    results = []
    for backend in ("torch", "triton"):
        x = x_seq.clone().requires_grad_()
        q_threshold = theta.clone().requires_grad_()
        out = st_bif_multistep(
            x, q_threshold, POS_MAX, NEG_MIN, surrogate=surrogate, backend=backend
        )
        out.backward(grad_out)
        results.append((out.detach(), x.grad, q_threshold.grad))
    return results


@pytest.mark.parametrize("surrogate", sorted(SURROGATES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_triton_matches_reference(shape, dtype, surrogate):
    seed = 100 * SHAPES.index(shape) + 10 * DTYPES.index(dtype) + len(surrogate)
    x_seq = random_sequence(shape, dtype, seed)
    grad_out = random_sequence(shape, dtype, seed + 1)
    theta = torch.tensor(0.7)
    results = reference_and_triton(x_seq, theta, grad_out, surrogate)
    (ref_out, ref_gx, ref_gt), (out, gx, gt) = results

    assert out.dtype == dtype and gx.dtype == dtype and out.shape == x_seq.shape
    assert (ref_out != 0).any() and (ref_gx != 0).any()
    torch.testing.assert_close(out, ref_out, rtol=OUT_TOL[dtype], atol=0)
    tol = GRAD_X_TOL[dtype]
    torch.testing.assert_close(gx, ref_gx, rtol=tol, atol=tol)
    # fp32 sums over all neurons in different orders: relative to the sum of magnitudes.
    torch.testing.assert_close(gt, ref_gt, rtol=1e-4, atol=1e-5 * ref_gx.numel())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_triton_final_states_match_reference(shape, dtype):
    x_seq = random_sequence(shape, dtype, seed=len(shape))
    theta = torch.tensor(0.55)
    out, q, acc = st_bif_fwd(x_seq, theta, POS_MAX, NEG_MIN, with_state=True)
    _, ref_q, ref_acc = st_bif_reference(x_seq, theta, POS_MAX, NEG_MIN, SURROGATES["sigmoid"])
    assert q.dtype == torch.float32 and acc.dtype == torch.float32
    assert torch.equal(q, ref_q)
    assert torch.equal(acc, ref_acc)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # 0 / 0 and inf - inf, on purpose
@pytest.mark.parametrize("theta", [0.7, 0.0, float("inf")])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zero_drive_matches_reference(dtype, theta):
    """Exact zeros (and -0.0) in the drive skip the division in the kernel (its slow path): the
    result must still be x / θ's, also where θ makes 0 / θ NaN."""
    gen = torch.Generator().manual_seed(3)
    x_seq = torch.randn((5, 3, 41), generator=gen) * 1.5
    x_seq[torch.rand(x_seq.shape, generator=gen) < 0.6] = 0.0
    x_seq[:, 0, :7] = -0.0
    x_seq = x_seq.to(dtype)
    out, q, acc = st_bif_fwd(x_seq, torch.tensor(theta), POS_MAX, NEG_MIN, with_state=True)
    ref_out, ref_q, ref_acc = st_bif_reference(x_seq, torch.tensor(theta), POS_MAX, NEG_MIN, SURROGATES["sigmoid"])
    assert (x_seq == 0).float().mean() > 0.5
    for got, want in ((out, ref_out), (q, ref_q), (acc, ref_acc)):
        torch.testing.assert_close(got, want, rtol=OUT_TOL[dtype], atol=0, equal_nan=True)
    if theta == 0.7:
        assert (ref_out != 0).any()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_triton_bounds_are_hit(sign):
    gen = torch.Generator().manual_seed(9)
    x_seq = sign * (0.8 + torch.rand(19, 4, 5, generator=gen))
    theta = torch.tensor(1.0)
    out, q, acc = st_bif_fwd(x_seq, theta, POS_MAX, NEG_MIN, with_state=True)
    bound = POS_MAX if sign > 0 else NEG_MIN
    assert torch.equal(acc, torch.full_like(acc, bound))
    ref_out, ref_q, _ = st_bif_reference(x_seq, theta, POS_MAX, NEG_MIN, SURROGATES["sigmoid"])
    assert torch.equal(out, ref_out) and torch.equal(q, ref_q)
    grad_out = random_sequence(x_seq.shape, torch.float32, seed=10)
    (_, ref_gx, ref_gt), (_, gx, gt) = reference_and_triton(x_seq, theta, grad_out, "rectangular")
    torch.testing.assert_close(gx, ref_gx)
    torch.testing.assert_close(gt, ref_gt, rtol=1e-4, atol=1e-3)


def test_strided_input_and_stride_zero_grad():
    """A transposed input and the stride-0 gradient of .sum() (design §7)."""
    base = random_sequence((6, 7, 5), torch.float32, seed=12)
    grads = []
    for backend in ("torch", "triton"):
        x = base.clone().requires_grad_()
        x_view = x.transpose(1, 2)  # [T, 5, 7], not contiguous
        st_bif_multistep(x_view, 0.45, POS_MAX, NEG_MIN, backend=backend).sum().backward()
        grads.append(x.grad)
    assert (grads[0] != 0).any()
    torch.testing.assert_close(grads[1], grads[0])


def test_threshold_only_gradient():
    """x without grad, θ with grad: the kernel still returns the right θ gradient."""
    x_seq = random_sequence((5, 3, 8), torch.float32, seed=13)
    grads = []
    for backend in ("torch", "triton"):
        theta = torch.tensor(0.9, requires_grad=True)
        (st_bif_multistep(x_seq, theta, POS_MAX, NEG_MIN, backend=backend) ** 2).sum().backward()
        grads.append(theta.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-5)


def test_compiles_fullgraph_forward_and_backward():
    """Dynamo + AOTAutograd trace both custom ops (fake kernels) without a graph break."""
    neuron = STBIFNeuron(q_threshold=0.6, learn_threshold=True, backend="triton")
    compiled = torch.compile(neuron, backend="aot_eager", fullgraph=True)
    x_seq = random_sequence((4, 2, 3, 5), torch.float32, seed=14)
    grad_out = random_sequence((4, 2, 3, 5), torch.float32, seed=15)
    results = []
    for module in (neuron, compiled):
        x = x_seq.clone().requires_grad_()
        module.q_threshold.grad = None
        out = module(x)
        out.backward(grad_out)
        results.append((out, x.grad, module.q_threshold.grad.clone()))
    for eager, traced in zip(*results):
        torch.testing.assert_close(traced, eager)


def test_neuron_module():
    learnable = STBIFNeuron(q_threshold=0.5, level=16, learn_threshold=True, surrogate="atan")
    fixed = STBIFNeuron(q_threshold=0.5, level=4, sym=False)
    assert (learnable.pos_max, learnable.neg_min) == (7, -8)
    assert (fixed.pos_max, fixed.neg_min) == level_bounds(4, sym=False) == (3, 0)
    assert isinstance(learnable.q_threshold, nn.Parameter)
    assert "q_threshold" in fixed.state_dict() and not list(fixed.parameters())

    x_seq = random_sequence((4, 2, 3, 5, 5), torch.float32, seed=16)
    out = learnable(x_seq)
    expected = st_bif_multistep(x_seq, 0.5, 7, -8, surrogate="atan", backend="torch")
    assert torch.equal(out, expected)
    out.sum().backward()
    assert learnable.q_threshold.grad is not None and learnable.q_threshold.grad != 0
    released = fixed(x_seq).cumsum(0) / 0.5  # unsigned: the counter stays in [0, 3]
    assert released.min() == 0 and released.max() == 3


def test_reset_net_finds_nothing_to_reset():
    """Stateless between calls: reset_net runs over a net holding it, outputs don't change."""
    net = nn.Sequential(nn.Flatten(2), STBIFNeuron(q_threshold=0.3))
    x_seq = random_sequence((4, 2, 3, 3), torch.float32, seed=17)
    first = net(x_seq)
    assert not hasattr(net[1], "reset")
    sj_functional.reset_net(net)
    assert torch.equal(net(x_seq), first)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x: st_bif_multistep(x[:0], 1.0, 3, -4), "T >= 1"),
        (lambda x: st_bif_multistep(x, 1.0, -4, 3), "neg_min < pos_max"),
        (lambda x: st_bif_multistep(x, 1.0, 2, 2), "neg_min < pos_max"),
        (lambda x: st_bif_multistep(x.int(), 1.0, 3, -4), "floating dtype"),
        (lambda x: st_bif_multistep(x, 0.0, 3, -4), "must be > 0"),
        (lambda x: st_bif_multistep(x, -1.0, 3, -4), "must be > 0"),
        (lambda x: st_bif_multistep(x, torch.ones(2), 3, -4), "one-element"),
        (lambda x: st_bif_multistep(x, torch.tensor(1.0, device="meta"), 3, -4), "same device"),
        (lambda x: st_bif_multistep(x, 1.0, 3, -4, surrogate="relu"), "unknown surrogate"),
        (lambda x: st_bif_multistep(x, 1.0, 3, -4, backend="cuda"), "unknown backend"),
        (lambda x: st_bif_multistep(x.double(), 1.0, 3, -4, backend="triton"), "float64"),
        (lambda x: STBIFNeuron(level=1), "level=1"),
        (lambda x: STBIFNeuron(q_threshold=0.0), "must be > 0"),
        (lambda x: STBIFNeuron(surrogate="gauss"), "unknown surrogate"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    x_seq = random_sequence((3, 2, 4), torch.float32, seed=18)
    with pytest.raises(ValueError, match=match):
        call(x_seq)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 2, 3, 9, 17), (11, 2, 5, 8, 8), (3, 1, 2, 20, 6), (2, 3, 5, 16, 16), (1, 2, 3, 32, 32),
                                   (2, 1, 2, 64, 64), (2, 2, 3, 24, 32), (2, 2, 3, 20, 24)])
def test_block_map_is_the_prescan_of_the_output(shape, dtype):
    """The map the forward kernel writes equals the sparse conv's prescan of its output, and its
    plane flags mark the planes with a spike: odd sizes (partial 8x8 blocks), T = 1 and T > 8,
    silent planes, a partial last program (16x16), and the same spikes as without it. The shapes
    take each way the kernel ORs spikes before it stores: per neuron (9x17), per run of 8 (20x24),
    per block of whole 8-row bands (8x8, 16x16, 32x32, 64x64, 24x32); plane flags per program
    (32x32, 64x64: several programs per plane), per plane (8x8, 16x16), per map lane (24x32)."""
    from kernels.sparse_conv.prescan import block_activity
    from kernels.st_bif import st_bif_multistep_with_block_map

    x_seq = random_sequence(shape, dtype, seed=sum(shape))
    x_seq[:, :, 0] = 0  # channel 0 never fires (its membrane stays at 0.5)
    out, (blocks, planes) = st_bif_multistep_with_block_map(x_seq, 0.8, POS_MAX, NEG_MIN, backend="triton")
    expected = st_bif_multistep(x_seq, 0.8, POS_MAX, NEG_MIN, backend="triton")
    assert torch.equal(out, expected)
    flat = out.flatten(0, 1)
    assert torch.equal(blocks, block_activity(flat))
    assert blocks[..., 0].eq(0).all() and blocks.any()
    assert planes.dtype == torch.int8 and torch.equal(planes, flat.ne(0).flatten(2).any(2).to(torch.int8))
    assert planes[:, 0].eq(0).all() and planes.any()


def test_block_map_only_where_the_triton_kernel_writes_it():
    from kernels.st_bif import st_bif_multistep_with_block_map

    x_seq = random_sequence((2, 2, 3, 4, 4), torch.float32, seed=1)
    assert st_bif_multistep_with_block_map(x_seq, 1.0, POS_MAX, NEG_MIN, backend="torch")[1] is None
    out, block_map = st_bif_multistep_with_block_map(x_seq[:, :, 0], 1.0, POS_MAX, NEG_MIN, backend="triton")
    assert block_map is None and out.shape == (2, 2, 4, 4)
