"""Writing files so that a reader never sees half of one.

The profile cache, plan files and checkpoints are all written to a temporary file in the target's
directory, flushed to disk and renamed over the target with ``os.replace`` (atomic on POSIX): a
crash leaves the previous file or the new one, never a torn one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Callable


def atomic_write(path: str | os.PathLike, write: Callable[[IO], None], *, binary: bool = False,
                 mode: int = 0o644) -> Path:
    """Call ``write(file)`` on a temporary file and move it over `path`; returns the path.

    `mode` replaces mkstemp's 0600, which would hide the file from other users of a shared volume.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        os.chmod(tmp, mode)
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return p
