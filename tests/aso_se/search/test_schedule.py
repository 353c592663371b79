"""The cycle plan and the annealed knobs."""
from __future__ import annotations

import pytest

from aso_se.search.schedule import Phase, SearchSchedule
from search_space.errors import UserInputError


def test_plan_runs_four_phases_per_cycle_and_ends_with_the_last_evolution() -> None:
    schedule = SearchSchedule(cycles=2, warmup_epochs=1, search_epochs=2, restabilize_epochs=1)
    plan = [(entry.cycle, entry.phase, entry.epoch_in_phase, entry.epoch) for entry in schedule.plan()]
    assert plan == [
        (0, Phase.WARMUP, 0, 0), (0, Phase.SEARCH, 0, 1), (0, Phase.SEARCH, 1, 2), (0, Phase.EVOLVE, 0, 3),
        (0, Phase.RESTABILIZE, 0, 3),
        (1, Phase.WARMUP, 0, 4), (1, Phase.SEARCH, 0, 5), (1, Phase.SEARCH, 1, 6), (1, Phase.EVOLVE, 0, 7),
    ]
    assert schedule.total_epochs == 7


def test_a_longer_first_warmup_lengthens_cycle_0_only() -> None:
    schedule = SearchSchedule(cycles=2, warmup_epochs=1, first_warmup_epochs=3, search_epochs=2, restabilize_epochs=1)
    warmups = [(entry.cycle, entry.epoch) for entry in schedule.plan() if entry.phase is Phase.WARMUP]
    assert warmups == [(0, 0), (0, 1), (0, 2), (1, 6)]
    first_search = next(entry for entry in schedule.plan() if entry.phase is Phase.SEARCH)
    assert first_search.epoch == 3 and schedule.total_epochs == 9
    no_first = SearchSchedule(cycles=2, warmup_epochs=1, first_warmup_epochs=0, search_epochs=2, restabilize_epochs=1)
    assert [e.cycle for e in no_first.plan() if e.phase is Phase.WARMUP] == [1]
    same = SearchSchedule(cycles=2, warmup_epochs=1, search_epochs=2, restabilize_epochs=1)
    assert same.first_warmup == 1 and same.total_epochs == 7


def test_temperature_anneals_within_each_search_phase() -> None:
    schedule = SearchSchedule(temperature_start=4.0, temperature_end=0.25, warmup_epochs=1, search_epochs=2)
    progress = [schedule.search_progress(epoch, step, 10) for epoch in range(2) for step in range(10)]
    temperatures = [schedule.temperature(Phase.SEARCH, p) for p in progress]
    assert temperatures[0] == 4.0 and temperatures == sorted(temperatures, reverse=True)
    assert schedule.temperature(Phase.SEARCH, 1.0) == pytest.approx(0.25)
    assert schedule.temperature(Phase.SEARCH, 0.5) == pytest.approx(1.0)  # exponential: the geometric mean
    assert schedule.temperature(Phase.WARMUP, 0.7) == 4.0 and schedule.temperature(Phase.RESTABILIZE, 0.0) == 0.25
    middle = (schedule.entropy_weight_start + schedule.entropy_weight_end) / 2
    assert schedule.entropy_weight(0.5) == pytest.approx(middle)


@pytest.mark.parametrize(
    "fields", [{"cycles": 0}, {"search_epochs": 0}, {"temperature_end": 5.0}, {"warmup_epochs": -1},
                {"first_warmup_epochs": -1}, {"beta_decay_weight_end": -1.0}]
)
def test_bad_schedules_name_the_knob(fields: dict) -> None:
    with pytest.raises(UserInputError, match="search.schedule"):
        SearchSchedule(**fields)
