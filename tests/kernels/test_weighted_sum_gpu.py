"""kernels.weighted_sum on a GPU against the float64 reference (``pytest -m gpu``), eager and captured."""
import pytest
import torch

from kernels.weighted_sum import weighted_sum, weighted_sum_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-2, 2e-2)}


def values_and_grads(fn, terms, weights, upstream):
    ts = [t.detach().clone().requires_grad_() for t in terms]
    w = weights.detach().clone().requires_grad_()
    out = fn(ts, w)
    return out.detach(), torch.autograd.grad(out, [*ts, w], upstream)


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("count", [2, 5, 10])
@pytest.mark.parametrize(("shape", "layout"), [((256, 16, 32, 32), torch.channels_last),
                                               ((3, 20, 6, 9), torch.contiguous_format)], ids=str)
def test_cuda_kernels_equal_the_float64_reference_twice_with_new_data(shape, layout, count, autocast):
    dtype = torch.bfloat16 if autocast else torch.float32
    for seed in (0, 1):  # the second call takes the kept launch (kernels/launch.py)
        generator = torch.Generator().manual_seed(seed)
        terms = [torch.randn(shape, generator=generator).to(dtype).contiguous(memory_format=layout).cuda()
                 for _ in range(count)]
        weights = (torch.rand(count, generator=generator) + 0.1).cuda()
        upstream = torch.randn(shape, generator=generator).to(dtype).contiguous(memory_format=layout).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            got, got_grads = values_and_grads(weighted_sum, terms, weights, upstream)
        want, want_grads = values_and_grads(weighted_sum_reference, [t.cpu().double() for t in terms],
                                            weights.cpu().double(), upstream.cpu().double())
        assert got.dtype == dtype and got.stride() == terms[0].stride()
        rtol, atol = TOLERANCE[dtype]
        torch.testing.assert_close(got.cpu().double(), want, rtol=rtol, atol=atol)
        for i, (g, w) in enumerate(zip(got_grads, want_grads)):
            scale = max(1.0, w.abs().max().item()) if i == count else 1.0  # the weights' dot products
            torch.testing.assert_close(g.cpu().double(), w, rtol=rtol, atol=atol * scale)


def test_a_captured_weighted_sum_equals_the_eager_one():
    generator = torch.Generator().manual_seed(2)
    terms = [torch.randn(64, 16, 8, 8, generator=generator).cuda().contiguous(memory_format=torch.channels_last)
             .requires_grad_() for _ in range(6)]
    weights = torch.rand(6, generator=generator).cuda().requires_grad_()
    upstream = torch.randn(64, 16, 8, 8, generator=generator).cuda().contiguous(memory_format=torch.channels_last)

    def step():
        out = weighted_sum(terms, weights)
        return (out.detach().clone(), *torch.autograd.grad(out, [*terms, weights], upstream))

    eager = step()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, eager):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
