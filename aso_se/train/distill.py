"""Knowledge distillation: a retrain's loss blended with the KL divergence from a trained teacher's soft answers.

A few-level QANN learns more from a trained network of the same cell (its ReLU or many-level twin) than from the
labels alone: the teacher's softened logits say which wrong classes are near. Hinton et al.'s loss,
(1 − w)·CE(student, labels) + w·τ²·KL(softmax(teacher/τ) ‖ softmax(student/τ)).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from search_space.errors import UserInputError


@dataclass
class Distillation:
    """A frozen ``teacher`` (eval mode, no gradients) and the blend's ``weight`` w and ``temperature`` τ."""

    teacher: nn.Module
    weight: float = 0.5
    temperature: float = 4.0

    def __post_init__(self) -> None:
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not 0 < self.weight <= 1:
            raise UserInputError(f"distill.weight={self.weight!r} must be in (0, 1], e.g. 0.5")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not self.temperature > 0:
            raise UserInputError(f"distill.temperature={self.temperature!r} must be a positive number, e.g. 4")
        self.teacher.eval()
        for parameter in self.teacher.parameters():
            parameter.requires_grad_(False)

    def blend(self, label_loss: Tensor, student_logits: Tensor, inputs: Tensor) -> Tensor:
        """The distilled loss of a step whose label loss and logits are given, from the teacher's answer on
        ``inputs`` (the same batch, as the student saw it)."""
        with torch.no_grad():
            teacher_logits = self.teacher(inputs)[0]
        tau = self.temperature
        soft = F.kl_div(F.log_softmax(student_logits.float() / tau, dim=1),
                        F.log_softmax(teacher_logits.float() / tau, dim=1), log_target=True, reduction="batchmean")
        return (1 - self.weight) * label_loss + self.weight * tau * tau * soft
