"""Which implementation a call of a kernel package takes: its Triton kernels or PyTorch's ops (``backend=``)."""
import os

import torch

BACKENDS = ("auto", "triton", "torch")


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
    if backend != "triton":
        raise ValueError(f"{name} backend {backend!r}: expected one of {BACKENDS}")
    if problem is not None:
        raise ValueError(f"{problem}; use backend='torch'")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"backend 'triton' got tensors on {device}: move them to CUDA, use backend='torch', "
                         "or set TRITON_INTERPRET=1 before importing triton")
    return True
