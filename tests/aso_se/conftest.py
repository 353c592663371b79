"""Fixtures of the engine tests."""
import pytest
import torch


@pytest.fixture
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """16 real MNIST-5k digits (normalized) and their labels, from the data layer."""
    from aso_se.data import MNIST5kData

    loader, _ = MNIST5kData(max_train_samples=64).search_loaders(16, seed=0)
    loader.set_epoch(0)
    images, labels = next(iter(loader))
    return images, labels
