"""Test-wide setup. Runs before any test module imports triton or touches CUDA."""
import os

import pytest
import torch

# Tests use tiny tensors: one intra-op thread. Extra threads buy nothing at these sizes, and
# on a busy 2-core machine their spin-waits made whole test folders 10x slower (13 s vs 178 s).
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")  # the same for the entry points and sweeps the tests start


def pytest_configure(config: pytest.Config) -> None:
    """`pytest` (the default, `-m 'not slow and not gpu'`) is the CPU suite, the same on every
    machine: CUDA is hidden and the Triton kernels run under Triton's interpreter, which must
    be switched on before triton is first imported (test modules import it later, at
    collection). A run that selects the GPU tests (`pytest -m gpu`) keeps the GPU and the real
    compiler."""
    selects_gpu_tests = "gpu" in (config.getoption("markexpr") or "").replace("not gpu", "")
    if selects_gpu_tests:
        return
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # also for the entry points the tests start


_HYDRA_FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR")


@pytest.fixture(autouse=True)
def _restore_hydra_full_error():
    """Entry points run in-process set HYDRA_FULL_ERROR=1 for Hydra; subprocesses of later tests would
    inherit it and print tracebacks instead of one-line errors."""
    yield
    if _HYDRA_FULL_ERROR is None:
        os.environ.pop("HYDRA_FULL_ERROR", None)
    else:
        os.environ["HYDRA_FULL_ERROR"] = _HYDRA_FULL_ERROR
