"""The one checkpoint policy of the search and the retrain: which epoch ends save, when a timed save is due."""
from __future__ import annotations

import pytest

from aso_se.run import checkpoint_policy
from aso_se.run.checkpoint_policy import CheckpointPolicy
from search_space.errors import UserInputError


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The policy's clock: set ``clock[0]`` to move it (seconds)."""
    now = [0.0]
    monkeypatch.setattr(checkpoint_policy.time, "monotonic", lambda: now[0])
    return now


def test_every_n_th_epoch_end_saves_and_the_last() -> None:
    policy = CheckpointPolicy(every_n_epochs=2)
    assert [policy.epoch_due(epoch) for epoch in (1, 2, 3, 4)] == [False, True, False, True]
    assert policy.epoch_due(3, last=True)


def test_a_timed_save_is_due_once_the_interval_has_passed_since_the_last_save(clock: list[float]) -> None:
    policy = CheckpointPolicy(every_min=1)
    clock[0] = 59.0
    assert not policy.timed_due()
    clock[0] = 60.0
    assert policy.timed_due()
    policy.saved()
    assert not policy.timed_due()
    clock[0] = 120.0
    assert policy.timed_due()


def test_no_timed_save_without_an_interval_or_on_a_rank_that_writes_nothing(clock: list[float]) -> None:
    never, other_rank = CheckpointPolicy(every_min=None), CheckpointPolicy(every_min=1)
    other_rank.timed = False
    clock[0] = 10**6
    assert not never.timed_due() and not other_rank.timed_due()


def test_the_trainer_config_gives_the_policy() -> None:
    policy = CheckpointPolicy.from_config({"checkpoint_every_n_epochs": 3, "checkpoint_every_min": 0.5,
                                           "keep_checkpoints": 2})
    assert (policy.every_n_epochs, policy.every_s, policy.keep) == (3, 30.0, 2)
    assert (CheckpointPolicy.from_config({}).every_n_epochs, CheckpointPolicy.from_config({}).keep) == (1, 1)


@pytest.mark.parametrize(("settings", "message"), [
    ({"every_min": 0}, "trainer.checkpoint_every_min=0 must be a positive number"),
    ({"every_min": True}, "trainer.checkpoint_every_min=True must be a positive number"),
    ({"every_n_epochs": 1.5}, "trainer.checkpoint_every_n_epochs=1.5 must be an integer >= 1"),
    ({"keep": 0}, "trainer.keep_checkpoints=0 must be an integer >= 1"),
])
def test_bad_settings_are_refused(settings: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        CheckpointPolicy(**settings)
