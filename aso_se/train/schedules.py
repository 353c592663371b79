"""Learning-rate schedules for ``conf/optim`` beyond torch's single ones (stepped once per epoch)."""
from __future__ import annotations

import torch


def warmup_cosine(optimizer: torch.optim.Optimizer, *, T_max: int, eta_min: float = 0.0, warmup_epochs: int = 0,
                  warmup_start_factor: float = 0.1) -> torch.optim.lr_scheduler.LRScheduler:
    """A linear warm-up from ``warmup_start_factor`` × lr to lr over ``warmup_epochs``, then a cosine to
    ``eta_min``; ``T_max`` is the whole run, warm-up included (CosineAnnealingLR's keys, so a config can
    switch between the two by ``_target_``). Large batches at a scaled learning rate need the warm-up."""
    if warmup_epochs <= 0:
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=T_max, eta_min=eta_min)
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=warmup_start_factor, end_factor=1.0,
                                               total_iters=warmup_epochs)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, T_max - warmup_epochs),
                                                        eta_min=eta_min)
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[warmup_epochs])
