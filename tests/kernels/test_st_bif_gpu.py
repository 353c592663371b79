"""The compiled ST-BIF kernels on a GPU against the torch reference on the same GPU (``pytest -m gpu``): the CPU
tests' shapes, dtypes and surrogates, then every neuron call of a spiking network on the inputs it really gets,
through the module's own path (the C++ node once built).

Why: the CPU suite runs these kernels under Triton's interpreter only; a multi-step spiking network trained on an
H200 ends epochs at losses its CPU runs never reach (RESULTS.md, #42), so the compiled kernels are checked too."""
import copy

import pytest
import torch

from kernels import native
from kernels.st_bif import SURROGATES, STBIFNeuron
from tests.aso_se.train.tiny_spiking_network import tiny_network
from tests.kernels.test_st_bif import DTYPES, GRAD_X_TOL, OUT_TOL, SHAPES, random_sequence, reference_and_triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("surrogate", sorted(SURROGATES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_compiled_kernels_match_reference(shape, dtype, surrogate):
    x_seq = random_sequence(shape, dtype, seed=len(shape) + len(surrogate)).cuda()
    grad_out = random_sequence(shape, dtype, seed=7).cuda()
    theta = torch.tensor(0.7, device="cuda")
    (ref_out, ref_gx, ref_gt), (out, gx, gt) = reference_and_triton(x_seq, theta, grad_out, surrogate)
    assert (ref_out != 0).any() and (ref_gx != 0).any()
    torch.testing.assert_close(out, ref_out, rtol=OUT_TOL[dtype], atol=0)
    torch.testing.assert_close(gx, ref_gx, rtol=GRAD_X_TOL[dtype], atol=GRAD_X_TOL[dtype])
    torch.testing.assert_close(gt, ref_gt, rtol=1e-4, atol=1e-5 * ref_gx.numel())


def neuron_inputs(network, images):
    """(neuron, its input) for every ST-BIF call of one training-mode forward of `network`."""
    calls = []
    hooks = [module.register_forward_pre_hook(lambda module, args: calls.append((module, args[0].detach().clone())))
             for module in network.modules() if isinstance(module, STBIFNeuron)]
    network.train()
    network(images)
    for hook in hooks:
        hook.remove()
    return calls


def module_run(neuron, x_seq, grad_out):
    x = x_seq.clone().requires_grad_()
    neuron.q_threshold.grad = None
    out = neuron(x)
    out.backward(grad_out)
    return out.detach(), x.grad, neuron.q_threshold.grad.clone()


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
def test_every_neuron_call_of_a_network_matches_reference(channels_last):
    """The tiny spiking DARTS_V2 (T = 2) of tiny_spiking_network.py on CUDA: each neuron's own forward
    and backward (three calls, so the C++ node, once built, runs the last) equal a copy's with backend "torch" on
    the same input and output gradient."""
    native.wait()
    layout = torch.channels_last if channels_last else torch.contiguous_format
    network = tiny_network().cuda().to(memory_format=layout)
    images = torch.randn(16, 1, 16, 16, generator=torch.Generator().manual_seed(4)).cuda()
    calls = neuron_inputs(network, images.contiguous(memory_format=layout))
    assert len(calls) > 10
    spikes = 0
    for index, (neuron, x_seq) in enumerate(calls):
        reference = copy.deepcopy(neuron)
        reference.backend = "torch"
        grad_out = torch.randn(x_seq.shape, generator=torch.Generator().manual_seed(index)).to(x_seq)
        for _ in range(3):
            got = module_run(neuron, x_seq, grad_out)
        want = module_run(reference, x_seq, grad_out)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, msg=lambda m: f"call {index}, output: {m}")
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5, msg=lambda m: f"call {index}, grad x: {m}")
        torch.testing.assert_close(got[2], want[2], rtol=1e-4, atol=1e-5 * x_seq.numel(),
                                   msg=lambda m: f"call {index}, grad θ: {m}")
        spikes += int((want[0] != 0).sum())
    assert spikes > 0
