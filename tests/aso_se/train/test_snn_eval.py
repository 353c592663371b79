"""snn_metrics' log and keys say whether the SNN fell silent or the step cap stopped it."""
from __future__ import annotations

import logging

import pytest
import torch

from aso_se.train.snn_eval import snn_metrics
from tests.search_space.test_qann import ALL_OPS, qann_network


@pytest.mark.parametrize("cap,silent", [(2, False), (256, True)])
def test_the_log_tells_silence_from_the_cap(cap: int, silent: bool, caplog: pytest.LogCaptureFixture) -> None:
    network = qann_network(ALL_OPS, seed=3).double()
    x = torch.randn(2, 2, 12, 12, dtype=torch.float64)
    with caplog.at_level(logging.INFO, logger="aso_se.train.snn_eval"):
        metrics = snn_metrics(network, [(x, torch.zeros(2, dtype=torch.long))], device=torch.device("cpu"),
                              max_timesteps=cap, dtype="float64")
    assert metrics["snn_silent"] is silent
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("SNN:"))
    assert ("steps to silence" in line) is silent
    assert ("still firing at snn_max_timesteps" in line) is not silent
