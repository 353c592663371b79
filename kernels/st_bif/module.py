"""`STBIFNeuron`: the multi-step ST-BIF neuron as a module, on the routes of dispatch.py."""
import torch
from torch import Tensor, nn

from kernels.backend import check_backend
from kernels.block_map import BlockMap
from kernels.native.spec import NativeSpec, raw_stream

from .dispatch import run
from .surrogates import get_surrogate
from .validation import check_threshold_value, level_bounds


class STBIFNeuron(nn.Module):
    """Multi-step ST-BIF neuron for `[T, B, ...]` input, a drop-in for a spikingjelly neuron.

    Every forward runs the whole sequence from the initial state, so the module keeps no
    state between calls: `spikingjelly.activation_based.functional.reset_net` has nothing
    to reset here and skips it (no `reset` method, no warning).
    """

    def __init__(
        self,
        q_threshold: float = 1.0,
        level: int = 8,
        sym: bool = True,
        learn_threshold: bool = False,
        surrogate: str = "sigmoid",
        backend: str = "auto",
    ) -> None:
        super().__init__()
        check_threshold_value(q_threshold)
        get_surrogate(surrogate)
        check_backend(backend, "st_bif")
        self.pos_max, self.neg_min = level_bounds(level, sym)
        self.level, self.sym = level, sym
        self.surrogate, self.backend = surrogate, backend
        # (bounds, surrogate, backend) and the NativeSpec (kernels/native) of the last call, where it had one
        self._native: tuple[tuple, NativeSpec] | None = None
        threshold = torch.tensor(float(q_threshold))
        if learn_threshold:
            self.q_threshold = nn.Parameter(threshold)
        else:
            self.register_buffer("q_threshold", threshold)

    def forward(self, x_seq: Tensor) -> Tensor:
        config = (self.pos_max, self.neg_min, self.surrogate, self.backend)
        if torch.compiler.is_compiling():
            return run(x_seq, self.q_threshold, *config, False)[0]
        native = self._native
        # The last call's C++ node first: it checks in C++ that x_seq and θ are of the kind it was made for.
        if native is not None and native[0] == config:
            try:
                spec = native[1]
                out = spec.apply(x_seq, self.q_threshold, spec.index, raw_stream(spec.device_index))
            except TypeError:  # x_seq is not a tensor: run says so
                out = None
            if out is not None:
                return out
        out, _, plan = run(x_seq, self.q_threshold, *config, False)
        native = None if plan is None else plan.native
        self._native = (config, native) if native else None
        return out

    def forward_with_block_map(self, x_seq: Tensor) -> tuple[Tensor, BlockMap | None]:
        """`forward` and the block map of its output (`st_bif_multistep_with_block_map`)."""
        return run(x_seq, self.q_threshold, self.pos_max, self.neg_min, self.surrogate, self.backend, True)[:2]

    def __getstate__(self) -> dict:
        # The C++ node's spec belongs to this process: copies and pickles find theirs on their first call.
        return {**super().__getstate__(), "_native": None}

    def extra_repr(self) -> str:
        learn = isinstance(self.q_threshold, nn.Parameter)
        return (
            f"level={self.level}, sym={self.sym}, pos_max={self.pos_max}, "
            f"neg_min={self.neg_min}, learn_threshold={learn}, surrogate={self.surrogate!r}, "
            f"backend={self.backend!r}"
        )
