"""kernels/dependent_launch.py: when our kernels launch dependently (PDL)."""
import torch

from kernels import dependent_launch


def test_cpu_tensors_never_launch_dependently():
    previous = dependent_launch.set_enabled(True)
    try:
        assert not dependent_launch.use_pdl(torch.zeros(3))
    finally:
        dependent_launch.set_enabled(previous)


def test_set_enabled_returns_the_previous_setting_and_turns_it_off(monkeypatch):
    monkeypatch.setattr(dependent_launch, "_device_supports", lambda index: True)
    cuda_like = type("CudaLike", (), {"is_cuda": True, "device": torch.device("cuda", 0)})()
    previous = dependent_launch.set_enabled(False)
    try:
        assert not dependent_launch.use_pdl(cuda_like)
        assert dependent_launch.set_enabled(True) is False
        assert dependent_launch.use_pdl(cuda_like)
    finally:
        dependent_launch.set_enabled(previous)
