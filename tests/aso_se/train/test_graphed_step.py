"""cuda_graph=true's checks that need no GPU (the capture itself: test_graphed_step_gpu.py)."""
import pytest
import torch

from aso_se.train.graphed_step import GraphedTrainStep, check_capturable
from search_space.errors import UserInputError


def params():
    return [torch.nn.Parameter(torch.randn(3, 2))]


@pytest.mark.parametrize("optimizer", [
    lambda: torch.optim.SGD(params(), lr=0.1, momentum=0.9),
    lambda: torch.optim.Adam(params(), lr=0.1, capturable=True),
], ids=["sgd", "adam-capturable"])
def test_capturable_optimizers_pass(optimizer):
    check_capturable(optimizer())


@pytest.mark.parametrize(("optimizer", "fragments"), [
    (lambda: torch.optim.Adam(params(), lr=0.1), ["Adam has capturable=False", "+optim.optimizer.capturable=true"]),
    (lambda: torch.optim.AdamW(params(), lr=0.1), ["AdamW has capturable=False"]),
    (lambda: torch.optim.LBFGS(params()), ["LBFGS", "cuda_graph=false"]),
], ids=["adam", "adamw", "lbfgs"])
def test_optimizers_that_cannot_be_captured_are_named(optimizer, fragments):
    with pytest.raises(UserInputError) as error:
        check_capturable(optimizer())
    message = str(error.value)
    assert "\n" not in message and all(fragment in message for fragment in fragments), message


def test_warmup_needs_a_step():
    with pytest.raises(ValueError, match="warmup_steps=0"):
        GraphedTrainStep(lambda x, y: (x, y), warmup_steps=0)
