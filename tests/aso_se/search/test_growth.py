"""Growth: a deeper and wider supernet computes exactly what the old one did, in train and eval mode."""
from __future__ import annotations

import functools

import pytest
import torch

from aso_se.search.arch_params import ArchSample
from aso_se.search.growth import grow_structure, grow_supernet, rebind_optimizer, widen_tensor
from aso_se.search.supernet import SupernetStructure
from tests.aso_se.helpers import sample_ops, tiny_supernet


def double_sample(sample: list[ArchSample]) -> list[ArchSample]:
    return [ArchSample(s.noise.double(), s.chosen, s.active_ops, s.temperature) for s in sample]


@pytest.mark.parametrize("neuron", ["st_bif", "lif", "relu"])
@pytest.mark.parametrize("training", [True, False])
def test_growth_preserves_the_function(neuron: str, training: bool, digits) -> None:
    """float64 so that no membrane potential lands within rounding of a threshold."""
    images = digits[0][:6].double()
    supernet = tiny_supernet(neuron).double()
    with torch.no_grad():
        supernet(images)  # BatchNorm running statistics that are not the initial ones
        for alpha in supernet.arch_parameters():
            alpha.normal_()
    sample = double_sample(sample_ops(supernet, k=3))
    supernet.train(training)
    grown, _ = grow_supernet(supernet, new_cells=2, width_factor=2, seed=1)
    assert grown.structure == SupernetStructure(8, ("normal", "grown", "reduction", "grown", "reduction"))
    assert grown.training == training
    with torch.no_grad():
        before, after = supernet(images, sample), grown(images, sample)
    torch.testing.assert_close(after, before, rtol=1e-10, atol=1e-12)
    assert sum(p.numel() for p in grown.parameters()) > 2 * sum(p.numel() for p in supernet.parameters())


def test_grown_cells_start_learning_at_once(digits) -> None:
    images, labels = digits
    grown, _ = grow_supernet(tiny_supernet("st_bif"), new_cells=1, width_factor=1, seed=0)
    sample = sample_ops(grown, k=2)
    torch.nn.functional.cross_entropy(grown(images[:8], sample), labels[:8]).backward()
    gate = grown.cells[1].cell.gate
    assert gate.item() == 0.0 and gate.grad.abs().item() > 0


def test_growth_is_reproducible_from_its_seed() -> None:
    supernet = tiny_supernet("relu", timesteps=1)
    first, _ = grow_supernet(supernet, new_cells=1, width_factor=1, seed=5)
    torch.manual_seed(123)  # the global RNG must not matter
    second, _ = grow_supernet(supernet, new_cells=1, width_factor=1, seed=5)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name


def test_new_cells_go_to_the_end_of_the_smallest_stages() -> None:
    structure = SupernetStructure.initial(8, 5)  # normal, reduction, normal, reduction, normal
    assert structure.cells == ("normal", "reduction", "normal", "reduction", "normal")
    grown, positions = grow_structure(structure, 4, 1)
    # stage sizes 1, 2, 2: the first stage takes two (fewest, then earliest on the tie), then one each
    assert grown.cells == ("normal", "grown", "grown", "reduction", "normal", "grown", "reduction", "normal", "grown")
    assert positions == [0, 3, 4, 6, 7]


def test_a_stage_without_cells_takes_none() -> None:
    structure = SupernetStructure(4, ("reduction", "normal"))
    grown, _ = grow_structure(structure, 2, 1)
    assert grown.cells == ("reduction", "normal", "grown", "grown")


def test_widen_tensor_repeats_outputs_and_keeps_inputs_on_the_first_copy() -> None:
    weight = torch.arange(6.0).view(3, 2)
    wide = widen_tensor(weight, torch.Size([6, 4]), 2)
    assert torch.equal(wide, torch.tensor([
        [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0], [2.0, 0.0, 3.0, 0.0],
        [2.0, 0.0, 3.0, 0.0], [4.0, 0.0, 5.0, 0.0], [4.0, 0.0, 5.0, 0.0],
    ]))
    assert torch.equal(widen_tensor(torch.tensor([1.0, 2.0]), torch.Size([4]), 2), torch.tensor([1.0, 1.0, 2.0, 2.0]))
    with pytest.raises(ValueError, match="cannot widen"):
        widen_tensor(weight, torch.Size([5, 2]), 2)


def test_optimizer_state_follows_its_parameters(digits) -> None:
    images, labels = digits
    supernet = tiny_supernet("relu", timesteps=1)
    make = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)
    optimizer = make(supernet.parameters())
    sample = sample_ops(supernet, k=None, seed=None)
    torch.nn.functional.cross_entropy(supernet(images[:4], sample), labels[:4]).backward()
    optimizer.step()
    optimizer.param_groups[0]["lr"] = 0.05  # as a scheduler would
    grown, old_name = grow_supernet(supernet, new_cells=1, width_factor=2, seed=0)
    new_optimizer = make(grown.parameters())
    rebind_optimizer(optimizer, new_optimizer, supernet, grown, old_name, 2)
    assert new_optimizer.param_groups[0]["lr"] == 0.05
    old_params = dict(supernet.named_parameters())
    for name, param in grown.named_parameters():
        state = new_optimizer.state.get(param)
        if old_name(name) is None:
            assert state is None, name
        elif old_params[old_name(name)] in optimizer.state:
            old_buffer = optimizer.state[old_params[old_name(name)]]["momentum_buffer"]
            assert torch.equal(state["momentum_buffer"], widen_tensor(old_buffer, param.shape, 2)), name
