"""Batched α sampling: one draw for all edges, straight-through weights, no graph reuse."""
from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from aso_se.search.arch_params import BatchedArchitectureUpdate, SamplingConfig, active_weights, draw_samples
from tests.aso_se.helpers import make_engine, sample_ops, tiny_supernet

PRIMITIVES = ("none", "max_pool_3x3", "skip_connect", "sep_conv_3x3", "dil_conv_3x3")


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def arch(seed: int = 0, edges: int = 5) -> BatchedArchitectureUpdate:
    torch.manual_seed(seed)
    module = BatchedArchitectureUpdate(edges, PRIMITIVES)
    with torch.no_grad():
        module.alpha.copy_(torch.randn(edges, len(PRIMITIVES)))
    return module


def test_alpha_is_one_parameter_per_cell_type_in_the_state_dict() -> None:
    module = arch()
    assert [name for name, _ in module.named_parameters()] == ["alpha"]
    assert set(module.state_dict()) == {"alpha", "op_mask", "stayed_below"}


def test_draw_picks_the_top_k_of_alpha_plus_noise_for_every_edge_at_once() -> None:
    archs = [arch(0), arch(1)]
    samples = draw_samples(archs, 3, SamplingConfig(k=2), temperature=1.0, generator=seeded(0))
    assert len(samples) == 3 and all(len(sample) == 2 for sample in samples)
    for draw in samples:
        for module, sample in zip(archs, draw):
            perturbed = module.alpha.detach() + sample.noise
            assert sample.active_ops == tuple(tuple(row) for row in perturbed.topk(2, dim=-1).indices.tolist())
    # independent noise for every sample and cell type
    assert not torch.equal(samples[0][0].noise, samples[1][0].noise)
    assert not torch.equal(samples[0][0].noise, samples[0][1].noise)
    again = draw_samples(archs, 3, SamplingConfig(k=2), temperature=1.0, generator=seeded(0))
    assert [s.active_ops for d in again for s in d] == [s.active_ops for d in samples for s in d]


def test_threshold_drops_weak_chosen_ops_but_never_the_best() -> None:
    module = arch()
    with torch.no_grad():
        module.alpha[0] = torch.tensor([5.0, 0.0, 0.0, 0.0, 0.0])  # edge 0: one dominant op
    sampling = SamplingConfig(k=3, weight_threshold=0.2, gumbel=False)
    (sample,) = draw_samples([module], 1, sampling, temperature=1.0)[0]
    assert sample.active_ops[0] == (0,)
    assert all(1 <= len(ops) <= 3 for ops in sample.active_ops)


def test_pruned_ops_are_never_chosen() -> None:
    module = arch()
    module.op_mask[:, 1:4] = False
    for draw in draw_samples([module], 20, SamplingConfig(k=3), temperature=1.0, generator=seeded(1)):
        assert all(set(ops) <= {0, 4} for ops in draw[0].active_ops)


def test_every_op_chosen_without_noise_gives_darts_softmax() -> None:
    module = arch()
    (sample,) = draw_samples([module], 1, SamplingConfig(k=None, gumbel=False), temperature=1.0)[0]
    assert sample.computes_every_op
    assert torch.equal(module.edge_weights(sample, arch_grad=True), torch.softmax(module.alpha, dim=-1))


def test_top_k_weights_are_renormalized_forward_and_straight_through_backward() -> None:
    module = arch()
    (sample,) = draw_samples([module], 1, SamplingConfig(k=2), temperature=0.5, generator=seeded(2))[0]
    weights = module.edge_weights(sample, arch_grad=True)
    soft = torch.softmax((module.alpha + sample.noise) / 0.5, dim=-1)
    chosen = torch.zeros_like(soft, dtype=torch.bool)
    for edge, ops in enumerate(sample.active_ops):
        chosen[edge, list(ops)] = True
    expected = soft * chosen / (soft * chosen).sum(-1, keepdim=True)
    torch.testing.assert_close(weights, expected)
    assert (weights[~chosen] == 0).all()
    grad_out = torch.randn(weights.shape)
    (alpha_grad,) = torch.autograd.grad((weights * grad_out).sum(), module.alpha)
    (soft_grad,) = torch.autograd.grad((soft * grad_out).sum(), module.alpha)
    torch.testing.assert_close(alpha_grad, soft_grad)


def test_weight_steps_do_not_touch_alpha() -> None:
    module = arch()
    (sample,) = draw_samples([module], 1, SamplingConfig(k=2), temperature=1.0, generator=torch.Generator())[0]
    assert not module.edge_weights(sample, arch_grad=False).requires_grad


def test_every_alpha_gets_a_nonzero_gradient_with_top_1(digits) -> None:
    """Only one op per edge runs, yet every α entry moves: through the straight-through softmax."""
    images, labels = digits
    supernet = tiny_supernet("st_bif")
    for seed in range(3):
        sample = sample_ops(supernet, k=1, seed=seed)
        torch.nn.functional.cross_entropy(supernet(images[:8], sample), labels[:8]).backward()
    for alpha in supernet.arch_parameters():
        assert (alpha.grad != 0).all(), alpha.grad


def test_one_sample_can_drive_two_backward_passes(digits) -> None:
    """A sample holds no graph: reusing it (e.g. second-order passes) never backpropagates twice."""
    images, labels = digits
    supernet = tiny_supernet("relu", timesteps=1)
    sample = sample_ops(supernet, k=2)
    for _ in range(2):
        torch.nn.functional.cross_entropy(supernet(images[:4], sample), labels[:4]).backward()


def test_consecutive_engine_steps(digits) -> None:
    images, labels = digits
    engine = make_engine(tiny_supernet("st_bif"))
    before = [alpha.detach().clone() for alpha in engine.supernet.arch_parameters()]
    for _ in range(3):
        scalars = engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=1.0)
        assert all(torch.isfinite(value) for value in scalars.values())
    assert all(not torch.equal(a, b) for a, b in zip(before, engine.supernet.arch_parameters()))


class HostSyncCounter(TorchFunctionMode):
    """Counts the calls that move a tensor's value to the host (a device sync on a GPU)."""

    SYNCING = {
        "tolist", "item", "__bool__", "__float__", "__int__", "__index__", "nonzero", "cpu", "numpy", "any", "all",
    }

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.SYNCING:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def test_a_search_step_reads_the_device_once(digits) -> None:
    """One α step + one weight step: the only host read is the batched draw's ``tolist``.

    (SGD for α here: Adam reads its CPU step counter with ``.item()``, which is no device sync.)
    On the GPU the benchmark counts syncs with torch.cuda.set_sync_debug_mode."""
    images, labels = digits
    engine = make_engine(tiny_supernet("st_bif"), arch_optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=1.0)  # lazy init
    with HostSyncCounter() as counter:
        engine.train_step((images[:8], labels[:8]), (images[8:], labels[8:]), temperature=2.0)
    assert counter.calls == ["tolist"]


def test_without_a_sample_each_edge_runs_only_its_most_likely_op(digits) -> None:
    """Evaluation: the supernet as its single best path, every weight 1."""
    supernet = tiny_supernet("st_bif").eval()
    with torch.no_grad():
        for alpha in supernet.arch_parameters():
            alpha.normal_()
    ran: list[tuple[int, int]] = []
    for edge_index, edge in enumerate(supernet.cells[0].cell.edges):  # a normal cell
        for op_index, op in enumerate(edge.ops):
            op.register_forward_hook(lambda *args, key=(edge_index, op_index): ran.append(key))
    with torch.no_grad():
        supernet(digits[0][:4])
    best = supernet.arch["normal"].alpha.argmax(dim=-1).tolist()
    none = supernet.search_space.primitives.index("none")
    expected, offset = [], 0
    for node in range(supernet.search_space.steps):  # `none` adds nothing, so it runs only if all a node has
        edges = [(edge, best[edge]) for edge in range(offset, offset + 2 + node)]
        expected += [(edge, op) for edge, op in edges if op != none] or edges[:1]
        offset += 2 + node
    assert ran == expected
    (sample, _) = supernet.argmax_sample()
    weights = supernet.arch["normal"].edge_weights(sample, arch_grad=False)
    torch.testing.assert_close(weights.max(dim=-1).values, torch.ones(len(best)))


@pytest.mark.parametrize("k, threshold", [(2, 0.0), (3, 0.2), (None, 0.1)])
def test_active_weights_are_the_indexed_weights_forward_and_backward(k, threshold) -> None:
    module = arch()
    with torch.no_grad():
        module.alpha.normal_(generator=seeded(4))
        module.op_mask[0, 1] = module.op_mask[2, :2] = False  # pruned ops come last in a row
    sampling = SamplingConfig(k=k, weight_threshold=threshold)
    (sample,) = draw_samples([module], 1, sampling, temperature=0.7, generator=seeded(5))[0]
    assert all(ops == tuple(row[:len(ops)]) for ops, row in zip(sample.active_ops, sample.chosen.tolist()))
    weights = module.edge_weights(sample, arch_grad=True)
    gathered = active_weights(weights, sample)
    indexed = [tuple(weights[edge, op] for op in ops) for edge, ops in enumerate(sample.active_ops)]
    assert [len(edge) for edge in gathered] == [len(ops) for ops in sample.active_ops]
    for got, want in zip(gathered, indexed):
        assert all(torch.equal(g, w) and g.dim() == 0 for g, w in zip(got, want))
    grad_out = torch.randn(len(sum(indexed, ())), generator=seeded(6))
    (expected,) = torch.autograd.grad(torch.stack(sum(indexed, ())) @ grad_out, module.alpha, retain_graph=True)
    (actual,) = torch.autograd.grad(torch.stack(sum(gathered, ())) @ grad_out, module.alpha)
    assert torch.equal(actual, expected)
