"""``resume=<run_dir>``: a run continues from its checkpoint with the config it saved.

A resume takes only the settings of where it runs (`RESUME_KEYS`: this machine's data and the SNN's final
evaluation) and of the launcher; any other override is bad input, since it would change the run midway.
"""
from __future__ import annotations

import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from aso_se.run.checkpoint import load_newest_readable
from aso_se.train.snn_finetune import FinetuneSettings
from search_space.errors import UserInputError

log = logging.getLogger(__name__)

# What a resume may set anew: where this machine keeps the data and how many processes read it
# (``+data.root=<dir>``: the default config a resume composes, mnist5k's, has no root).
MACHINE_KEYS = ("data.root", "data.num_workers")
# How a finished QANN run's SNN is fine-tuned: settable until its fine-tuning starts (one QANN, fine-tuned at several
# T from copies of its run dir).
FINETUNE_START_KEYS = ("snn_finetune.timesteps", "snn_finetune.lr", "snn_finetune.surrogate",
                       "snn_finetune.early_timesteps", "snn_finetune.early_weight", "snn_finetune.batch_size")
# ... and how train.py evaluates the exact SNN at the end: evaluation only, the training is unchanged. A finished
# QANN run may also be resumed to fine-tune its SNN, or to fine-tune it for longer.
EVALUATION_KEYS = ("snn_max_timesteps", "snn_first_timesteps", "snn_eval_samples", "snn_eval_dtype",
                   "snn_spikes_per_step", "snn_finetune.epochs", *FINETUNE_START_KEYS)
# Evaluation settings newer than some saved runs: their defaults, so that those runs resume (and re-evaluate).
NEWER_EVALUATION_DEFAULTS = {"snn_spikes_per_step": 1, "snn_first_timesteps": None,
                             "snn_finetune": asdict(FinetuneSettings())}
RESUME_KEYS = MACHINE_KEYS + EVALUATION_KEYS


def is_launcher_override(override: str) -> bool:
    """Where a multirun's jobs run (``+sweep=local_gpus`` and its ``sweep.*`` keys): the launcher's, not the run's
    config, so a resume takes them too (benchmarks continue unfinished runs through the same launcher)."""
    key = override.split("=", 1)[0].lstrip("+")
    return key == "sweep" or key.startswith("sweep.")


def load_resumed(checkpoint_path: Path, entry_point: str) -> tuple[dict[str, Any], DictConfig]:
    """The state to resume from ``checkpoint_path`` (or the one saved before it, if it is unreadable) and
    the config to go on with: the saved one, fitted to this launch, with the resume's allowed overrides."""
    overrides = [o for o in HydraConfig.get().overrides.task
                 if not o.startswith("resume=") and not is_launcher_override(o)]
    allowed = [o for o in overrides if o.split("=", 1)[0].lstrip("+") in RESUME_KEYS]
    extra = [o for o in overrides if o not in allowed]
    if extra:
        raise UserInputError(f"resume continues a run with its saved config; drop the "
                             f"overrides {' '.join(extra)} (a resume takes only {', '.join(RESUME_KEYS)}), "
                             f"or start a new run with them")
    # A truncated or corrupt last.pt: the one saved before it (trainer.keep_checkpoints); rank 0 sets it aside.
    state, _ = load_newest_readable(checkpoint_path, kind=entry_point, warn=log.warning,
                                    set_aside=int(os.environ.get("RANK", "0")) == 0)
    cfg = OmegaConf.create(state["config"])
    if entry_point == "train":
        for key, default in NEWER_EVALUATION_DEFAULTS.items():
            cfg.setdefault(key, default)
            if isinstance(default, dict):  # settings added to a group since the run was saved
                for name, value in default.items():
                    cfg[key].setdefault(name, value)
    _fit_to_this_launch(cfg, state.get("world_size"))
    for override in allowed:  # where this machine keeps the data (a run dir copied here resumes), the SNN's eval
        key, value = override.split("=", 1)
        key = key.lstrip("+")  # +data.root=: the default data set (mnist5k) has no root to override
        if key not in cfg and OmegaConf.select(cfg, key) is None:  # snn_eval_samples: null is a value
            group, _, name = key.rpartition(".")
            raise UserInputError(f"{override}: this run's {group or 'config'} has no {name} setting; drop it "
                                 f"from the resume")
        value = yaml.safe_load(value)
        if key in FINETUNE_START_KEYS and "snn_trainer" in state and OmegaConf.select(cfg, key) != value:
            raise UserInputError(f"{override}: this run's fine-tuning already started with {key}="
                                 f"{OmegaConf.select(cfg, key)}; drop it from the resume, or resume a copy of the run "
                                 "saved before its fine-tuning")
        OmegaConf.update(cfg, key, value, merge=False)
    return state, cfg


def _fit_to_this_launch(cfg: DictConfig, saved_world: int | None) -> None:
    """A run saved by N processes resumed by M (torchrun's WORLD_SIZE, else 1): the same global batch,
    ``batch_size`` per process × N / M, so every global step reads the same images (ShardSampler
    deals each step's block out round-robin); a batch that M processes cannot split is bad input."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if saved_world is None or saved_world == world:
        return
    global_batch = cfg.batch_size * saved_world
    if global_batch % world:
        raise UserInputError(f"this run trained with a global batch of {global_batch} (batch_size="
                             f"{cfg.batch_size} on {saved_world} processes), which {world} processes cannot "
                             f"split evenly; resume it on a number of processes that divides {global_batch}")
    cfg.batch_size = global_batch // world
    finetune_batch = OmegaConf.select(cfg, "snn_finetune.batch_size")
    if finetune_batch is not None:  # the fine-tuning's own per-process batch, kept global in the same way
        if finetune_batch * saved_world % world:
            raise UserInputError(f"this run fine-tunes with a global batch of {finetune_batch * saved_world}, which "
                                 f"{world} processes cannot split evenly; resume it on a number of processes that "
                                 f"divides it")
        cfg.snn_finetune.batch_size = finetune_batch * saved_world // world
    cfg.trainer.ddp = world > 1
    if int(os.environ.get("RANK", "0")) == 0:
        log.warning("resumed on %d process%s (saved on %d): batch_size per process %d -> %d, the global batch "
                    "of %d is kept", world, "" if world == 1 else "es", saved_world, global_batch // saved_world,
                    cfg.batch_size, global_batch)
