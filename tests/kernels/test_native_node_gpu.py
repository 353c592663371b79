"""The C++ autograd node of the eager ST-BIF and QANN quantizer (kernels/native) on a GPU (``pytest -m gpu``):
bitwise the same output and gradients as the Python autograd.Function path, for every dtype, T = 1, odd sizes,
each surrogate, θ learnable or not, channels_last (quantizer); the Python path for what the node's kernels do
not fit (strided gradients, unaligned input, another θ dtype or shape); CUDA-graph capture; a side stream."""
import pytest
import torch

from kernels import native
from kernels.native.spec import NativeSpec
from kernels.quantizer import quantize
from kernels.st_bif import STBIFNeuron, st_bif_multistep
from kernels.st_bif.function import STBIFFunction
from kernels.st_bif.plan import get_plan
from search_space.neurons.st_bif_qann import QuantizedActivation

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BOUNDS = (3, -4)


@pytest.fixture(scope="module", autouse=True)
def built():
    assert native.wait() is not None, native.build_error()


def native_run(x, theta, surrogate="sigmoid"):
    """ST-BIF through the public API, run until its plan's C++ node has both backward variants: the calls that
    set the node up go through the Python path."""
    for _ in range(3):
        for learn in (True, False):
            xi, ti = x.detach().clone().requires_grad_(), theta.detach().clone().requires_grad_(learn)
            st_bif_multistep(xi, ti, *BOUNDS, surrogate=surrogate).backward(torch.randn_like(x))
    plan = get_plan(x, *BOUNDS, surrogate)
    assert isinstance(plan.native, NativeSpec) and all(plan.native.has_backward)
    out = st_bif_multistep(x, theta, *BOUNDS, surrogate=surrogate)
    return out


def python_run(x, theta, surrogate="sigmoid"):
    return STBIFFunction.apply(x, theta, get_plan(x, *BOUNDS, surrogate), None)


def grads(run, x, theta, grad_out, surrogate="sigmoid"):
    xi = x.detach().clone().requires_grad_()
    ti = theta.detach().clone().requires_grad_(theta.requires_grad)
    out = run(xi, ti, surrogate)
    out.backward(grad_out)
    return out, xi.grad, ti.grad


def assert_same(a, b):
    for left, right in zip(a, b):
        assert (left is None) == (right is None)
        if left is not None:
            assert left.dtype == right.dtype and left.shape == right.shape
            assert torch.equal(left, right)


@pytest.mark.parametrize("learn", [True, False], ids=["learn-theta", "fixed-theta"])
@pytest.mark.parametrize("surrogate", ["sigmoid", "atan", "rectangular"])
@pytest.mark.parametrize("shape", [(1, 3, 5, 7), (4, 2, 3, 5, 7), (9, 1000)], ids=["T1", "T4-odd", "T9"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_node_equals_python_path(dtype, shape, surrogate, learn):
    x = (torch.randn(shape, device="cuda") * 1.5).to(dtype)
    theta = torch.tensor(0.7, device="cuda", requires_grad=learn)
    grad_out = torch.randn(shape, device="cuda").to(dtype)
    native_run(x, theta.detach(), surrogate)
    out, gx, gt = grads(native_run, x, theta, grad_out, surrogate)
    assert "ThresholdNode" in out.grad_fn.name()
    assert_same((out, gx, gt), grads(python_run, x, theta, grad_out, surrogate))


def test_strided_gradient_goes_to_the_python_backward():
    x = torch.randn(4, 3, 33, device="cuda")
    theta = torch.tensor(0.9, device="cuda", requires_grad=True)
    native_run(x, theta.detach())
    xi, ti = x.clone().requires_grad_(), theta.detach().clone().requires_grad_()
    out = st_bif_multistep(xi, ti, *BOUNDS)
    assert "ThresholdNode" in out.grad_fn.name()
    (out * 2).sum().backward()  # grad_out: a constant expanded with stride 0
    xp, tp = x.clone().requires_grad_(), theta.detach().clone().requires_grad_()
    (python_run(xp, tp) * 2).sum().backward()
    assert torch.equal(xi.grad, xp.grad) and torch.equal(ti.grad, tp.grad)


def test_unaligned_input_and_other_theta_dtype_run_the_python_path():
    x = torch.randn(4, 5, 64, device="cuda")
    theta = torch.tensor(0.9, device="cuda")
    native_run(x, theta)
    storage = torch.randn(x.numel() + 1, device="cuda")
    unaligned = storage[1:].view(x.shape)  # 4-byte offset: another pointer specialization
    assert get_plan(unaligned, *BOUNDS) is get_plan(x, *BOUNDS)
    out = st_bif_multistep(unaligned.requires_grad_(False), theta, *BOUNDS)
    assert torch.equal(out, python_run(unaligned, theta))
    xi = x.clone().requires_grad_()
    out = st_bif_multistep(xi, theta.double(), *BOUNDS)
    assert "ThresholdNode" not in out.grad_fn.name()
    assert torch.equal(out, python_run(x, theta.double()))


def test_no_grad_forward_is_the_same():
    x = torch.randn(4, 7, 9, device="cuda")
    theta = torch.tensor(1.1, device="cuda")
    native_run(x, theta)
    with torch.no_grad():
        assert torch.equal(st_bif_multistep(x, theta, *BOUNDS), python_run(x, theta))


def test_captured_step_equals_eager():
    x = torch.randn(4, 8, 1000, device="cuda")
    theta = torch.tensor(0.8, device="cuda")
    grad_out = torch.randn_like(x)
    native_run(x, theta)

    def step(x, theta):
        out = st_bif_multistep(x, theta, *BOUNDS)
        return (out, *torch.autograd.grad(out, (x, theta), grad_out))

    # Leaves of their own: a leaf's first backward fixes the stream autograd syncs it on (here the
    # default stream, which a capture may not depend on).
    eager = [t.clone() for t in step(x.clone().requires_grad_(), theta.clone().requires_grad_())]
    xc, tc = x.clone().requires_grad_(), theta.clone().requires_grad_()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as torch.cuda.graph asks
        step(xc, tc)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(xc, tc)
    assert "ThresholdNode" in st_bif_multistep(xc, tc, *BOUNDS).grad_fn.name()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert_same(captured, eager)
    assert_same(step(xc, tc), eager)


def test_side_stream_matches_default_stream():
    x = torch.randn(4, 16, 4096, device="cuda")
    theta = torch.tensor(0.6, device="cuda", requires_grad=True)
    grad_out = torch.randn_like(x)
    expected = grads(native_run, x, theta, grad_out)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        results = [grads(lambda a, b, s: st_bif_multistep(a, b, *BOUNDS), x, theta, grad_out) for _ in range(5)]
    torch.cuda.synchronize()
    for result in results:
        assert_same(result, expected)


def test_neuron_module_keeps_its_node_and_checks_each_input():
    """STBIFNeuron calls its last node directly; inputs of another kind (shape, dtype, strides) go through the
    checks and plans again, and still match the reference; a non-tensor gets the checks' error."""
    neuron = STBIFNeuron(q_threshold=0.9, learn_threshold=True).cuda()
    x = torch.randn(4, 2, 3, 8, 8, device="cuda")
    for _ in range(3):
        neuron(x.clone().requires_grad_()).backward(torch.randn_like(x))
    assert neuron._native is not None
    for other in (x, x[:, :1].contiguous(), x.half(), x.transpose(-1, -2), x + 0):
        xi = other.clone().requires_grad_()
        out = neuron(xi)
        grad_out = torch.randn_like(out)
        out.backward(grad_out)
        xp, tp = other.clone().requires_grad_(), neuron.q_threshold.detach().clone().requires_grad_()
        expected = st_bif_multistep(xp, tp, neuron.pos_max, neuron.neg_min, backend="torch")
        expected.backward(grad_out)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(xi.grad, xp.grad)
    neuron.q_threshold.grad = None
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        neuron("not a tensor")


@pytest.mark.parametrize("learn", [True, False], ids=["learn-theta", "fixed-theta"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_quantizer_node_equals_python_path(dtype, layout, learn):
    neuron = QuantizedActivation(q_threshold=0.4, level=16, sym=False, learn_threshold=learn).cuda()
    x = (torch.randn(6, 5, 7, 9, device="cuda") * 2).to(dtype)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    grad_out = torch.randn_like(x)
    for _ in range(3):  # the calls that set the node up run the Python path
        neuron(x.clone().requires_grad_()).backward(grad_out)
    assert neuron._native is not None and neuron._native[1].has_backward[learn]
    theta = neuron.q_threshold
    scale = (x[0].numel() * neuron.pos_max) ** -0.5 if learn else 0.0
    results = []
    for run in (neuron, lambda h: quantize(h, theta, neuron.neg_min, neuron.pos_max, scale)):
        theta.grad = None
        xi = x.clone().requires_grad_()
        out = run(xi)
        out.backward(grad_out)
        results.append((out, xi.grad, None if theta.grad is None else theta.grad.clone()))
    assert "ThresholdNode" in results[0][0].grad_fn.name() and "ThresholdNode" not in results[1][0].grad_fn.name()
    assert results[0][0].stride() == x.stride() and results[0][1].stride() == x.stride()
    assert_same(results[0], results[1])


def test_quantizer_node_hands_other_inputs_and_gradients_to_the_python_path():
    neuron = QuantizedActivation(q_threshold=0.4, level=16, sym=False).cuda()
    x = torch.randn(4, 6, 5, 5, device="cuda")
    for _ in range(3):
        neuron(x.clone().requires_grad_()).backward(torch.randn_like(x))
    theta = neuron.q_threshold
    for other in (x, x[:2], x.half(), x.transpose(-1, -2)):
        xi, xp = other.clone().requires_grad_(), other.clone().requires_grad_()
        theta.grad = None
        (neuron(xi) * 3).sum().backward()  # the gradient: a constant expanded with stride 0
        grad_theta = theta.grad.clone()
        theta.grad = None
        other_scale = (other[0].numel() * neuron.pos_max) ** -0.5
        (quantize(xp, theta, neuron.neg_min, neuron.pos_max, other_scale) * 3).sum().backward()
        assert torch.equal(xi.grad, xp.grad) and torch.equal(grad_theta, theta.grad)
