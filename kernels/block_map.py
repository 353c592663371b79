"""Where a spike tensor is non-zero, as the ST-BIF kernel records it for the sparse conv that reads it.

The neuron kernel writes both parts while it writes the spikes, so the conv needs no pass over
its input (`kernels.sparse_conv.sparse_conv2d(..., block_map=)`). For spikes [N, C, H, W]:
  blocks  int8 [N, ceil(H/8), ceil(W/8), C]: 1 where an 8x8 block of a plane holds a non-zero
          (the prescan's map: the dense conv's tile windows and the weight gradients read it)
  planes  int8 [N, C]: 1 where a plane holds a non-zero, the OR of its blocks. The depthwise
          forward's programs cover whole planes up to 32x32; these are their flags as they are,
          where a kernel would otherwise have to OR the blocks first (~3 µs of a [256,128,32,32]
          call on an H100, RESULTS.md ninth run).
"""
from typing import NamedTuple

from torch import Tensor


class BlockMap(NamedTuple):
    blocks: Tensor
    planes: Tensor
