"""Loader workers inside a job of Hydra's joblib launcher (a loky process, whose default start method is loky's):
DataLoader's workers then need a standard-library context, or the job dies with "'Process' object has no
attribute 'env'" (what the first GPU sweep of the cifar10_qann search hit)."""
from __future__ import annotations

import multiprocessing

import pytest
import torch
from torchvision.transforms.functional import pil_to_tensor, to_pil_image

from aso_se.data.device_loader import decode_uint8
from aso_se.data.loaders import EpochLoader, SeededTransformDataset, worker_context
from aso_se.data.sampling import ShardSampler


def _load_in_workers() -> list[int]:
    """What a job does: an epoch of an EpochLoader and a decode, both with workers."""
    images = torch.randint(0, 256, (6, 3, 4, 5), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    samples = [(to_pil_image(image), label) for label, image in enumerate(images)]
    loader = EpochLoader(SeededTransformDataset(samples, pil_to_tensor, seed=0),
                         ShardSampler(torch.arange(6), seed=0, rank=0, world_size=1, shuffle=False),
                         batch_size=2, num_workers=2)
    loader.set_epoch(0)
    batches = list(loader)
    assert torch.equal(torch.cat([inputs for inputs, _ in batches]), images)
    assert torch.equal(decode_uint8(samples, num_workers=2), images)
    return [int(label) for _, labels in batches for label in labels]


def test_loader_workers_start_inside_a_joblib_loky_job() -> None:
    joblib = pytest.importorskip("joblib")
    assert joblib.Parallel(n_jobs=2, backend="loky")([joblib.delayed(_load_in_workers)()]) == [[0, 1, 2, 3, 4, 5]]


def test_the_standard_start_methods_keep_torchs_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert worker_context(0) is None
    for method in ("fork", "spawn", "forkserver", None):
        monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False, m=method: m)
        assert worker_context(2) is None
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "loky")
    assert worker_context(2).get_start_method() == "fork"
