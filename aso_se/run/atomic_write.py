"""Files that a crash, Ctrl-C or SIGKILL at any moment can never corrupt: checkpoints and result JSON.

`write_atomically` writes to a temporary file beside the target, fsyncs it, renames it over the target
(atomic on POSIX: a reader sees the old file or the new one, never a mix) and fsyncs the directory so that
the rename itself is durable. A process killed mid-write leaves at most a stale ``.<name>.tmp`` that the next
write overwrites; a write that fails (disk full, read-only directory) removes it and raises
`CheckpointWriteError`, the previous file untouched.
"""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


class CheckpointWriteError(Exception):
    """A checkpoint or result file could not be written (disk full, read-only or missing directory)."""

    def __init__(self, path: Path, what: str, err: OSError) -> None:
        self.path = path
        super().__init__(f"could not write {what}{path}: {one_line(err)}; free space or make "
                         f"{path.parent} writable")


def save_json(obj: Any, path: str | os.PathLike[str]) -> None:
    """Atomically write ``obj`` as indented JSON (genotypes, metrics)."""
    write_atomically(Path(path), lambda f: f.write(json.dumps(obj, indent=2).encode() + b"\n"))


def write_atomically(path: Path, write: Callable[[BinaryIO], object], what: str = "",
                     before_replace: Callable[[], None] = lambda: None) -> None:
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
        before_replace()
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


def one_line(err: BaseException, limit: int = 300) -> str:
    """The error's message on one line (torch puts the useful part on its second line)."""
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    text = text or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
