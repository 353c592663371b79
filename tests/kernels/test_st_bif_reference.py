"""The torch reference of ST-BIF is the ground truth: check it against spikingjelly and autograd."""
import functools

import pytest
import torch
from spikingjelly.activation_based.functional import stbif_multi_step

from kernels.st_bif.reference import SurrogateSpike, st_bif_loop, st_bif_reference
from kernels.st_bif.surrogates import SURROGATES

SYMMETRIC_8 = (3, -4)  # (pos_max, neg_min) of level 8, symmetric
UNSIGNED_4 = (3, 0)


def spikingjelly_stbif(x_seq, q_threshold, pos_max, neg_min):
    shape = x_seq.shape[1:]
    scalar = lambda v: torch.tensor(float(v))  # noqa: E731
    out, q, acc, _ = stbif_multi_step(
        x_seq,
        torch.full(shape, 0.5),
        torch.zeros(shape),
        scalar(q_threshold),
        scalar(pos_max),
        scalar(neg_min),
    )
    return out, q, acc


@pytest.mark.parametrize("bounds", [SYMMETRIC_8, UNSIGNED_4, (1, -1)])
@pytest.mark.parametrize("shape", [(1, 7, 13), (4, 3, 5, 7), (9, 2, 3, 5, 7)])
def test_forward_equals_spikingjelly(shape, bounds):
    gen = torch.Generator().manual_seed(len(shape) * 31 + bounds[0])
    x_seq = torch.randn(shape, generator=gen) * 1.5
    theta = 0.37
    out, q, acc = st_bif_reference(x_seq, torch.tensor(theta), *bounds, SURROGATES["sigmoid"])
    sj_out, sj_q, sj_acc = spikingjelly_stbif(x_seq, theta, *bounds)
    assert torch.equal(out, sj_out)
    assert torch.equal(q, sj_q)
    assert torch.equal(acc, sj_acc)
    assert (out != 0).any(), "no spikes: the comparison would prove nothing"


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_bounds_stop_the_counter(sign):
    """A long drive of one sign fires until the counter reaches its bound, then stays silent."""
    pos_max, neg_min = SYMMETRIC_8
    gen = torch.Generator().manual_seed(3)
    x_seq = sign * (0.8 + torch.rand(16, 5, 3, generator=gen))  # ≥ 0.8θ every step
    out, q, acc = st_bif_reference(x_seq, torch.tensor(1.0), pos_max, neg_min, SURROGATES["atan"])
    bound = pos_max if sign > 0 else neg_min
    assert torch.equal(acc, torch.full_like(acc, bound))
    assert torch.equal(out.sum(0), torch.full_like(acc, float(bound)))
    sj_out, sj_q, sj_acc = spikingjelly_stbif(x_seq, 1.0, pos_max, neg_min)
    assert torch.equal(out, sj_out) and torch.equal(q, sj_q) and torch.equal(acc, sj_acc)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_keeps_fp32_state(dtype):
    gen = torch.Generator().manual_seed(5)
    x32 = torch.randn(6, 4, 9, generator=gen).to(dtype).float()
    out, q, acc = st_bif_reference(x32.to(dtype), torch.tensor(0.6), 3, -4, SURROGATES["sigmoid"])
    out32, q32, acc32 = st_bif_reference(x32, torch.tensor(0.6), 3, -4, SURROGATES["sigmoid"])
    assert out.dtype == dtype and q.dtype == torch.float32 and acc.dtype == torch.float32
    assert torch.equal(q, q32) and torch.equal(acc, acc32)
    assert torch.equal(out, out32.to(dtype))


@pytest.mark.parametrize("name", sorted(SURROGATES))
def test_surrogate_derivative_is_the_derivative_of_its_primitive(name):
    surrogate = SURROGATES[name]
    z = torch.linspace(-2.0, 2.0, 401, dtype=torch.float64)
    # Keep away from the rectangular box's edges, where the primitive has kinks.
    z = z[((z.abs() - surrogate.alpha / 2).abs() > 1e-3)].requires_grad_()
    (autograd_derivative,) = torch.autograd.grad(surrogate.primitive(z, surrogate.alpha).sum(), z)
    derivative = surrogate.derivative(z.detach(), surrogate.alpha)
    torch.testing.assert_close(derivative, autograd_derivative)


@pytest.mark.parametrize("name", sorted(SURROGATES))
def test_spike_backward_uses_the_surrogate(name):
    """SurrogateSpike's gradient equals autograd through the soft spike rule at the same u."""
    surrogate = SURROGATES[name]
    gen = torch.Generator().manual_seed(11)
    u = (torch.randn(64, generator=gen, dtype=torch.float64) + 0.5).requires_grad_()
    can_pos = (torch.rand(64, generator=gen) > 0.3).double()
    can_neg = (torch.rand(64, generator=gen) > 0.3).double()
    grad_s = torch.randn(64, generator=gen, dtype=torch.float64)
    s = SurrogateSpike.apply(u, can_pos, can_neg, surrogate)
    assert set(s.tolist()) <= {-1.0, 0.0, 1.0}
    (grad_hard,) = torch.autograd.grad(s, u, grad_s)
    soft = soft_spike_rule(surrogate)(u, can_pos, can_neg)
    (grad_soft,) = torch.autograd.grad(soft, u, grad_s)
    torch.testing.assert_close(grad_hard, grad_soft)


def soft_spike_rule(surrogate):
    """The spike with each step replaced by the surrogate's primitive: smooth, for gradcheck."""

    def fire(u, can_pos, can_neg):
        soft_step = functools.partial(surrogate.primitive, alpha=surrogate.alpha)
        return soft_step(u - 1) * can_pos - soft_step(-u) * can_neg

    return fire


@pytest.mark.parametrize("name", ["sigmoid", "atan"])
def test_bptt_of_the_loop_passes_gradcheck(name):
    """float64 gradcheck of the loop (carry of q, gates, out = s·θ, u = q + x/θ) in x and θ.

    With the soft spike rule the loop is smooth, so finite differences see every path that
    the surrogate backward takes; together with the test above this checks design §3's BPTT.
    """
    fire = soft_spike_rule(SURROGATES[name])
    gen = torch.Generator().manual_seed(7)
    x_seq = (torch.randn(5, 3, 4, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    theta = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)

    def run(x_seq, theta):
        out, q, _ = st_bif_loop(x_seq, theta, 1, -2, fire)
        return out, q

    assert torch.autograd.gradcheck(run, (x_seq, theta))
