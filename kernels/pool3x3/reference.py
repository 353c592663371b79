"""DARTS's 3x3 pools (padding 1) as PyTorch defines them: the reference of the Triton kernels."""
import torch.nn.functional as F
from torch import Tensor


def pool3x3_reference(x: Tensor, kind: str, stride: int) -> Tensor:
    """PyTorch's pools, as DARTS defines them.

    Not a reference for gradients on CUDA channels_last tensors: there PyTorch's average-pool backward (its NHWC
    kernel) leaves out the padding offset and sends each input pixel the wrong windows' gradients
    (pytorch/pytorch#188344, fixed upstream in mid-2026); compare with the CPU or NCHW CUDA pools instead.
    """
    if kind == "avg":
        return F.avg_pool2d(x, 3, stride, 1, count_include_pad=False)
    return F.max_pool2d(x, 3, stride, 1)
