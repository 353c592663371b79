"""``st_bif_qann``: ST-BIF's quantizer trained as an ANN activation at T = 1 (a QANN).

The quantizer itself (torch reference and Triton kernels) is ``kernels.quantizer``.

θ·clip(floor(x/θ + 0.5), neg_min, pos_max) is what an ST-BIF neuron with threshold θ and the same
count bounds emits in total once silent; ``search_space.qann`` converts such a network to that SNN.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from kernels.quantizer import BACKENDS, quantize
from kernels.quantizer.triton import native_spec_for
from kernels.st_bif import level_bounds
from search_space.errors import UserInputError
from search_space.neurons.base import register_neuron


class QuantizedActivation(nn.Module):
    """θ·clip(floor(x/θ + 0.5), neg_min, pos_max) with a straight-through gradient for x inside the
    clip range and LSQ's gradient (scaled by 1/sqrt(features·pos_max)) for a learnable θ."""

    capturable = True  # no host state or syncs: CUDA graphs may capture it (aso_se.search.graphed_ops)

    def __init__(
        self, q_threshold: float = 1.0, level: int = 8, sym: bool = True, learn_threshold: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if isinstance(level, bool) or not isinstance(level, int) or level < 2:
            raise UserInputError(f"neuron st_bif_qann: level={level!r} must be an integer >= 2; fix neuron.level")
        if not q_threshold > 0:
            raise UserInputError(f"neuron st_bif_qann: q_threshold={q_threshold} must be > 0; fix neuron.q_threshold")
        if backend not in BACKENDS:
            raise UserInputError(
                f"neuron st_bif_qann: backend={backend!r} must be one of {BACKENDS}; fix neuron.backend"
            )
        self.pos_max, self.neg_min = level_bounds(level, sym)
        self.level, self.sym, self.backend = level, sym, backend
        # ((bounds, backend, θ learnable), the C++ node of the last call's kind: kernels/native) where it had one
        self._native = None
        threshold = torch.tensor(float(q_threshold))
        if learn_threshold:
            self.q_threshold = nn.Parameter(threshold)
        else:
            self.register_buffer("q_threshold", threshold)

    def forward(self, x: Tensor) -> Tensor:
        theta = self.q_threshold
        compiling = torch.compiler.is_compiling()
        config = (self.neg_min, self.pos_max, self.backend, theta.requires_grad)
        native = None if compiling else self._native
        # The last call's C++ node first: it checks that x and θ are of its kind (x's shape fixes the scale).
        if native is not None and native[0] == config:
            try:
                out = native[1].run(x, theta)
            except TypeError:  # x is not a tensor: the Python path says so
                out = None
            if out is not None:
                return out
        # LSQ scales θ's gradient so that its steps match the weights'
        scale = (x[0].numel() * max(self.pos_max, 1)) ** -0.5 if theta.requires_grad else 0.0
        out = quantize(x, theta, self.neg_min, self.pos_max, scale, backend=self.backend)
        if self.backend != "torch" and not compiling:
            spec = native_spec_for(x, theta, self.neg_min, self.pos_max, scale)
            self._native = (config, spec) if spec is not None else None
        return out

    def __getstate__(self) -> dict:
        # The C++ node's spec belongs to this process: copies and pickles find theirs on their first call.
        return {**super().__getstate__(), "_native": None}

    def extra_repr(self) -> str:
        learn = isinstance(self.q_threshold, nn.Parameter)
        return (f"level={self.level}, sym={self.sym}, pos_max={self.pos_max}, neg_min={self.neg_min}, "
                f"learn_threshold={learn}, backend={self.backend!r}")


@register_neuron("st_bif_qann")
def st_bif_qann(
    timesteps: int, q_threshold: float = 0.5, level: int = 16, sym: bool = False, learn_threshold: bool = True,
    backend: str = "auto",
) -> nn.Module:
    if timesteps != 1:
        raise UserInputError(
            f"neuron st_bif_qann trains at T = 1 (its SNN runs until silent when evaluated), "
            f"got timesteps={timesteps}; set neuron.timesteps=1"
        )
    return QuantizedActivation(
        q_threshold=q_threshold, level=level, sym=sym, learn_threshold=learn_threshold, backend=backend
    )
