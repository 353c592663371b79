"""What the CPU (gloo) and GPU (NCCL) tests of the flat gradient reduction compare: per rank, the
losses and weights of a run against eager DDP's, and the ranks against each other."""
from __future__ import annotations

from typing import Any, Sequence

import torch


def assert_trains_as_ddp(ddp: Sequence[dict[str, Any]], other: Sequence[dict[str, Any]], *, rtol: float,
                         atol: float) -> None:
    """``ddp[rank]``, ``other[rank]``: {"losses": [...], "state": state_dict} of each rank's run."""
    for ddp_rank, other_rank in zip(ddp, other, strict=True):
        assert ddp_rank["losses"][0] != ddp_rank["losses"][1]  # the weights moved
        torch.testing.assert_close(other_rank["losses"], ddp_rank["losses"], rtol=rtol, atol=atol)
        for name, value in ddp_rank["state"].items():
            if "running" in name or "num_batches" in name:
                continue  # DDP keeps the batch-norm statistics of this rank's last batch on top of rank 0's
            torch.testing.assert_close(other_rank["state"][name], value, rtol=rtol, atol=atol, msg=name)
    for name, value in other[0]["state"].items():  # the ranks agree, statistics included
        assert all(torch.equal(value, rank["state"][name]) for rank in other[1:]), name
