"""The last program's sum of partials on a GPU (``pytest -m gpu``): many programs against float64, two streams at
once, CUDA-graph capture, and the ST-BIF threshold gradient as the sum of its own partials."""
import pytest
import torch

from kernels.partial_sums import _SCRATCH, partials_and_counter
from kernels.st_bif import st_bif_multistep
from kernels.st_bif.plan import bwd_config
from tests.kernels.test_partial_sums import _sum_kernel

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def cuda_sum(values: torch.Tensor) -> torch.Tensor:
    partials, counter = partials_and_counter(values.device, values.get_device(), values.numel())
    total = torch.full((), float("nan"), device="cuda")
    _sum_kernel[(values.numel(),)](values, partials, counter, total)
    return total


@pytest.mark.parametrize("num_programs", [1, 1025, 100_003])
def test_cuda_sum_matches_float64_and_repeats_bitwise(num_programs):
    values = torch.randn(num_programs, device="cuda")
    first = cuda_sum(values)
    torch.testing.assert_close(first.double(), values.double().sum(), rtol=1e-5, atol=1e-4)
    for _ in range(20):
        assert torch.equal(cuda_sum(values), first)
    assert all(counter.item() == 0 for _, counter in _SCRATCH.values())


def test_two_streams_at_once_keep_their_own_counters():
    values = [torch.randn(50_000, device="cuda") for _ in range(2)]
    expected = [cuda_sum(v).clone() for v in values]
    streams = [torch.cuda.Stream() for _ in values]
    results = [[], []]
    torch.cuda.synchronize()
    for _ in range(50):  # interleaved launches: both streams' kernels can run at the same time
        for i, stream in enumerate(streams):
            with torch.cuda.stream(stream):
                results[i].append(cuda_sum(values[i]))
    torch.cuda.synchronize()
    for i in range(2):
        assert all(torch.equal(r, expected[i]) for r in results[i])


def st_bif_grads(x, theta, grad):
    xi, ti = x.clone().requires_grad_(), theta.clone().requires_grad_()
    st_bif_multistep(xi, ti, 3, -4).backward(grad)
    return xi.grad, ti.grad


@pytest.mark.parametrize("theta_like", [torch.tensor(0.8), torch.tensor([0.8]), torch.tensor(0.8, dtype=torch.float64)],
                         ids=["0-dim", "[1]", "fp64"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_st_bif_threshold_grad_is_the_sum_of_its_partials(dtype, theta_like):
    """The gradient (its values: the CPU tests, against the reference) is the sum of the partials its programs
    left in the stream's scratch, in θ's shape and dtype, the same on every call."""
    x = (torch.randn(4, 64, 16, 32, 32, device="cuda") * 1.5).to(dtype)
    grad = torch.randn_like(x)
    theta = theta_like.cuda()
    _, grad_theta = st_bif_grads(x, theta, grad)
    torch.cuda.synchronize()
    partials, counter = _SCRATCH[0, torch.cuda.current_stream().cuda_stream]
    num_programs = -(-x[0].numel() // bwd_config(4).block)  # 2,048: two passes of the last program's loop
    assert grad_theta.shape == theta.shape and grad_theta.dtype == theta.dtype and counter.item() == 0
    torch.testing.assert_close(grad_theta.double().sum(), partials[:num_programs].double().sum(), rtol=1e-5, atol=0)
    for _ in range(5):
        assert torch.equal(st_bif_grads(x, theta, grad)[1], grad_theta)


def test_st_bif_backward_captured_in_a_cuda_graph_equals_eager():
    x = torch.randn(4, 8, 16, 9, 9, device="cuda", requires_grad=True)
    theta = torch.tensor(0.7, device="cuda", requires_grad=True)
    grad = torch.randn_like(x)

    def step():
        x.grad = theta.grad = None
        out = st_bif_multistep(x, theta, 3, -4)
        out.backward(grad)
        return out.detach()

    eager = step(), x.grad.clone(), theta.grad.clone()
    values = x.detach().clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.no_grad():
        x.copy_(torch.randn_like(x))  # capture on other values: the replay must read x
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        x.copy_(values)
    for _ in range(3):  # each replay zeroes its own counter first
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager[0]) and torch.equal(x.grad, eager[1])
        assert torch.equal(theta.grad, eager[2])
    step()  # eager again, after the captures, on the kept counter
    assert torch.equal(theta.grad, eager[2])
