"""Checkpoint files that a crash, Ctrl-C or SIGKILL at any moment can never corrupt.

`save_checkpoint` writes to a temporary file beside the target, fsyncs it, renames it over the
target (atomic on POSIX: a reader sees the old file or the new one, never a mix) and fsyncs the
directory so that the rename itself is durable. A process killed mid-write leaves at most a
stale ``.<name>.tmp`` that the next save overwrites; a write that fails (disk full, read-only
directory) removes it and raises `CheckpointWriteError`, the previous file untouched.

`load_checkpoint` turns every way a file can be unusable (missing, truncated, not ours, written
by the other entry point or an older format) into one `CheckpointError` line naming the file
and the fix; `restore_errors` does the same for a checkpoint that loads but does not fit the
model or engine it is restored into.
"""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from search_space.errors import UserInputError

FORMAT_VERSION = 1
_HEADER_KEY = "aso_se_checkpoint"


class CheckpointError(UserInputError):
    """A checkpoint file or resume directory that cannot be used."""


class CheckpointWriteError(Exception):
    """A checkpoint or result file could not be written (disk full, read-only or missing directory)."""

    def __init__(self, path: Path, what: str, err: OSError) -> None:
        self.path = path
        super().__init__(f"could not write {what}{path}: {_one_line(err)}; free space or make "
                         f"{path.parent} writable")


def save_checkpoint(state: Mapping[str, Any], path: str | os.PathLike[str], *, kind: str) -> None:
    """Atomically write ``state`` (plus a header naming ``kind`` and the format) to ``path``."""
    payload = {_HEADER_KEY: {"kind": kind, "version": FORMAT_VERSION}, **state}
    _write_atomically(Path(path), lambda f: torch.save(payload, f), what="checkpoint ")


def save_json(obj: Any, path: str | os.PathLike[str]) -> None:
    """Atomically write ``obj`` as indented JSON (genotypes, metrics)."""
    _write_atomically(Path(path), lambda f: f.write(json.dumps(obj, indent=2).encode() + b"\n"))


def _write_atomically(path: Path, write: Callable[[BinaryIO], object], what: str = "") -> None:
    """Temp file beside ``path``, fsync, rename over ``path``, fsync the directory.

    Any failure (an OSError becomes `CheckpointWriteError`; a second Ctrl-C propagates) removes
    the temporary file, so a full disk is not left fuller and ``path`` keeps its previous content.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise CheckpointWriteError(path, what, err) from err
        raise


def load_checkpoint(path: str | os.PathLike[str], *, kind: str) -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint` for ``kind``, onto the CPU."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; pass resume=<a run dir that has "
                              f"checkpoints/last.pt>, or drop resume= to start a new run")
    try:
        # weights_only keeps loading safe: checkpoints hold only tensors and plain containers.
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as err:
        raise CheckpointError(f"checkpoint {path} is unreadable (truncated or corrupt: "
                              f"{_one_line(err)}); "
                              f"resume from another run, or delete it to start again") from err
    header = payload.get(_HEADER_KEY) if isinstance(payload, dict) else None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is not an ASO-SE checkpoint; pass a file written by "
                              f"search.py or train.py")
    if header.get("kind") != kind:
        raise CheckpointError(f"checkpoint {path} was written by the {header.get('kind')} entry "
                              f"point, not {kind}; resume it with {header.get('kind')}.py")
    if header.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {header.get('version')}, "
                              f"this code reads version {FORMAT_VERSION}; start a new run")
    return {key: value for key, value in payload.items() if key != _HEADER_KEY}


@contextlib.contextmanager
def restore_errors(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn a state that does not fit (missing keys, shape mismatch) into one CheckpointError."""
    try:
        yield
    except UserInputError:
        raise
    except (RuntimeError, KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} does not fit this code or config "
                              f"({_one_line(err)}); "
                              f"start a new run, or resume with the code that wrote it") from err


def _one_line(err: BaseException, limit: int = 300) -> str:
    """The error's message on one line (torch puts the useful part on its second line)."""
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    text = text or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."

