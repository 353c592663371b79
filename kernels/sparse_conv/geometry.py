"""Shapes of one convolution call: output size, output tiles and the input blocks each tile reads.

Activity is tracked per input block of BLOCK x BLOCK pixels of one (sample, channel) plane.
The output is computed per output tile; a tile reads an input window (its receptive field, the
"halo"), which overlaps a small range of input blocks along each axis.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

BLOCK = 8  # side of an activity block, in input pixels


def _pair(value: int | tuple[int, ...] | list[int]) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    if len(value) != 2:
        raise ValueError(f"expected an int or a pair of ints, got {value!r}")
    return int(value[0]), int(value[1])


def cdiv(a: int, b: int) -> int:
    """ceil(a / b). Plain Python: triton.cdiv is a constexpr function, slow to call from the host."""
    return -(-a // b)


def next_pow2(value: int) -> int:
    """The smallest power of two >= value (1 for value <= 1); plain Python, like `cdiv`."""
    return 1 << (max(int(value), 1) - 1).bit_length()


@dataclass(frozen=True)
class AxisGeometry:
    """One spatial axis: input size, kernel, stride, padding, dilation and output tiling."""

    size: int
    kernel: int
    stride: int
    padding: int
    dilation: int
    tile: int  # output pixels per tile along this axis

    @property
    def out_size(self) -> int:
        return (self.size + 2 * self.padding - self.dilation * (self.kernel - 1) - 1) // self.stride + 1

    @property
    def tiles(self) -> int:
        return cdiv(self.out_size, self.tile)

    @property
    def blocks(self) -> int:
        return cdiv(self.size, BLOCK)

    @property
    def max_blocks_per_tile(self) -> int:
        """Upper bound on the input blocks one output tile's window overlaps."""
        window = (self.tile - 1) * self.stride + (self.kernel - 1) * self.dilation + 1
        return cdiv(window, BLOCK) + 1

    def block_range(self, tile_index: int) -> range:
        """Input blocks overlapped by the window of output tile `tile_index` (empty if only padding)."""
        first_out = tile_index * self.tile
        last_out = min(first_out + self.tile, self.out_size) - 1
        lo = max(first_out * self.stride - self.padding, 0)
        hi = min(last_out * self.stride - self.padding + (self.kernel - 1) * self.dilation, self.size - 1)
        if lo > hi:
            return range(0)
        return range(lo // BLOCK, hi // BLOCK + 1)


@dataclass(frozen=True)
class ConvGeometry:
    """Everything about a conv call's shapes that the kernels and the reference need."""

    batch: int
    in_channels: int
    out_channels: int
    groups: int
    rows: AxisGeometry
    cols: AxisGeometry

    @classmethod
    def of_shapes(
        cls,
        x_shape: tuple[int, ...],
        weight_shape: tuple[int, ...],
        stride: int | tuple[int, int] | list[int],
        padding: int | tuple[int, int] | list[int],
        dilation: int | tuple[int, int] | list[int],
        groups: int,
        tile: tuple[int, int] = (BLOCK, BLOCK),
    ) -> ConvGeometry:
        batch, in_channels, height, width = x_shape
        out_channels, _, kernel_h, kernel_w = weight_shape
        (stride_h, stride_w), (pad_h, pad_w) = _pair(stride), _pair(padding)
        dil_h, dil_w = _pair(dilation)
        return cls(
            batch, in_channels, out_channels, groups,
            AxisGeometry(height, kernel_h, stride_h, pad_h, dil_h, tile[0]),
            AxisGeometry(width, kernel_w, stride_w, pad_w, dil_w, tile[1]),
        )

    def retiled(self, tile: tuple[int, int]) -> ConvGeometry:
        """The same call with output tiles of tile[0] x tile[1] pixels."""
        return replace(self, rows=replace(self.rows, tile=tile[0]), cols=replace(self.cols, tile=tile[1]))

    @property
    def is_depthwise(self) -> bool:
        return self.groups == self.in_channels == self.out_channels and self.groups > 1

    @property
    def taps(self) -> int:
        return self.rows.kernel * self.cols.kernel

    @property
    def tiles(self) -> int:
        return self.rows.tiles * self.cols.tiles

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return self.batch, self.out_channels, self.rows.out_size, self.cols.out_size
