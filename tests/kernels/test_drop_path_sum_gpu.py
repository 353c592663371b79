"""The drop-path node sum's kernels on a GPU: against the torch reference, and captured in a CUDA graph
(``pytest -m gpu``)."""
import pytest
import torch

from kernels.drop_path_sum import concat_node_sums, drop_path_sum
from tests.kernels.test_drop_path_sum import DTYPES, TOL, concatenated, node_parts, run, scales, terms

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("size", [(36, 31, 33), (36, 32, 32)], ids=["odd", "darts_32x32"])  # a sample per program
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("timesteps", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_equals_reference(dtype, timesteps, channels_last, size):
    shape = (96 * timesteps, *size)
    a, b = (t.cuda() for t in terms(shape, dtype, channels_last, seed=7))
    scale_a, scale_b = (s.cuda() for s in scales(96, "ab", seed=8))
    grad = torch.randn(shape, device="cuda").to(dtype)
    got = run("auto", a, b, scale_a, scale_b, timesteps, grad)
    again = run("auto", a, b, scale_a, scale_b, timesteps, grad)  # the kept launches, not Triton's run
    want = run("reference", a, b, scale_a, scale_b, timesteps, grad)
    rtol, atol = TOL[dtype]  # fp32: the GPU contracts a·s_a + b·s_b into an FMA (1 ulp from the reference)
    for g, repeated, w in zip(got, again, want):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
        assert torch.equal(repeated, g)


def test_graph_replay_equals_eager():
    a, b = (t.cuda() for t in terms((8, 16, 9, 9), torch.float16, True, seed=9))
    scale_a, scale_b = (s.cuda() for s in scales(8, "ab", seed=10))
    eager = drop_path_sum(a, b, scale_a, scale_b)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        drop_path_sum(a, b, scale_a, scale_b)  # the first launch compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = drop_path_sum(a, b, scale_a, scale_b)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def _on_cuda(parts):
    return [part.cuda() if isinstance(part, torch.Tensor) else tuple(None if t is None else t.cuda() for t in part)
            for part in parts]


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_node_sums_into_the_concatenation_on_cuda_equal_reference(dtype, channels_last):
    parts = _on_cuda(node_parts(dtype, 2, channels_last, seed=14))
    layout = torch.channels_last if channels_last else torch.contiguous_format
    upstream = torch.randn(4, 14, 3, 5, device="cuda").to(dtype).contiguous(memory_format=layout)
    (out, inputs), (want_out, want_inputs) = (concatenated(parts, 2, backend, upstream)
                                              for backend in ("auto", "reference"))
    assert type(out.grad_fn).__name__ == "_ConcatNodeSumsBackward"
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out, want_out, rtol=rtol, atol=atol)
    for got, want in zip(inputs, want_inputs):
        torch.testing.assert_close(got.grad, want.grad, rtol=rtol, atol=atol)


def test_concatenation_graph_replay_equals_eager():
    parts = _on_cuda(node_parts(torch.float16, 1, True, seed=15))
    eager = concat_node_sums(parts)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        concat_node_sums(parts)  # the first launch compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = concat_node_sums(parts)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
