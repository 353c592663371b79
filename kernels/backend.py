"""Which implementation a call of a kernel package takes: its Triton kernels or PyTorch's ops (``backend=``).

Every package takes the same names: "auto" (the kernels on CUDA where they fit and pay, PyTorch elsewhere),
"triton" (the kernels, or a ValueError saying why not) and "torch" (PyTorch's ops); sparse_conv adds its readable
"reference". Unknown names are a ValueError from `check_backend`, in one wording for every package.
"""
import os

import torch

BACKENDS = ("auto", "triton", "torch")


def check_backend(backend: str, name: str, choices: tuple[str, ...] = BACKENDS) -> None:
    """ValueError unless ``backend`` is one of ``choices`` (``name``: the package or function, for the message)."""
    if backend not in choices:
        raise ValueError(f"{name}: unknown backend {backend!r}; expected one of {choices}")


def triton_can_run(device: torch.device) -> bool:
    """Whether Triton kernels can run on tensors on ``device``: CUDA, or any device under Triton's interpreter."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(backend: str, name: str, device: torch.device, problem: str | None, preferred: bool = True) -> bool:
    """Whether ``name``'s Triton kernels run this call.

    ``problem``: why the kernels cannot take these inputs (None: they can); ``preferred``: whether "auto" should
    take them when they can (e.g. only for a layout where they beat PyTorch). "auto": the kernels on CUDA when
    both hold; "torch": never; "triton": the kernels, or a ValueError naming the problem and the fix.
    """
    if backend == "torch":
        return False
    if backend == "auto":
        return problem is None and preferred and device.type == "cuda"
    check_backend(backend, name)
    if problem is not None:
        raise ValueError(f"{problem}; use backend='torch'")
    if not triton_can_run(device):
        raise ValueError(f"backend 'triton' got tensors on {device}: move them to CUDA, use backend='torch', "
                         "or set TRITON_INTERPRET=1 before importing triton")
    return True
