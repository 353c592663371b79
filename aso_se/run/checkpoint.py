"""Checkpoint files: their format, the history kept beside the newest, and every way one can be unusable.

`save_checkpoint` writes through `aso_se.run.atomic_write` (a crash, Ctrl-C or SIGKILL at any moment
leaves the old file or the new one, never a mix).

`save_checkpoint(..., keep=n)` keeps the n - 1 previous files beside the newest (``last.1.pt`` the one
before, ...), linked before the new file replaces the name, so a good state always has a name; and
`load_newest_readable` falls back to them when the newest is truncated or corrupt.

`CheckpointWriter` writes them on a background thread when asked (the epoch-end saves: rank 0 packs the state
and copies it to the host, then goes on training while the file is written; every other rank would wait for it
at the next step's allreduce). One write at a time; the next save, or the end of the run, waits for it and
raises what it raised.

`load_checkpoint` turns every way a file can be unusable (missing, truncated, not ours, written
by the other entry point or an older format) into one `CheckpointError` line naming the file
and the fix; `restore_errors` does the same for a checkpoint that loads but does not fit the
model or engine it is restored into.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from aso_se.run.atomic_write import one_line, write_atomically
from aso_se.run.packed_tensors import loose_tensors_to_host, pack, unpack
from search_space.errors import UserInputError

FORMAT_VERSION = 3  # 3: tensors packed (aso_se.run.packed_tensors); 2 was an earlier packing, never released
_READABLE_VERSIONS = (1, 3)
_HEADER_KEY = "aso_se_checkpoint"
_PACKED_KEY = "aso_se_packed_tensors"


class CheckpointError(UserInputError):
    """A checkpoint file or resume directory that cannot be used."""


class UnreadableCheckpoint(CheckpointError):
    """A checkpoint file that is truncated or corrupt (a predecessor may be loaded instead)."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"checkpoint {path} is unreadable (truncated or corrupt: {reason}); "
                         f"resume from another run, or delete it to start again")


def save_checkpoint(state: Mapping[str, Any], path: str | os.PathLike[str], *, kind: str, keep: int = 1) -> None:
    """Atomically write ``state`` (plus a header naming ``kind`` and the format) to ``path``, keeping the
    ``keep - 1`` previous checkpoints as ``older(path, 1)``, ``older(path, 2)``, ... (newest first)."""
    _write_payload(_host_payload(state, kind), Path(path), keep)


class CheckpointWriter:
    """`save_checkpoint`, optionally on a background thread (module docstring). Writes happen in the order of
    the saves; at most two are pending (a third save waits for the oldest)."""

    _MAX_PENDING = 2

    def __init__(self) -> None:
        self._pending: list[threading.Thread] = []
        self._error: BaseException | None = None

    def save(self, state: Mapping[str, Any], path: str | os.PathLike[str], *, kind: str, keep: int = 1,
             background: bool = False) -> None:
        """`save_checkpoint`; with ``background`` the file is written after this returns (``state`` is copied
        to the host first, so training may change it at once). Raises the error of an earlier background write."""
        if not background:
            self.wait()
            save_checkpoint(state, path, kind=kind, keep=keep)
            return
        self._raise_error()
        while len(self._pending) >= self._MAX_PENDING:
            self._pending.pop(0).join()
        payload, previous = _host_payload(state, kind), (self._pending[-1] if self._pending else None)

        def write() -> None:
            if previous is not None:
                previous.join()  # in the order saved: an older file never replaces a newer one
            try:
                _write_payload(payload, Path(path), keep)
            except BaseException as err:  # raised in the caller's thread by the next save or wait()
                self._error = self._error or err

        thread = threading.Thread(target=write, name="checkpoint-writer")
        thread.start()
        self._pending.append(thread)

    def wait(self, timeout_s: float | None = None) -> None:
        """Until the background writes are done (or ``timeout_s`` passed); raises the first one's error."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._pending:
            self._pending[0].join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if self._pending[0].is_alive():
                return
            self._pending.pop(0)
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def _host_payload(state: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """What torch.save writes: the header, the packed state's skeleton, its flats on the host. Nothing in it
    shares memory with ``state`` (the flats and table are new tensors, the containers rebuilt)."""
    skeleton, packed = pack(dict(state))
    skeleton = loose_tensors_to_host(skeleton)
    return {_HEADER_KEY: {"kind": kind, "version": FORMAT_VERSION}, **skeleton,
            _PACKED_KEY: {"flats": [flat.cpu() for flat in packed["flats"]], "table": packed["table"]}}


def _write_payload(payload: Mapping[str, Any], path: Path, keep: int) -> None:
    write_atomically(path, lambda f: torch.save(payload, f), what="checkpoint ",
                     before_replace=lambda: _shift_history(path, keep))


def older(path: Path, age: int) -> Path:
    """The name of the checkpoint saved ``age`` saves before ``path``'s (``last.pt`` -> ``last.1.pt``)."""
    return path if age == 0 else path.with_name(f"{path.stem}.{age}{path.suffix}")


def history(path: Path) -> list[Path]:
    """``path`` and its kept predecessors that exist, newest first."""
    found, age = [], 0
    while True:
        candidate = older(path, age)
        if candidate.is_file():
            found.append(candidate)
        elif age > 0:
            return found
        age += 1


def _shift_history(path: Path, keep: int) -> None:
    """Age the kept files by one (the oldest beyond ``keep`` dropped); ``path``'s current file gets a second
    name, ``older(path, 1)``, so that replacing ``path`` leaves it in place (a copy where links fail)."""
    if keep < 2 or not path.is_file():
        return
    older(path, keep - 1).unlink(missing_ok=True)
    for age in range(keep - 2, 0, -1):
        if older(path, age).is_file():
            os.replace(older(path, age), older(path, age + 1))
    try:
        os.link(path, older(path, 1))
    except OSError:
        shutil.copy2(path, older(path, 1))


def load_newest_readable(path: Path, *, kind: str, warn: Callable[[str], None],
                         set_aside: bool = True) -> tuple[dict[str, Any], Path]:
    """The newest of ``history(path)`` that loads, and its path. A truncated or corrupt one gets one ``warn``
    line naming it and, with ``set_aside`` (one process of a run), is renamed to ``<name>.corrupt``: kept for
    a look, out of the history that later saves age."""
    candidates = history(path) or [path]
    for index, candidate in enumerate(candidates):
        if index and not candidate.is_file():  # set aside meanwhile by the process that owns the run dir
            continue
        try:
            return load_checkpoint(candidate, kind=kind), candidate
        except UnreadableCheckpoint as err:
            if index + 1 == len(candidates):
                raise
            moved = ""
            if set_aside:
                os.replace(candidate, candidate.with_name(candidate.name + ".corrupt"))
                moved = f"; moved to {candidate.name}.corrupt"
            warn(f"{err.path} is unreadable ({err.reason}){moved}; resuming from {candidates[index + 1]}, "
                 f"the checkpoint saved before it")
    raise AssertionError("unreachable: the loop returns or raises")


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
        raise UnreadableCheckpoint(path, one_line(err)) from err
    header = payload.get(_HEADER_KEY) if isinstance(payload, dict) else None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is not an ASO-SE checkpoint; pass a file written by "
                              f"search.py or train.py")
    if header.get("kind") != kind:
        raise CheckpointError(f"checkpoint {path} was written by the {header.get('kind')} entry "
                              f"point, not {kind}; resume it with {header.get('kind')}.py")
    if header.get("version") not in _READABLE_VERSIONS:
        raise CheckpointError(f"checkpoint {path} has format version {header.get('version')}, "
                              f"this code reads versions {_READABLE_VERSIONS}; start a new run")
    state = {key: value for key, value in payload.items() if key not in (_HEADER_KEY, _PACKED_KEY)}
    return unpack(state, payload[_PACKED_KEY]) if _PACKED_KEY in payload else state  # format 1: as saved


@contextlib.contextmanager
def restore_errors(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn a state that does not fit (missing keys, shape mismatch) into one CheckpointError."""
    try:
        yield
    except UserInputError:
        raise
    except (RuntimeError, KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} does not fit this code or config "
                              f"({one_line(err)}); "
                              f"start a new run, or resume with the code that wrote it") from err
