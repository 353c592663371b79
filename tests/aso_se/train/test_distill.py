"""Distillation: Hinton's blended loss from a frozen teacher, checked by hand."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from aso_se.train.distill import Distillation
from search_space.errors import UserInputError


class FixedAnswers(nn.Module):
    """A teacher whose logits are a fixed linear map of the inputs (and a parameter that must stay frozen)."""

    def __init__(self) -> None:
        super().__init__()
        self.map = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.map(x), None


def test_the_blend_is_hintons_loss_and_only_the_student_learns() -> None:
    torch.manual_seed(0)
    teacher, student = FixedAnswers(), nn.Linear(6, 3)
    inputs, labels = torch.randn(5, 6), torch.tensor([0, 1, 2, 0, 1])
    distill = Distillation(teacher, weight=0.3, temperature=2.0)
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    logits = student(inputs)
    label_loss = nn.functional.cross_entropy(logits, labels)
    loss = distill.blend(label_loss, logits, inputs)
    p_teacher = torch.softmax(teacher(inputs)[0] / 2.0, dim=1)
    log_p_student = torch.log_softmax(logits / 2.0, dim=1)
    kl = (p_teacher * (p_teacher.log() - log_p_student)).sum(1).mean()
    torch.testing.assert_close(loss, 0.7 * label_loss + 0.3 * 4.0 * kl)
    loss.backward()
    assert student.weight.grad.abs().sum() > 0 and teacher.map.weight.grad is None


def test_a_student_that_answers_as_its_teacher_pays_only_its_share_of_the_label_loss() -> None:
    teacher = FixedAnswers()
    inputs, labels = torch.randn(4, 6), torch.tensor([2, 1, 0, 0])
    logits = teacher(inputs)[0].detach().requires_grad_()
    label_loss = nn.functional.cross_entropy(logits, labels)
    loss = Distillation(teacher, weight=0.5, temperature=4.0).blend(label_loss, logits, inputs)
    torch.testing.assert_close(loss, 0.5 * label_loss)


@pytest.mark.parametrize(("weight", "temperature", "fragment"), [
    (0, 4.0, "distill.weight=0 must be in"), (1.5, 4.0, "distill.weight=1.5"), (True, 4.0, "distill.weight=True"),
    (0.5, 0, "distill.temperature=0 must be a positive number"), (0.5, "4", "distill.temperature='4'")])
def test_bad_settings_are_refused_in_one_line(weight, temperature, fragment: str) -> None:
    with pytest.raises(UserInputError, match=fragment.replace(".", r"\.")):
        Distillation(FixedAnswers(), weight=weight, temperature=temperature)
