"""The trainable SNN of a QANN (spike-domain fine-tuning): the same function as the QANN before training, BPTT
through the Triton neuron equal to BPTT through the torch reference neuron, and accuracy read after each step."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from search_space.errors import UserInputError
from search_space.genotypes import GENOTYPES
from search_space.neurons import SpikingNeuron
from search_space.qann import REPORTED_TIMESTEPS, convert_to_snn, set_timesteps
from search_space.trainable_snn import (
    accuracy_against_timesteps,
    trainable_snn,
    with_early_readout,
    with_neuron_backend,
)
from tests.search_space.test_qann import ALL_OPS, qann_network

DARTS_V2 = GENOTYPES["DARTS_V2"]
DARTS_V2_SPIKE_NATIVE = GENOTYPES["DARTS_V2_SPIKE_NATIVE"]


def _with_auxiliary_and_stem_stats(network: nn.Module) -> nn.Module:
    """Random statistics in the stem's batch norm too (folded into its conv by trainable_snn)."""
    norm = network.stem[1]
    norm.running_mean.uniform_(-0.5, 0.5)
    norm.running_var.uniform_(0.5, 2.0)
    norm.weight.data.uniform_(0.5, 1.5)
    norm.bias.data.uniform_(-0.3, 0.3)
    return network


@pytest.mark.parametrize("genotype,level,sym", [(DARTS_V2, 4, False), (ALL_OPS, 4, False), (DARTS_V2, 3, True),
                                                (DARTS_V2_SPIKE_NATIVE, 4, False)],
                         ids=["darts_v2_l4", "all_ops_l4", "darts_v2_l3_sym", "spike_native_l4"])
def test_before_training_it_is_the_exact_snn_of_the_qann_in_fp64(genotype, level: int, sym: bool) -> None:
    """Its batch norms folded and every buffer a parameter, it still sums to the QANN's logits at silence, as the
    converted SNN does, and every step agrees with the converted SNN's."""
    qann = _with_auxiliary_and_stem_stats(qann_network(genotype, seed=5, level=level, sym=sym)).double()
    x = torch.randn(5, 2, 12, 12, dtype=torch.float64)
    snn = trainable_snn(qann, 96)
    assert snn.training and all(p.requires_grad for p in snn.parameters())
    thresholds = [m.neuron.q_threshold for m in snn.modules() if isinstance(m, SpikingNeuron)]
    assert thresholds and all(isinstance(t, nn.Parameter) for t in thresholds)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in snn.modules())
    logits, aux = snn(x)
    assert aux is None
    torch.testing.assert_close(logits, qann.eval()(x)[0], rtol=0, atol=1e-9)
    assert logits.std() > 1e-3
    converted = convert_to_snn(qann, 7)
    short = set_timesteps(snn, 7)
    torch.testing.assert_close(short(x)[0], converted(x)[0], rtol=0, atol=1e-9)


def loss_and_grads(snn: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict]:
    snn.zero_grad(set_to_none=True)
    logits, _ = snn(x)
    loss = nn.functional.cross_entropy(logits, labels)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in snn.named_parameters()}


@pytest.mark.parametrize("timesteps", [1, 4])
@pytest.mark.parametrize("surrogate", ["sigmoid", "rectangular"])
def test_bptt_through_the_triton_neuron_equals_bptt_through_the_reference(timesteps: int, surrogate: str) -> None:
    """The fine-tuning step's loss and every gradient (weights, thresholds, folded norms, biases) with the fused
    multi-step kernel (Triton, here under its interpreter) equal those with the torch reference neuron."""
    qann = _with_auxiliary_and_stem_stats(qann_network(DARTS_V2, seed=7, level=4, sym=False, layers=3))
    snn = trainable_snn(qann, timesteps, surrogate)
    x, labels = torch.randn(3, 2, 12, 12), torch.tensor([0, 3, 1])
    (ref_loss, ref_grads), (loss, grads) = (loss_and_grads(with_neuron_backend(snn, backend), x, labels)
                                            for backend in ("torch", "triton"))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    assert ref_grads.keys() == grads.keys()
    nonzero = [name for name, grad in ref_grads.items() if grad.abs().max() > 0]
    assert any("q_threshold" in name for name in nonzero) and any("shift" in name for name in nonzero)
    assert "stem.stem.0.weight" in nonzero  # the gradient reaches the first layer through every neuron
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_training_step_changes_the_answer_at_t() -> None:
    """Weights, thresholds and folded norms all move under SGD: fine-tuning is not a no-op."""
    qann = qann_network(DARTS_V2, seed=8, level=4, sym=False)
    snn = trainable_snn(qann, 2)
    before = copy.deepcopy(snn.state_dict())
    optimizer = torch.optim.SGD(snn.parameters(), lr=0.5)
    loss_and_grads(snn, torch.randn(4, 2, 12, 12), torch.tensor([0, 1, 2, 3]))
    optimizer.step()
    moved = {name for name, value in snn.state_dict().items() if not torch.equal(value, before[name])}
    assert any("q_threshold" in name for name in moved) and any(".scale" in name for name in moved)
    assert "classifier.linear.weight" in moved and "stem.stem.0.bias" in moved


def test_accuracy_after_each_step_equals_a_run_of_that_many_steps() -> None:
    """One run at the largest T reads the accuracy after every reported step (the network is causal); each equals
    a separate run of that many steps. The network's own T is left as it was."""
    torch.manual_seed(0)
    qann = qann_network(DARTS_V2, seed=9, level=4, sym=False).double()
    snn = trainable_snn(qann, 4)
    x = torch.randn(16, 2, 12, 12, dtype=torch.float64)
    logits = qann.eval()(x)[0]
    labels = logits.argmax(1)  # the QANN's answers: the SNN reaches them once silent
    labels[::3] = (labels[::3] + 1) % 5
    result = accuracy_against_timesteps(snn, [(x[:7], labels[:7]), (x[7:], labels[7:])], device="cpu",
                                        timesteps=[*REPORTED_TIMESTEPS, 64])
    assert snn.stem.timesteps == 4 and snn.training
    assert list(result.accuracy_at) == [*REPORTED_TIMESTEPS, 64]
    for steps in REPORTED_TIMESTEPS:
        with torch.no_grad():
            alone = set_timesteps(copy.deepcopy(snn).eval(), steps)(x)[0]
        assert result.accuracy_at[steps] == (alone.argmax(1) == labels).double().mean().item(), steps
    assert result.silent and result.timesteps_to_silence < 64
    assert result.accuracy_at[64] == (logits.argmax(1) == labels).double().mean().item()
    assert len(set(result.accuracy_at.values())) > 1  # the answer changes over the steps
    with pytest.raises(UserInputError, match="positive integers"):
        accuracy_against_timesteps(snn, [(x, labels)], device="cpu", timesteps=[0, 4])


@pytest.mark.parametrize("genotype", ["DARTS_V2", "DARTS_V2_SPIKE_NATIVE"])
def test_under_autocast_every_neuron_reads_the_half_precision_it_is_given(genotype: str) -> None:
    """The folded batch norms' fp32 scale and shift take the dtype of what they scale: under autocast the neurons
    read half-precision inputs (half the bytes of the BPTT's largest tensors), not fp32 promoted by a parameter."""
    snn = trainable_snn(qann_network(GENOTYPES[genotype], seed=0, level=4, sym=False), timesteps=2)
    seen: list[torch.dtype] = []
    for module in snn.modules():
        if isinstance(module, SpikingNeuron):
            module.register_forward_pre_hook(lambda _, args: seen.append(args[0].dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = snn(torch.randn(3, 2, 12, 12))
    logits = logits[0] if isinstance(logits, tuple) else logits
    assert len(seen) > 10 and set(seen) == {torch.bfloat16}
    logits.float().sum().backward()
    assert all(p.grad is None or (p.grad.dtype == p.dtype and torch.isfinite(p.grad).all()) for p in snn.parameters())


def test_the_early_readout_is_the_answer_of_the_first_steps_and_trains_them() -> None:
    """with_early_readout: in training the second output is the SNN's answer after ``early`` steps (equal to a run of
    that many steps, in fp64); its loss reaches the weights; in evaluation the output is the plain SNN's."""
    qann = qann_network(DARTS_V2, seed=3, level=4, sym=False).double()
    x = torch.randn(4, 2, 12, 12, dtype=torch.float64)
    snn = with_early_readout(trainable_snn(qann, 6), 2)
    logits, early = snn(x)
    torch.testing.assert_close(logits, trainable_snn(qann, 6)(x)[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(early, trainable_snn(qann, 2)(x)[0], rtol=0, atol=1e-12)
    assert not torch.allclose(early, logits)
    nn.functional.cross_entropy(early, torch.tensor([0, 1, 2, 3])).backward()
    assert snn.classifier.linear.weight.grad.abs().sum() > 0 and snn.stem.stem[0].weight.grad.abs().sum() > 0
    assert snn.eval()(x)[1] is None
    for bad in (0, 6, 2.0, True):
        with pytest.raises(UserInputError, match="snn_finetune.early_timesteps=.* must be an integer from 1 to"):
            with_early_readout(trainable_snn(qann, 6), bad)


@pytest.mark.parametrize("timesteps", [1, 3])
def test_the_first_step_shift_and_bias_equal_their_formulas_with_every_gradient(timesteps: int) -> None:
    """The folded batch norm (x·scale, + shift at t = 0) and the conv whose bias enters at t = 0, added in place to
    the first step: outputs and the gradients of input, scale, shift, weight and bias against the out-of-place
    formulas in float64 (odd sizes)."""
    from search_space.qann import _BiasAtFirstStep, _ShiftAtFirstStep
    torch.manual_seed(0)
    batch, channels = 3, 5
    norm = nn.BatchNorm2d(channels).double().eval()
    norm.running_mean.uniform_(-1, 1), norm.running_var.uniform_(0.5, 2), norm.weight.data.uniform_(0.5, 2)
    norm.bias.data.uniform_(-1, 1)
    conv = nn.Conv2d(channels, 7, 3, padding=1).double()
    shifted, biased = _ShiftAtFirstStep(norm, timesteps), _BiasAtFirstStep(conv, timesteps)
    for module, names in ((shifted, ("scale", "shift")), (biased, ("bias",))):
        for name in names:
            value = module._buffers.pop(name)
            setattr(module, name, nn.Parameter(value.clone()))
    x = torch.randn(timesteps * batch, channels, 5, 3, dtype=torch.float64, requires_grad=True)
    first = (torch.arange(timesteps) == 0).double().repeat_interleave(batch).view(-1, 1, 1, 1)

    def formula_shift(x):
        return x * shifted.scale.view(1, -1, 1, 1) + first * shifted.shift.view(1, -1, 1, 1)

    def formula_bias(x):
        return biased.layer(x) + first * biased.bias.view(1, -1, 1, 1)

    for module, formula in ((shifted, formula_shift), (biased, formula_bias)):
        params = [x, *module.parameters()]
        weights = torch.randn_like(formula(x))
        got = torch.autograd.grad((module(x) * weights).sum(), params)
        want = torch.autograd.grad((formula(x) * weights).sum(), params)
        torch.testing.assert_close(module(x), formula(x), rtol=0, atol=1e-12)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def _separate_name(folded_name: str, folded: nn.Module) -> str:
    """The unfolded trainable SNN's name for a parameter of the folded one: a conv's ``weight`` for its parametrized
    original, the batch-norm map's ``scale`` after that conv for the parametrization's scale."""
    if ".parametrizations.weight.original" in folded_name:
        return folded_name.replace(".parametrizations.weight.original", ".weight")
    if ".parametrizations.weight.0.scale" in folded_name:
        conv = folded_name.replace(".parametrizations.weight.0.scale", "")
        parent, index = conv.rsplit(".", 1)
        assert isinstance(folded.get_submodule(parent), nn.Sequential)
        return f"{parent}.{int(index) + 1}.scale"
    return folded_name


def _max_pools_as_average_pools(genotype):
    """``genotype`` with its max pools as average pools: a max pool's gradient goes to one of tied inputs, and inputs
    tied in one network may differ by one rounding in another that computes the same function."""
    def swap(edges):
        return tuple(("avg_pool_3x3" if op == "max_pool_3x3" else op, node) for op, node in edges)

    return dataclasses.replace(genotype, normal=swap(genotype.normal), reduce=swap(genotype.reduce))


@pytest.mark.parametrize("genotype", [DARTS_V2, DARTS_V2_SPIKE_NATIVE, ALL_OPS], ids=["darts_v2", "spike_native",
                                                                                      "all_ops"])
def test_scales_folded_into_their_convs_give_the_same_logits_and_gradients(genotype) -> None:
    """The default trainable SNN (each batch norm's scale after a bias-free conv scaling that conv's weights) against
    the one whose scales are a pass of their own, in float64 at T = 3: the same logits, and (max pools as average
    pools) the same gradient for every parameter, the weights and the scales included, matched by name. Most scales
    are folded."""
    x, labels = torch.randn(4, 2, 12, 12, dtype=torch.float64), torch.tensor([0, 1, 2, 3])
    for pools in (genotype, _max_pools_as_average_pools(genotype)):
        qann = _with_auxiliary_and_stem_stats(qann_network(pools, seed=11, level=4, sym=False)).double()
        for module in qann.modules():  # scales far from 1, so a scale applied twice or not at all shows
            if isinstance(module, nn.BatchNorm2d) and module.affine:
                module.weight.data.uniform_(0.3, 3.0)
        folded, separate = trainable_snn(qann, 3), trainable_snn(qann, 3, fold_scales=False)
        loss, grads = loss_and_grads(folded, x, labels)
        separate_loss, separate_grads = loss_and_grads(separate, x, labels)
        torch.testing.assert_close(loss, separate_loss, rtol=1e-12, atol=0)
        torch.testing.assert_close(folded(x)[0], separate(x)[0], rtol=1e-10, atol=1e-12)
    scales = [name for name in grads if name.endswith("parametrizations.weight.0.scale")]
    assert len(scales) > len([name for name in grads if name.endswith(".scale")]) / 2
    matched = {_separate_name(name, folded): grad for name, grad in grads.items()}
    assert matched.keys() == separate_grads.keys()
    assert any(grad.abs().max() > 1e-6 for grad in separate_grads.values())
    for name, grad in separate_grads.items():
        torch.testing.assert_close(matched[name], grad, rtol=1e-9, atol=1e-12, msg=name)
