"""The last program's sum of per-program partials (kernels/partial_sums.py), under TRITON_INTERPRET=1 on CPU."""
import pytest
import torch
import triton
import triton.language as tl

from kernels.partial_sums import TOTAL_BLOCK, partials_and_counter, store_partial_and_total


@triton.jit
def _sum_kernel(values_ptr, partials_ptr, counter_ptr, total_ptr):
    store_partial_and_total(partials_ptr, counter_ptr, total_ptr, tl.load(values_ptr + tl.program_id(0)))


def launch_sum(values: torch.Tensor, total_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    partials, counter = partials_and_counter(values.device, None, values.numel())
    partials.fill_(float("nan"))  # every slot must be written before it is read
    total = torch.full((), float("nan"), dtype=total_dtype)
    _sum_kernel[(values.numel(),)](values, partials, counter, total)
    return total, partials[: values.numel()], counter


# One program; a few; exactly one block of the total; one over it (a second pass of the loop); three passes.
@pytest.mark.parametrize("num_programs", [1, 7, TOTAL_BLOCK.value, TOTAL_BLOCK.value + 1, 2 * TOTAL_BLOCK.value + 37])
def test_last_program_writes_the_sum_and_zeroes_the_counter(num_programs):
    values = torch.randn(num_programs, generator=torch.Generator().manual_seed(num_programs), dtype=torch.float64)
    values = values.float()
    total, partials, counter = launch_sum(values, torch.float32)
    assert torch.equal(partials, values)
    torch.testing.assert_close(total.double(), values.double().sum(), rtol=1e-6, atol=1e-6)
    assert counter.item() == 0  # ready for the next launch
    again, _, _ = launch_sum(values, torch.float32)
    assert torch.equal(again, total)  # a fixed order: the same bits every time


@pytest.mark.parametrize("total_dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_total_is_written_in_the_outputs_dtype(total_dtype):
    values = torch.tensor([0.25, -1.5, 3.0])
    total, _, _ = launch_sum(values, total_dtype)
    assert total.dtype == total_dtype and total.item() == 1.75


def test_scratch_is_kept_and_grows():
    partials, counter = partials_and_counter(torch.device("cpu"), None, 5)
    assert partials.dtype == torch.float32 and partials.numel() >= 5
    assert counter.dtype == torch.int32 and counter.shape == (1,) and counter.item() == 0
    smaller = partials_and_counter(torch.device("cpu"), None, 3)
    assert smaller[0] is partials and smaller[1] is counter
    larger, same_counter = partials_and_counter(torch.device("cpu"), None, partials.numel() + 1)
    assert larger.numel() > partials.numel() and same_counter is counter
