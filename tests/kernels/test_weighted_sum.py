"""kernels.weighted_sum: the Triton kernels (CPU interpreter) equal the reference, values and every gradient."""
from __future__ import annotations

import pytest
import torch

from kernels.weighted_sum import MAX_TERMS, weighted_sum, weighted_sum_reference

TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-2, 2e-2), torch.float16: (1e-3, 2e-3)}


def make_terms(count: int, shape: tuple[int, ...], dtype: torch.dtype, layout=torch.contiguous_format, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    terms = [(torch.randn(shape, generator=generator) * 2 + 0.3).to(dtype) for _ in range(count)]
    if len(shape) == 4:
        terms = [t.contiguous(memory_format=layout) for t in terms]
    weights = torch.rand(count, generator=generator) + 0.1
    return terms, weights


def run(terms, weights, upstream, fn):
    ts = [t.detach().clone().requires_grad_() for t in terms]
    w = weights.detach().clone().requires_grad_()
    out = fn(ts, w)
    grads = torch.autograd.grad(out, [*ts, w], upstream)
    return out.detach(), grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("count", [2, 3, 7, MAX_TERMS])
@pytest.mark.parametrize(("shape", "layout"), [((3, 5, 7, 9), torch.contiguous_format),
                                               ((3, 5, 7, 9), torch.channels_last), ((2051,), None), ((1, 1), None)])
def test_kernels_equal_the_reference_values_and_gradients(dtype, count, shape, layout):
    terms, weights = make_terms(count, shape, dtype, layout or torch.contiguous_format)
    upstream = torch.randn(shape, generator=torch.Generator().manual_seed(9)).to(dtype)
    if layout is not None:
        upstream = upstream.contiguous(memory_format=layout)
    got, got_grads = run(terms, weights, upstream, lambda t, w: weighted_sum(t, w, backend="triton"))
    want, want_grads = run([t.double() for t in terms], weights.double(), upstream.double(),
                           weighted_sum_reference)
    assert got.dtype == dtype and got.stride() == terms[0].stride()
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        expected_dtype = torch.float32 if i == count else dtype
        assert g.dtype == expected_dtype and (i == count or g.stride() == terms[0].stride())
        # the weights' gradients are dot products over the whole tensor: scale the tolerance with it
        scale = max(1.0, w.abs().max().item()) if i == count else 1.0
        torch.testing.assert_close(g.double(), w, rtol=rtol, atol=atol * scale)


def test_a_gradient_in_another_layout_and_gradients_asked_for_only_in_part():
    terms, weights = make_terms(4, (2, 6, 5, 5), torch.float32, torch.channels_last, seed=3)
    upstream = torch.randn(2, 12, 5, 5, generator=torch.Generator().manual_seed(4))[:, 3:9]  # a slice: not dense
    ts = [t.clone() for t in terms]
    ts[2].requires_grad_()
    out = weighted_sum(ts, weights, backend="triton")  # a weight step: the edge weights carry no gradient
    (grad,) = torch.autograd.grad(out, ts[2], upstream)
    torch.testing.assert_close(grad, weights[2] * upstream, rtol=1e-6, atol=1e-6)
    alpha = weights.clone().requires_grad_()  # an α step: the weights' gradient alone
    out = weighted_sum(terms, alpha, backend="triton")
    (grad,) = torch.autograd.grad(out, alpha, upstream)
    torch.testing.assert_close(grad, torch.stack([(t * upstream).sum() for t in terms]), rtol=1e-5, atol=1e-4)


def test_torch_and_triton_backends_agree_and_auto_keeps_pytorch_on_cpu():
    terms, weights = make_terms(5, (4, 3, 6, 6), torch.float32, torch.channels_last, seed=5)
    upstream = torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(6))
    got, got_grads = run(terms, weights, upstream, lambda t, w: weighted_sum(t, w, backend="triton"))
    want, want_grads = run(terms, weights, upstream, lambda t, w: weighted_sum(t, w, backend="auto"))
    assert want.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-4)


def test_terms_the_kernels_cannot_take_are_refused_with_the_fix():
    terms, weights = make_terms(3, (2, 3, 4, 4), torch.float32)
    mixed = [terms[0], terms[1].contiguous(memory_format=torch.channels_last), terms[2]]
    with pytest.raises(ValueError, match="backend='torch'"):
        weighted_sum(mixed, weights, backend="triton")
    many, many_weights = make_terms(MAX_TERMS + 1, (3,), torch.float32)
    with pytest.raises(ValueError, match="backend='torch'"):
        weighted_sum(many, many_weights, backend="triton")
    torch.testing.assert_close(weighted_sum(many, many_weights), weighted_sum_reference(many, many_weights))
    with pytest.raises(ValueError, match="expected one of"):
        weighted_sum(terms, weights, backend="cuda")


def test_a_gradient_is_written_into_the_buffer_named_for_its_term_and_handed_back_as_it():
    terms, weights = make_terms(3, (2, 4, 5, 5), torch.float32, torch.channels_last, seed=7)
    upstream = torch.randn(2, 4, 5, 5, generator=torch.Generator().manual_seed(8))
    buffers = [torch.full_like(terms[0], float("nan")), None, torch.empty(2, 4, 5, 5)]  # the last: other strides
    ts = [t.clone().requires_grad_() for t in terms]
    out = weighted_sum(ts, weights, backend="triton", grad_buffers=buffers)
    grads = torch.autograd.grad(out, ts, upstream)
    assert grads[0].data_ptr() == buffers[0].data_ptr()
    assert grads[2].data_ptr() != buffers[2].data_ptr()  # ignored: not the term's layout
    for g, w in zip(grads, weights):
        torch.testing.assert_close(g, w * upstream, rtol=1e-6, atol=1e-6)


def test_the_sum_is_written_into_a_fitting_out_buffer_which_keeps_no_autograd_history():
    terms, weights = make_terms(4, (3, 2, 4, 4), torch.float32, torch.channels_last, seed=10)
    ts = [t.clone().requires_grad_() for t in terms]
    out = torch.empty_like(terms[0])
    got = weighted_sum(ts, weights, backend="triton", out=out)
    assert got.data_ptr() == out.data_ptr() and out.grad_fn is None and got.grad_fn is not None
    torch.testing.assert_close(got, weighted_sum_reference(terms, weights), rtol=1e-6, atol=1e-6)
    other = torch.empty(3, 2, 4, 4)  # another layout: ignored
    assert weighted_sum(ts, weights, backend="triton", out=other).data_ptr() != other.data_ptr()
