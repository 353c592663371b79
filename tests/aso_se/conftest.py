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


@pytest.fixture
def no_tf32(monkeypatch):
    """fp32 convs and matmuls without TF32 (GPU tests that compare with the CPU or with another exact run). The
    matmul switch goes through set_float32_matmul_precision: monkeypatch cannot restore
    torch.backends.cuda.matmul.allow_tf32 on CUDA builds of torch 2.11."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(previous)
