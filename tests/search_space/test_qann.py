"""The QANN and the ST-BIF SNN converted from it compute the same function."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from kernels.sparse_conv import SparseConv2d
from kernels.st_bif import st_bif_multistep
from search_space import qann as qann_module
from search_space.errors import UserInputError
from search_space.genotypes import GENOTYPES, Genotype
from search_space.network import build_network
from search_space.neurons import NeuronFactory
from search_space.ops import OPS, FactorizedReduce
from search_space.qann import REPORTED_TIMESTEPS, QuantizedActivation, convert_to_snn, evaluate_snn

# Every registered op on an edge that reads a cell input (stride 2 in a reduction cell) and elsewhere:
# edges 0, 1, 2, 4, 6 read the cell's inputs, edges 3, 5, 7 earlier nodes.
_INPUTS = (0, 1, 0, 2, 0, 3, 1, 4)
_INPUT_EDGES, _NODE_EDGES = (0, 1, 2, 4, 6), (3, 5, 7)


def _all_ops_genotype(start: int) -> Genotype:
    ops = sorted(OPS)
    edge_ops = {}
    for k, edge in enumerate(_INPUT_EDGES + _NODE_EDGES):
        edge_ops[edge] = ops[(start + k) % len(ops)]
    cell = tuple((edge_ops[edge], _INPUTS[edge]) for edge in range(8))
    return Genotype(normal=cell, normal_concat=(2, 3, 4, 5), reduce=cell, reduce_concat=(2, 3, 4, 5))


ALL_OPS_GENOTYPES = [_all_ops_genotype(start) for start in range(0, len(OPS), len(_INPUT_EDGES))]
ALL_OPS = ALL_OPS_GENOTYPES[0]


def test_the_all_ops_genotypes_cover_every_op_at_both_strides() -> None:
    on_input_edges = {g.normal[edge][0] for g in ALL_OPS_GENOTYPES for edge in _INPUT_EDGES}
    assert on_input_edges == set(OPS)


def qann_network(genotype: Genotype, *, seed: int, level: int = 8, sym: bool = True, layers: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    factory = NeuronFactory("st_bif_qann", timesteps=1, level=level, sym=sym)
    network = build_network(genotype, neuron=factory, channels=4, layers=layers, num_classes=5, in_channels=2,
                            image_size=12)
    for module in network.modules():  # random BN statistics and affine maps, random thresholds
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            if module.affine:
                module.weight.data.uniform_(0.5, 1.5)
                module.bias.data.uniform_(-0.3, 0.3)
        elif isinstance(module, QuantizedActivation):
            module.q_threshold.data.uniform_(0.2, 0.6)
    return network.eval()


@pytest.mark.parametrize(
    "genotype", [*ALL_OPS_GENOTYPES, GENOTYPES["DARTS_V2"]],
    ids=[f"all_ops{i}" for i in range(len(ALL_OPS_GENOTYPES))] + ["darts_v2"],
)
def test_snn_summed_logits_equal_the_qann_logits_in_fp64(genotype: Genotype) -> None:
    network = qann_network(genotype, seed=1).double()
    x = torch.randn(6, 2, 12, 12, dtype=torch.float64)
    result = evaluate_snn(network, [(x, torch.arange(6) % 5)], max_timesteps=256)
    assert result.silent and result.snn_timesteps > 1  # it takes several steps, and ends
    assert result.logit_max_abs_diff <= 1e-9
    assert result.snn_accuracy == result.qann_accuracy and result.prediction_agreement == 1.0
    # one run per T = 4, 16, 64, ...: its prefixes fill in the powers of two and the reported steps below it, and
    # the reported steps after silence read the final answer
    last_run = next(t for t in (4, 16, 64, 256) if t > result.snn_timesteps)
    assert set(result.accuracy_at) == {2**k for k in range(last_run.bit_length())} | set(REPORTED_TIMESTEPS)
    assert list(result.accuracy_at) == sorted(result.accuracy_at)
    assert all(result.accuracy_at[t] == result.snn_accuracy for t in REPORTED_TIMESTEPS if t >= last_run)
    # snn_timesteps is the last step with a spike: the logits are final after it, and the step after is silent
    batches = [(x, torch.arange(6) % 5)]
    last = evaluate_snn(network, batches, max_timesteps=result.snn_timesteps)
    after = evaluate_snn(network, batches, max_timesteps=result.snn_timesteps + 1)
    assert not last.silent and last.logit_max_abs_diff <= 1e-9
    assert after.silent and after.snn_timesteps == result.snn_timesteps
    assert network(x)[0].std() > 1e-3  # logits that differ, so equal predictions mean something


def test_a_first_run_at_a_larger_t_gives_the_same_evaluation_in_fewer_steps() -> None:
    """snn_first_timesteps: the runs at T = 4, 16, ... below it are skipped; the last run, and so the result, is the
    same (its prefixes give the accuracy after 1, 2, 4, ... steps as before)."""
    network = qann_network(GENOTYPES["DARTS_V2"], seed=1).double()
    batches = [(torch.randn(6, 2, 12, 12, dtype=torch.float64), torch.arange(6) % 5)]
    default = evaluate_snn(network, batches, max_timesteps=256)
    last_run = max(default.accuracy_at)
    assert last_run >= 16  # the default ran T = 4 and 16 (and more) before
    direct = evaluate_snn(network, batches, max_timesteps=256, first_timesteps=last_run)
    assert direct == default
    for bad in (0, 2.5, True):
        with pytest.raises(UserInputError, match="first_timesteps=.*positive integer"):
            evaluate_snn(network, batches, first_timesteps=bad)


def test_the_default_sixteen_unsigned_levels_convert_exactly_in_fp64() -> None:
    network = qann_network(ALL_OPS, seed=4, level=16, sym=False).double()
    assert NeuronFactory("st_bif_qann", timesteps=1)().pos_max == 15  # the default the test stands for
    x = torch.randn(6, 2, 12, 12, dtype=torch.float64)
    result = evaluate_snn(network, [(x, torch.arange(6) % 5)], max_timesteps=256)
    assert result.silent and result.snn_timesteps > 1 and result.logit_max_abs_diff <= 1e-9
    assert result.prediction_agreement == 1.0 and network(x)[0].std() > 1e-3


def test_snn_equals_qann_in_fp32_with_unsigned_levels() -> None:
    network = qann_network(ALL_OPS, seed=2, level=4, sym=False)
    x = torch.randn(4, 2, 12, 12)
    qann_logits = network(x)[0]
    snn = convert_to_snn(network, 64)
    snn_logits = snn(x)[0]
    scale = qann_logits.abs().max()
    assert (snn_logits - qann_logits).abs().max() <= 1e-4 * scale
    assert torch.equal(snn_logits.argmax(1), qann_logits.argmax(1))


def test_the_cap_stops_a_network_that_still_fires(caplog: pytest.LogCaptureFixture) -> None:
    network = qann_network(ALL_OPS, seed=3).double()
    x = torch.randn(2, 2, 12, 12, dtype=torch.float64)
    result = evaluate_snn(network, [(x, torch.zeros(2, dtype=torch.long))], max_timesteps=2)
    assert not result.silent and result.snn_timesteps == 2 and set(result.accuracy_at) == {1, 2}
    assert "still fired" in caplog.text


@pytest.mark.parametrize("level,sym", [(8, True), (4, False), (3, True), (2, True)])
def test_one_neuron_sums_to_the_quantized_total(level: int, sym: bool) -> None:
    """Any input split over steps, then zeros until silent: θ·clip(floor(X/θ + 0.5)), in the kernel and in
    the converted module."""
    torch.manual_seed(level)
    theta = 0.375  # binary-exact: the steps below are quarters of θ, so x_t/θ and the totals are exact halves
    quantizer = QuantizedActivation(theta, level=level, sym=sym, learn_threshold=False).double()
    steps = torch.randn(5, 3000, dtype=torch.float64) * 0.6
    halves = torch.tensor([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5, -4.5, 0.0, 10.0, -10.0], dtype=torch.float64) * theta
    steps[:, :11] = 0.0
    steps[0, :11], steps[1, :11], steps[3, :11] = halves + theta, -1.25 * theta, 0.25 * theta
    total = steps.sum(0)
    assert torch.equal(total[:11], halves)
    drive = torch.cat([steps, torch.zeros(40, 3000, dtype=torch.float64)])
    expected = quantizer(total)
    assert (expected == theta * quantizer.pos_max).any() and (expected == 0).any()  # clipped and rounded to 0
    out = st_bif_multistep(drive, theta, quantizer.pos_max, quantizer.neg_min, backend="torch")
    assert out[-10:].abs().sum() == 0  # silent long before the end
    assert torch.allclose(out.sum(0), expected, atol=1e-12, rtol=0)
    snn = convert_to_snn(nn.Sequential(quantizer), drive.shape[0])
    torch.testing.assert_close(snn(drive), out, rtol=0, atol=0)


def test_the_quantizer_gradients_are_straight_through_inside_and_lsq_for_theta() -> None:
    quantizer = QuantizedActivation(0.5, level=8, sym=True, learn_threshold=True).double()
    x = torch.tensor([[0.1, 0.74, -2.4, 5.0]], dtype=torch.float64, requires_grad=True)
    quantizer(x).sum().backward()
    assert x.grad.tolist() == [[1.0, 1.0, 0.0, 0.0]]  # -2.4/0.5 and 5/0.5 fall outside [-4.5, 3.5)
    v = x.detach() / 0.5
    expected = (torch.clamp(torch.floor(v + 0.5), -4, 3) - torch.where((v >= -4.5) & (v < 3.5), v, 0 * v)).sum()
    assert quantizer.q_threshold.grad.item() == pytest.approx(expected.item() * (4 * 3) ** -0.5)


def test_a_trained_smoke_network_converts_exactly() -> None:
    network = qann_network(GENOTYPES["DARTS_V2"], seed=4).train()
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-2)
    x, y = torch.randn(16, 2, 12, 12), torch.randint(0, 5, (16,))
    for _ in range(5):
        optimizer.zero_grad()
        nn.functional.cross_entropy(network(x)[0], y).backward()
        optimizer.step()
    result = evaluate_snn(network.double(), [(x.double(), y)], max_timesteps=256)
    assert result.silent and result.logit_max_abs_diff <= 1e-9
    assert result.snn_accuracy == result.qann_accuracy and result.prediction_agreement == 1.0


def test_bad_input_is_refused_with_one_line() -> None:
    with pytest.raises(UserInputError, match="level=1 must be an integer >= 2"):
        NeuronFactory("st_bif_qann", timesteps=1, level=1)
    with pytest.raises(UserInputError, match="set neuron.timesteps=1"):
        NeuronFactory("st_bif_qann", timesteps=4)
    network = qann_network(ALL_OPS, seed=0)
    with pytest.raises(UserInputError, match="timesteps=0 must be a positive integer"):
        convert_to_snn(network, 0)
    with pytest.raises(UserInputError, match="max_timesteps=0 must be a positive integer"):
        evaluate_snn(network, [(torch.randn(1, 2, 12, 12), torch.zeros(1, dtype=torch.long))], max_timesteps=0)


@pytest.mark.parametrize("kind,timesteps", [("relu", 1), ("st_bif", 2), ("lif", 2)])
def test_a_network_of_another_neuron_kind_is_refused_by_name(kind: str, timesteps: int) -> None:
    network = build_network(GENOTYPES["DARTS_V2"], neuron=NeuronFactory(kind, timesteps=timesteps), channels=4,
                            layers=3, num_classes=5, in_channels=2, image_size=12)
    with pytest.raises(UserInputError, match=rf"only a network built with neuron=st_bif_qann .*\['{kind}'\]"):
        convert_to_snn(network, 4)


def test_a_qann_with_a_layer_without_spiking_form_is_refused() -> None:
    network = nn.Sequential(nn.Conv2d(2, 3, 3), QuantizedActivation(0.5), nn.ReLU(), nn.Softmax(1))
    with pytest.raises(UserInputError, match=r"this one has \['Softmax', 'relu'\]"):
        convert_to_snn(network, 4)


def test_conversion_and_evaluation_leave_the_qann_untouched() -> None:
    network = qann_network(ALL_OPS, seed=7).train()
    before = {key: value.clone() for key, value in network.state_dict().items()}
    x, y = torch.randn(3, 2, 12, 12), torch.zeros(3, dtype=torch.long)
    snn = convert_to_snn(network, 8)
    result = evaluate_snn(network, [(x, y)], max_timesteps=256, dtype=torch.float64)
    assert result.silent and result.logit_max_abs_diff <= 1e-9
    assert network.training and next(network.parameters()).dtype == torch.float32
    assert all(torch.equal(before[key], value) for key, value in network.state_dict().items())
    assert any(isinstance(m, QuantizedActivation) for m in network.modules())
    assert not any(isinstance(m, QuantizedActivation) for m in snn.modules())
    # The SNN holds copies of the conv weights under the same names; a conv followed by a batch norm holds its
    # weights times the norm's scale (folded), the others the same values.
    scales = {}
    for name, module in network.named_modules():
        if isinstance(module, nn.Sequential) and not name.startswith("stem"):  # the stem enters once, unconverted
            for (index, layer), following in zip(enumerate(module), list(module)[1:]):
                if type(layer) in (nn.Conv2d, SparseConv2d) and isinstance(following, nn.BatchNorm2d):
                    scales[f"{name}.{index}.weight"] = following.weight / torch.sqrt(following.running_var
                                                                                     + following.eps)
    snn_weights = dict(snn.named_parameters())
    conv_weights = {name: p for name, p in network.named_parameters() if p.dim() == 4}
    assert len(conv_weights) > 20 and 0 < len(scales) < len(conv_weights)
    for name, weight in conv_weights.items():
        copy = snn_weights["stem." + name if name.startswith("stem.") else name]  # the stem is wrapped
        expected = weight * scales[name].view(-1, 1, 1, 1) if name in scales else weight
        assert torch.equal(copy, expected.detach()) and copy is not weight


def test_folded_norm_scales_give_the_unfolded_snn_to_rounding_and_skip_a_pass() -> None:
    network = qann_network(GENOTYPES["DARTS_V2_SPIKE_NATIVE"], seed=3, level=4).double().eval()
    x = torch.randn(4, 2, 12, 12, dtype=torch.float64)
    folded, kept = convert_to_snn(network, 8), convert_to_snn(network, 8, fold_norms=False)
    norms = {name: m for name, m in folded.named_modules() if isinstance(m, qann_module._ShiftAtFirstStep)}
    unfolded = [name for name, m in norms.items() if m.scale is not None]
    # every norm right after a bias-free conv; a factorized reduce's norm reads the concatenation of two convs
    assert len(norms) > 10 and all(isinstance(folded.get_submodule(name[:-3]), FactorizedReduce) for name in unfolded)
    assert all(m.scale is not None for m in kept.modules() if isinstance(m, qann_module._ShiftAtFirstStep))
    with torch.no_grad():
        a, b = folded(x)[0], kept(x)[0]  # (logits, auxiliary)
    assert b.abs().max() > 0.1
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_a_plain_module_tree_with_biases_converts_exactly() -> None:
    """Biased convs and linears, BN, max/average pooling on odd sizes: any tree of these pieces, fed its
    input at t = 0 and zeros afterwards, sums over time to the QANN's output."""
    torch.manual_seed(8)
    qann = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), QuantizedActivation(0.3, level=8),
        nn.MaxPool2d(3, stride=2, padding=1), nn.Conv2d(4, 6, 3), QuantizedActivation(0.25, level=4, sym=False),
        nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(6, 7), QuantizedActivation(0.2, level=16), nn.Linear(7, 3),
    ).double().eval()
    qann[1].running_mean.uniform_(-0.5, 0.5)
    qann[1].running_var.uniform_(0.5, 2.0)
    x = torch.randn(5, 2, 11, 11, dtype=torch.float64)
    timesteps = 64
    snn = convert_to_snn(qann, timesteps)
    drive = torch.cat([x, torch.zeros((timesteps - 1) * 5, 2, 11, 11, dtype=torch.float64)])
    with torch.no_grad():
        out = snn(drive).unflatten(0, (timesteps, -1))
        expected = qann(x)
    assert out[-1].abs().sum() == 0 and expected.abs().max() > 0.1
    torch.testing.assert_close(out.sum(0), expected, rtol=0, atol=1e-9)


def test_the_last_firing_step_is_read_in_channels_last_without_counting_firing_rates() -> None:
    """The evaluation's silence check reads each neuron's output in its own memory order; the neurons' firing-rate
    counts (nothing reads them there) stay off during it and are restored after."""
    network = qann_network(GENOTYPES["DARTS_V2"], seed=5, level=4).double()
    snn = convert_to_snn(network, 16).to(memory_format=torch.channels_last)
    x = torch.randn(5, 2, 12, 12, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    neurons = [m for m in snn.modules() if isinstance(m, qann_module.SpikingNeuron)]
    last_by_neuron, strided = [], []

    def reference(module, inputs, out):  # the plain way: a contiguous copy, a mask per step
        strided.append(not out.is_contiguous())
        fired = out.contiguous().unflatten(0, (16, -1)).flatten(1).ne(0).any(1).nonzero()
        last_by_neuron.append(int(fired.max()) + 1 if len(fired) else 0)

    handles = [m.register_forward_hook(reference) for m in neurons]
    for neuron in neurons:
        neuron.spike_count.fill_(-1)
    try:
        _, last = qann_module._snn_logits(snn, x, 16, [1, 2, 4, 8])
    finally:
        for handle in handles:
            handle.remove()
    assert any(strided) and 1 < max(last_by_neuron) < 16  # channels_last outputs; firing stops inside the run
    assert last == max(last_by_neuron)
    assert all(n.record_firing_rate for n in neurons) and all(int(n.spike_count) == -1 for n in neurons)


def test_the_logits_after_k_steps_of_one_run_equal_a_run_of_k_steps_in_fp64() -> None:
    """The SNN is causal and its head reads the pooled features summed over time: one run at T = 16
    gives the logits of separate runs at T = 1, 2, 4, 8 (and 16) to rounding."""
    network = qann_network(GENOTYPES["DARTS_V2"], seed=5).double()
    x = torch.randn(5, 2, 12, 12, dtype=torch.float64)
    logits, last = qann_module._snn_logits(convert_to_snn(network, 16), x, 16, [1, 2, 4, 8])
    assert last >= 4  # firing up to step 4: the early prefixes are not final yet
    for k in (1, 2, 4, 8, 16):
        alone = convert_to_snn(network, k)(x)[0]
        torch.testing.assert_close(logits[k], alone, rtol=0, atol=1e-12, msg=f"k={k}")
    assert (logits[1] - logits[16]).abs().max() > 1e-3


def test_the_evaluation_does_not_depend_on_the_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    network = qann_network(GENOTYPES["DARTS_V2"], seed=6).double()
    generator = torch.Generator().manual_seed(6)
    batches = [(torch.randn(n, 2, 12, 12, generator=generator, dtype=torch.float64), torch.arange(n) % 5)
               for n in (5, 3)]
    whole = evaluate_snn(network, batches, max_timesteps=256)
    monkeypatch.setattr(qann_module, "_IMAGE_STEPS_PER_CHUNK", 7)  # 1 image at T >= 4: every image alone
    chunked = evaluate_snn(network, batches, max_timesteps=256)
    # The logits' difference is float64 rounding (~1e-16): batches of other sizes may round it otherwise on CPU.
    assert dataclasses.replace(chunked, logit_max_abs_diff=0.0) == dataclasses.replace(whole, logit_max_abs_diff=0.0)
    assert chunked.logit_max_abs_diff == pytest.approx(whole.logit_max_abs_diff, abs=1e-12)
    assert whole.silent and len(whole.accuracy_at) > 3
