"""A reduction's per-program partials and their total in the same launch, in a fixed order.

A kernel that reduces to one number (a threshold's gradient) stores one fp32 partial per program and calls
`store_partial_and_total`: each program then counts itself done on an int32 counter (an atomic), and the program
that finds itself last sums every partial in program order and writes the total. The order depends on the
number of programs alone, so the total is the same on every run, and there is no second kernel (an eager
`partials.sum()` costs more host time than the launch it follows). The last program sets the counter back to
zero for the next launch.

The partials and the counter come from `partials_and_counter`: kept per stream (launches on one stream run one
after another), or, while a CUDA graph is being captured, new ones (the graph zeroes its counter on every replay).
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

# Partials summed at once by the last program.
TOTAL_BLOCK = tl.constexpr(1024)


@triton.jit
def store_partial_and_total(partials_ptr, counter_ptr, total_ptr, partial):
    """Stores this program's `partial`; the last program to get here writes the sum of all of them to total_ptr
    (in its element type) and zeroes the counter."""
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    tl.store(partials_ptr + pid, partial)
    tl.debug_barrier()  # every thread's store is made before the count (the atomic releases them)
    done = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
    if done == num_programs - 1:
        offs = tl.arange(0, TOTAL_BLOCK)
        total = tl.zeros([TOTAL_BLOCK], tl.float32)
        start = 0
        while start < num_programs:  # not range(): the interpreter cannot range over num_programs
            # .cg reads L2: the other programs' partials, not a line this SM's L1 may hold
            total += tl.load(partials_ptr + start + offs, mask=start + offs < num_programs, other=0.0,
                             cache_modifier=".cg")
            start += TOTAL_BLOCK
        tl.store(total_ptr, tl.sum(total, axis=0).to(total_ptr.dtype.element_ty))
        tl.atomic_xchg(counter_ptr, 0)


# Per (device index, stream): (partials, counter), kept between launches; partials grow to the most programs seen.
_SCRATCH: dict[tuple[int | None, int], tuple[Tensor, Tensor]] = {}


def partials_and_counter(device: torch.device, device_index: int | None, num_programs: int) -> tuple[Tensor, Tensor]:
    """fp32 room for `num_programs` partials and a zero int32 counter, for one launch on the current stream of
    `device` (`device_index`: None for CPU tensors under the interpreter, whose programs run one after another).
    Both are kept per stream: launches on one stream run one after another, and each leaves the counter at zero.
    While a CUDA graph is being captured both are new, and the graph zeroes its counter on every replay."""
    if device_index is None:
        stream = 0
    else:
        if torch.cuda.is_current_stream_capturing():
            return (torch.empty(num_programs, dtype=torch.float32, device=device),
                    torch.zeros(1, dtype=torch.int32, device=device))
        stream = torch._C._cuda_getCurrentRawStream(device_index)
    scratch = _SCRATCH.get((device_index, stream))
    if scratch is None or scratch[0].numel() < num_programs:
        # zeroed on this stream, before the launch that uses it
        counter = torch.zeros(1, dtype=torch.int32, device=device) if scratch is None else scratch[1]
        capacity = 1 << max(num_programs - 1, 0).bit_length()
        scratch = _SCRATCH[device_index, stream] = (torch.empty(capacity, dtype=torch.float32, device=device), counter)
    return scratch
