"""Where a spike tensor is non-zero, as the ST-BIF kernel records it for the sparse conv that reads it.

The neuron kernel writes both parts while it writes the spikes, so the conv needs no pass over its
input (`kernels.sparse_conv.sparse_conv2d(..., block_map=)`). For spikes [N, C, H, W]:
  blocks  int8 [N, ceil(H/8), ceil(W/8), C]: 1 where an 8x8 block of a plane holds a non-zero
          (the prescan's map, read by the dense forwards and the weight gradients)
  planes  int8 [N, C]: 1 where a plane holds a non-zero, the OR of its blocks; the flags of the
          depthwise forward where one of its programs covers a whole plane (no kernel to OR them).
"""
from typing import NamedTuple

from torch import Tensor


class BlockMap(NamedTuple):
    blocks: Tensor
    planes: Tensor
