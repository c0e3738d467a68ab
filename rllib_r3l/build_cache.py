"""Where built models live: a cache directory, and builds that happen once, safely.

``build_once(target, builder)`` runs ``builder`` into a temporary directory beside ``target``
under an exclusive lock file, writes a completion marker with the builder's metadata, and
publishes the directory by an atomic rename. Several processes (Ray actors) asking for the same
model at once build it once; a crash leaves no half-built directory in place. ``rllib_r3l.models``
uses it for the models it converts or builds offline.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

COMPLETE_MARKER = ".rllib_r3l_complete.json"


def cache_root(cache_dir: Optional[Union[str, os.PathLike]] = None) -> Path:
    """Directory holding the converted / built model directories."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("RLLIB_R3L_CACHE")
    if env:
        return Path(env).expanduser() / "models"
    return Path.home() / ".cache" / "rllib_r3l" / "models"


def is_complete(path: Path) -> bool:
    return (path / COMPLETE_MARKER).is_file()


@contextlib.contextmanager
def file_lock(lock_path: Path, timeout_s: float = 1800.0) -> Iterator[None]:
    """An exclusive advisory lock (flock) on ``lock_path``; released when the process dies."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(lock_path), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"waited {timeout_s:.0f} s for the lock {lock_path}; "
                        "another process seems stuck building the model (delete the lock file "
                        "if no such process exists)"
                    ) from None
                time.sleep(0.2)
        yield
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def build_once(target: Path, builder: Callable[[Path], dict]) -> Path:
    """Build ``target`` with ``builder(tmp_dir)`` once, atomically, under a lock.

    ``builder`` writes the model into a fresh temporary directory beside ``target`` and returns
    metadata stored in the completion marker; the directory is then renamed into place.
    """
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{target.name}.lock"):
        if is_complete(target):  # another process finished while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=str(target.parent)))
        try:
            t0 = time.perf_counter()
            meta = dict(builder(tmp) or {})
            meta["build_seconds"] = round(time.perf_counter() - t0, 2)
            (tmp / COMPLETE_MARKER).write_text(json.dumps(meta, indent=1))
            os.chmod(tmp, 0o755)  # mkdtemp makes it private
            if target.exists():  # an incomplete leftover (crash before the marker): replace it
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target
