"""Retraining a found cell from scratch and evaluating it: DARTS's recipe on a spiking network.

The recipe of quark0/darts ``train.py``: SGD with a cosine learning-rate schedule (both from
``conf/optim``), cutout (a data-set option), an auxiliary head whose loss is added with a weight,
drop-path whose probability grows linearly from 0 to its final value over the epochs, and the
gradient norm clipped. The loop runs on one process or under DDP, in fp32, bf16 or fp16 autocast (fp16 with
dynamic loss scaling); its steps can be captured in CUDA graphs and replayed (``cuda_graph``).

The loop keeps its running sums on the device and reads them on the host (one sync) every
``log_every_n_steps`` steps and at the end of an epoch, which is also where a NaN/Inf loss is
noticed; the first non-finite step is tracked on the device so the error names it exactly.

It runs under the loops' contract, as the search engine does (``aso_se.loop``): ``on_log`` gets those running
scalars, ``on_epoch_end`` runs once an epoch is tested, and a timed checkpoint is taken mid-epoch when the callbacks
say it is due (train.py's callbacks are in ``aso_se.run.train_callbacks``: TensorBoard, checkpoints). Its own output
is the progress bar and the epoch's log line.
"""
from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from aso_se.errors import TrainingDiverged
from aso_se.loop import LoopCallbacks, ResumableLoader, never
from aso_se.monitor.progress import EpochProgress
from aso_se.monitor.tensorboard import layer_of
from aso_se.parallel.distributed import DistributedContext, broadcast_module, wrap_model
from aso_se.parallel.rng_state import capture_rng_state, restore_rng_state
from aso_se.train.distill import Distillation
from aso_se.train.graphed_step import FlatGradients, GraphedTrainStep, check_capturable
from kernels.sparse_conv import PATH_COUNTS
from search_space.errors import UserInputError
from search_space.network import parameters_m
from search_space.neurons import firing_rates, recording_firing_rates, set_firing_rate_recording

log = logging.getLogger(__name__)

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


def zero_momentum_buffers(optimizer: torch.optim.Optimizer) -> None:
    """Momentum buffers of zeros before the first step. A fused SGD whose first step is skipped (an fp16 overflow)
    would keep the buffers it allocated uninitialized; zeros give the same first step (0 · momentum + grad)."""
    if not isinstance(optimizer, torch.optim.SGD):
        return
    for group in optimizer.param_groups:
        if group["momentum"] == 0:
            continue
        if group["dampening"] != 0:  # its first step is buf = grad, which zeros would not reproduce
            raise UserInputError("trainer.precision=fp16 needs SGD without dampening; set optim.optimizer.dampening=0")
        for param in group["params"]:
            optimizer.state[param].setdefault("momentum_buffer", torch.zeros_like(param))


class Retrainer:
    """Trains ``model`` (from ``search_space.network.build_network``) and keeps its best accuracy.

    ``state_dict()`` holds everything to go on exactly where a checkpoint was taken: weights,
    optimizer, schedule, epoch, the step reached inside an interrupted epoch, best accuracy,
    history and the RNG state.
    """

    def __init__(self, model: nn.Module, *, optimizer: OptimizerFactory,
                 scheduler: SchedulerFactory, epochs: int, auxiliary_weight: float,
                 drop_path_prob: float, grad_clip: float, precision: str,
                 ctx: DistributedContext, log_every_n_steps: int, cuda_graph: bool = False,
                 channels_last: bool = False, grad_reduction: str = "auto", label_smoothing: float = 0.0,
                 distill: Distillation | None = None) -> None:
        if epochs < 1:
            raise UserInputError(f"epochs={epochs}: a retrain needs at least one epoch; "
                                 f"set epochs=<n>")
        if cuda_graph and ctx.device.type != "cuda":
            raise UserInputError(f"cuda_graph=true needs a CUDA device, the run is on {ctx.device}; "
                                 f"set cuda_graph=false or trainer.device=cuda")
        if grad_reduction not in ("auto", "ddp", "after_backward"):
            raise ValueError(f"grad_reduction={grad_reduction!r}: expected auto, ddp or after_backward")
        self.ctx = ctx
        # channels_last: NHWC weights and batches, where cuDNN's batch norm and depthwise convs are faster
        self.memory_format = torch.channels_last if channels_last else torch.preserve_format
        self.network = model.to(ctx.device, memory_format=self.memory_format)
        set_firing_rate_recording(self.network, False)  # steps need not count spikes: the test pass reports them
        self.distill = distill  # a teacher's soft answers blended into the loss (aso_se.train.distill)
        if distill is not None:
            distill.teacher.to(ctx.device, memory_format=self.memory_format)
        # Several ranks with graphs: no DDP (its reduction hooks cannot be replayed); the gradients live in
        # one flat buffer, all-reduced between the forward-backward graph and the clip-and-step graph.
        if grad_reduction == "auto":
            grad_reduction = "after_backward" if cuda_graph else "ddp"
        self.flat_grads = (FlatGradients(list(self.network.parameters()), ctx.world_size)
                           if ctx.distributed and grad_reduction == "after_backward" else None)
        if self.flat_grads is not None:
            broadcast_module(self.network)  # as DDP does when it wraps: rank 0's initial weights everywhere
        self.model = self.network if self.flat_grads is not None else wrap_model(self.network, ctx)
        self.optimizer = optimizer(self.network.parameters())
        if cuda_graph:
            check_capturable(self.optimizer)
        # Graphs with a fused SGD (a learning rate on the device) capture once per run: the schedule fills the
        # learning rate and the drop-path probability in place, so no epoch pays warm-up steps and a capture.
        self.capture_once = cuda_graph and isinstance(self.optimizer, torch.optim.SGD) and all(
            group.get("fused") for group in self.optimizer.param_groups)
        self._lr_to_device()
        self.scheduler = scheduler(self.optimizer)
        self._drop_prob_on_device = torch.zeros((), device=ctx.device) if self.capture_once else None
        self.label_smoothing = label_smoothing
        self.epochs = epochs
        self.auxiliary_weight = auxiliary_weight
        self.drop_path_prob = drop_path_prob
        self.grad_clip = grad_clip
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        # fp16: dynamic loss scaling. Its inf check and scale update run on the device, and a fused optimizer skips
        # the step itself on an overflow, so the whole step stays capturable.
        self.scaler = torch.amp.GradScaler(ctx.device.type) if precision == "fp16" else None
        if self.scaler is not None:
            zero_momentum_buffers(self.optimizer)
        if self.scaler is not None and cuda_graph and not getattr(self.optimizer, "_step_supports_amp_scaling", False):
            raise UserInputError("trainer.precision=fp16 with cuda_graph=true needs a fused optimizer (its step "
                                 "skips an overflow on the device): set optim.optimizer.fused=true, or use bf16")
        # cuda_graph: each epoch's steps are captured once and replayed (aso_se/graphed_step.py).
        split = {} if self.flat_grads is None else {"reduce": self.flat_grads.sum_over_ranks,
                                                        "finish": self._clip_and_step}
        self.graphed_step = GraphedTrainStep(self._train_step, **split) if cuda_graph else None
        # Eager steps under the flat reduction: the same three parts, one after the other.
        self.eager_step = (GraphedTrainStep.eager_only(self._train_step, **split) if split and not cuda_graph
                           else self._train_step)
        self.log_every = max(1, log_every_n_steps)
        self.progress = EpochProgress(enabled=ctx.is_main)
        self.label = "retrain"  # what the progress bar and the epoch's log line call this training
        self.epoch = 0           # the epoch being (or next to be) trained
        self.step_in_epoch = 0   # steps of that epoch already trained (a stop mid-epoch)
        self.global_step = 0
        self.best_test_acc = 0.0
        self.history: list[dict[str, float]] = []
        self.last_test: dict[str, Any] = {}
        self.train_images = 0
        self.conv_paths: collections.Counter[str] = collections.Counter()  # sparse-conv dispatcher paths, whole run
        self.epoch_conv_paths: dict[str, int] = {}  # those of the last epoch, for the callbacks
        self._earlier_peak_gib: float | None = None  # GPU memory peak of the pieces before a resume
        self.train_seconds = 0.0
        self._epoch_sums: torch.Tensor | None = None  # the running epoch's summed loss and correct predictions
        self._epoch_images = 0
        self._carried_running: list[float] | None = None  # those sums from a checkpoint taken mid-epoch

    def _to_device(self, inputs: torch.Tensor) -> torch.Tensor:
        """A batch on the device, images in the network's memory format (event frames are 5-D: as they are)."""
        memory_format = self.memory_format if inputs.dim() == 4 else torch.preserve_format
        return inputs.to(self.ctx.device, non_blocking=True, memory_format=memory_format)

    @property
    def parameters_m(self) -> float:
        """Parameters in millions without the auxiliary head (DARTS's count_parameters_in_MB)."""
        return parameters_m(self.network)

    def fit(self, train_loader: ResumableLoader, test_loader: Any, *, callbacks: LoopCallbacks | None = None,
            should_stop: Callable[[], bool] = never) -> bool:
        """Trains the remaining epochs: True at the end, False when ``should_stop`` interrupted an epoch (the
        caller saves and exits).

        ``callbacks.on_log(scalars, global_step)`` every ``log_every_n_steps`` steps and at an epoch's end, with
        the epoch's running train loss, accuracy and lr. ``callbacks.on_epoch_end(summary)`` once an epoch is
        tested: its ``history`` record (epoch, train_loss, train_acc, lr, images_per_second, test_loss, test_acc)
        and ``is_best``; its test firing rates are in ``last_test``, its conv paths in ``epoch_conv_paths``.
        ``callbacks.save_checkpoint()`` after a step, but an epoch's last, when ``callbacks.checkpoint_due()``.
        """
        callbacks = LoopCallbacks() if callbacks is None else callbacks
        while self.epoch < self.epochs:
            drop_prob = self.drop_path_prob * self.epoch / self.epochs
            if self._drop_prob_on_device is not None:
                self.network.drop_path_prob = self._drop_prob_on_device.fill_(drop_prob)
            else:
                self.network.drop_path_prob = drop_prob
            train = self._train_epoch(train_loader, callbacks, should_stop)
            if train is None:
                return False
            test = self.last_test = self.evaluate(test_loader)
            self.scheduler.step()
            record = {"epoch": self.epoch, **train, "test_loss": test["loss"],
                      "test_acc": test["acc"]}
            self.history.append(record)
            is_best = test["acc"] > self.best_test_acc
            self.best_test_acc = max(self.best_test_acc, test["acc"])
            self.progress.end_epoch(f"{self.label} epoch {self.epoch + 1}/{self.epochs}",
                                    {k: v for k, v in record.items() if k != "epoch"})
            self.epoch_conv_paths = PATH_COUNTS.snapshot_and_reset()
            self.conv_paths.update(self.epoch_conv_paths)
            self.epoch, self.step_in_epoch = self.epoch + 1, 0
            callbacks.on_epoch_end({**record, "is_best": is_best})
        return True

    def _train_epoch(self, loader: ResumableLoader, callbacks: LoopCallbacks,
                     should_stop: Callable[[], bool]) -> dict[str, float] | None:
        self.model.train()
        done, images = self.step_in_epoch, 0  # images: of this piece of the epoch (its images/s)
        loader.set_epoch(self.epoch, start_batch=done)  # a stopped epoch goes on where it was
        steps = done + len(loader)
        device = self.ctx.device
        # summed loss, correct predictions and images of the epoch, the steps before a mid-epoch stop included
        carried = self._carried_running if done else None
        self._carried_running = None
        self._epoch_sums = torch.tensor(carried[:2] if carried else [0.0, 0.0], device=device)
        self._epoch_images = int(carried[2]) if carried else 0
        sums = self._epoch_sums
        first_bad_step = torch.full((), -1, dtype=torch.long, device=device)
        self.progress.start_epoch(f"{self.label} epoch {self.epoch + 1}/{self.epochs}", total=steps,
                                  done=done)
        if self.graphed_step is not None and not self.capture_once:  # lr and drop-path changed: capture anew
            self.graphed_step.reset()
        train_step = self.graphed_step or self.eager_step
        started = time.perf_counter()
        for step, (inputs, labels) in enumerate(loader, start=done):
            loss, correct = train_step(self._to_device(inputs),
                                       labels.to(device, non_blocking=True))
            sums += torch.stack([loss * labels.numel(), correct])
            first_bad_step = torch.where(~torch.isfinite(loss) & (first_bad_step < 0),
                                         step, first_bad_step)
            images += labels.numel()
            self._epoch_images += labels.numel()
            self.step_in_epoch, self.global_step = step + 1, self.global_step + 1
            if self.step_in_epoch % self.log_every == 0 or self.step_in_epoch == steps:
                shown = self._read_running(sums, first_bad_step, self._epoch_images)
                self.progress.advance(self.step_in_epoch - done, shown)
                done = self.step_in_epoch
                callbacks.on_log(shown, self.global_step)
            if should_stop():
                return None
            if self.step_in_epoch < steps and callbacks.checkpoint_due():  # the epoch's end saves anyway
                self._read_running(sums, first_bad_step, self._epoch_images)  # a NaN/Inf step is not saved
                callbacks.save_checkpoint()
        shown = self._read_running(sums, first_bad_step, self._epoch_images)  # also waits for the GPU
        seconds = time.perf_counter() - started
        self.train_images += images * self.ctx.world_size
        self.train_seconds += seconds
        return {"train_loss": shown["loss"], "train_acc": shown["acc"], "lr": shown["lr"],
                "images_per_second": images * self.ctx.world_size / seconds}

    def _read_running(self, sums: torch.Tensor, first_bad_step: torch.Tensor,
                      images: int) -> dict[str, float]:
        """The epoch's running loss/accuracy on the host (one sync); stop at a NaN/Inf loss."""
        loss_sum, correct, bad = torch.cat([sums, first_bad_step.view(1).float()]).tolist()
        if bad >= 0:
            raise TrainingDiverged(f"retrain loss became NaN/Inf at epoch {self.epoch + 1}, "
                                   f"step {int(bad) + 1}")
        return {"loss": loss_sum / max(images, 1), "acc": correct / max(images, 1),
                "lr": float(self.optimizer.param_groups[0]["lr"])}

    def _train_step(self, inputs: torch.Tensor,
                    labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(self.ctx.device.type, dtype=self.autocast_dtype,
                            enabled=self.autocast_dtype is not None,
                            cache_enabled=self.graphed_step is None):  # capture needs the cache off
            logits, logits_aux = self.model(inputs)
            loss = F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)
            if self.distill is not None:
                loss = self.distill.blend(loss, logits, inputs)
            if logits_aux is not None:
                loss = loss + self.auxiliary_weight * F.cross_entropy(logits_aux, labels,
                                                                      label_smoothing=self.label_smoothing)
        if self.flat_grads is None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.flat_grads.zero_()
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        if self.flat_grads is None:
            self._clip_and_step()
        correct = (logits.detach().argmax(dim=1) == labels).sum()
        return loss.detach().float(), correct.float()

    def _lr_to_device(self) -> None:
        """With ``capture_once``, each group's learning rate as a tensor on the device (read by the fused step)."""
        if self.capture_once:
            for group in self.optimizer.param_groups:
                group["lr"] = torch.tensor(float(group["lr"]), device=self.ctx.device)

    def _clip_and_step(self) -> None:
        if self.flat_grads is not None:  # the ranks' summed gradients, averaged as DDP does
            self.flat_grads.average_()
        if self.scaler is None:
            nn.utils.clip_grad_norm_(self.network.parameters(), self.grad_clip)
            self.optimizer.step()
            return
        self.scaler.unscale_(self.optimizer)  # clip the true gradients; an overflow step is skipped below
        nn.utils.clip_grad_norm_(self.network.parameters(), self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()

    @torch.no_grad()
    def evaluate(self, loader: Any) -> dict[str, Any]:
        """Test loss, accuracy and each spiking neuron's mean firing rate over the whole loader."""
        if self.flat_grads is not None:  # as DDP does before every forward: rank 0's batch-norm statistics
            for buffer in self.network.buffers():
                dist.broadcast(buffer, src=0)
        self.network.eval()
        device = self.ctx.device
        sums = torch.zeros(3, device=device)  # summed loss, correct predictions, batches
        names: list[str] = []
        rate_sums: torch.Tensor | None = None
        images = 0
        with recording_firing_rates(self.network, True):
            for inputs, labels in loader:
                inputs = self._to_device(inputs)
                labels = labels.to(device, non_blocking=True)
                with torch.autocast(device.type, dtype=self.autocast_dtype,
                                    enabled=self.autocast_dtype is not None):
                    logits, _ = self.network(inputs)
                loss = F.cross_entropy(logits.float(), labels, reduction="sum")
                sums += torch.stack([loss, (logits.argmax(dim=1) == labels).sum().float(),
                                     sums.new_ones(())])
                images += labels.numel()
                # The auxiliary head is not run in evaluation: its neurons hold no rates of this pass.
                rates = {name: rate for name, rate in firing_rates(self.network).items()
                         if "auxiliary" not in name}
                if rates:  # one stack per batch, summed on the device
                    names = list(rates)
                    batch_rates = torch.stack([rate.float() for rate in rates.values()])
                    rate_sums = batch_rates if rate_sums is None else rate_sums + batch_rates
        if rate_sums is None:  # no spiking neurons (relu), still one tensor for the reduction
            rate_sums = sums.new_zeros(0)
        totals = torch.cat([sums, sums.new_tensor([images]), rate_sums])
        if self.ctx.distributed:  # each rank saw its shard of the test set
            dist.all_reduce(totals)
        loss_sum, correct, batches, images, *rate_totals = totals.tolist()
        return {"loss": loss_sum / images, "acc": correct / images,
                "firing_rates": {name: rate / batches for name, rate in zip(names, rate_totals)}}

    def metrics(self) -> dict[str, Any]:
        """What metrics.json reports about the finished run (test figures of the last epoch)."""
        rates = self.last_test["firing_rates"]
        per_layer: dict[str, list[float]] = {}
        for name, rate in rates.items():
            per_layer.setdefault(layer_of(name), []).append(rate)
        best = max(self.history, key=lambda record: record["test_acc"])
        return {
            "test_acc": self.last_test["acc"],
            "test_loss": self.last_test["loss"],
            "best_test_acc": best["test_acc"],
            "best_epoch": best["epoch"] + 1,
            "epochs": self.epochs,
            "params_m": self.parameters_m,
            "firing_rate_mean": sum(rates.values()) / len(rates) if rates else None,
            "firing_rate_per_layer": {layer: sum(v) / len(v) for layer, v in per_layer.items()},
            "train_images_per_second": self.train_images / max(self.train_seconds, 1e-9),
            # calls per path of the sparse-conv dispatcher over the run (train and test; "sparse": the Triton kernels)
            "sparse_conv_paths": dict(self.conv_paths),
            "peak_gpu_memory_gib": self.peak_gpu_memory_gib(),
            "history": self.history,
        }

    def peak_gpu_memory_gib(self) -> float | None:
        """The largest peak of the run's pieces: a resumed piece that only evaluates allocates less than training."""
        here = torch.cuda.max_memory_allocated(self.ctx.device) / 2**30 if self.ctx.device.type == "cuda" else None
        peaks = [peak for peak in (here, self._earlier_peak_gib) if peak is not None]
        return max(peaks) if peaks else None

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "global_step": self.global_step,
            "best_test_acc": self.best_test_acc,
            "history": self.history,
            "last_test": self.last_test,
            "throughput": [self.train_images, self.train_seconds],
            # a mid-epoch checkpoint: the epoch's sums so far, so its train loss/accuracy count every step
            "running": ([*self._epoch_sums.tolist(), self._epoch_images]
                        if self.step_in_epoch and self._epoch_sums is not None else None),
            "conv_paths": dict(self.conv_paths),
            "peak_gpu_memory_gib": self.peak_gpu_memory_gib(),
            "loss_scaler": None if self.scaler is None else self.scaler.state_dict(),  # fp16's current scale
            "rng": capture_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.network.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._lr_to_device()  # a checkpoint holds the learning rate as it was saved (a host float or tensor)
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch, self.step_in_epoch = state["epoch"], state["step_in_epoch"]
        self.global_step, self.best_test_acc = state["global_step"], state["best_test_acc"]
        self.history, self.last_test = list(state["history"]), state["last_test"]
        self.train_images, self.train_seconds = state["throughput"]
        self._carried_running = state.get("running")  # older checkpoints have none
        self.conv_paths = collections.Counter(state.get("conv_paths", {}))  # older checkpoints have none
        self._earlier_peak_gib = state.get("peak_gpu_memory_gib")  # older checkpoints have none
        if self.scaler is not None and state.get("loss_scaler"):  # a run saved in another precision has none
            self.scaler.load_state_dict(state["loss_scaler"])
        restore_rng_state(state["rng"])
