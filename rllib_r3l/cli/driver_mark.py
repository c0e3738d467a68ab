"""Is the driver of an experiment still running? A mark in the experiment folder says who runs it.

Tune saves a trial's status in its experiment state only now and then; a driver that is killed, or
stopped by Ctrl-C, can leave its trials ``RUNNING`` there for good, and ``rllib-r3l report`` called
them running. ``rllib-r3l train`` therefore writes :data:`MARK` (host, pid, the process's start time)
into each experiment folder while it runs it and marks it ended when it returns; :func:`driver_alive`
tells a live driver from an ended or dead one (a reused pid has another start time).

The mark is written once Ray runs; two drivers started together would both pass before it exists and
merge into one experiment. :func:`claims` therefore takes an exclusive lock (``flock``, released when the
process ends, however it ends) on a lock file beside each experiment folder before anything is planned.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from typing import Callable, Iterator, List, Optional

from rllib_r3l.errors import UsageError

MARK = ".r3l-driver.json"


def _start_time(pid: int) -> Optional[float]:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - no such process (or no psutil): not running
        return None


@contextlib.contextmanager
def marked(exp_dir: str) -> Iterator[None]:
    """Mark ``exp_dir`` as run by this process for the duration of the block."""
    os.makedirs(exp_dir, exist_ok=True)
    path = os.path.join(exp_dir, MARK)
    with open(path, "w") as f:
        json.dump({"host": socket.gethostname(), "pid": os.getpid(), "started": _start_time(os.getpid())}, f)
    try:
        yield
    finally:  # kept, marked ended: Tune's state can say RUNNING after a Ctrl-C too
        with contextlib.suppress(OSError, ValueError):
            with open(path) as f:
                mark = json.load(f)
            with open(path, "w") as f:
                json.dump({**mark, "ended": time.time()}, f)


def driver_alive(exp_dir: str) -> Optional[bool]:
    """True: a live process on this host runs the experiment; False: its driver is gone (killed, or on
    this host no more); None: no mark (not run by ``rllib-r3l train``, or another host's driver)."""
    try:
        with open(os.path.join(exp_dir, MARK)) as f:
            mark = json.load(f)
        host, pid, started = mark["host"], int(mark["pid"]), mark.get("started")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if mark.get("ended"):
        return False
    if host != socket.gethostname():
        return None
    now = _start_time(pid)
    return now is not None and (started is None or abs(now - float(started)) < 1.0)


def running_pid(exp_dir: str) -> Optional[int]:
    """The pid of the live driver on this host that runs ``exp_dir`` now, or None."""
    if not driver_alive(exp_dir):
        return None
    try:
        with open(os.path.join(exp_dir, MARK)) as f:
            return int(json.load(f)["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lock_path(exp_dir: str) -> str:
    """The lock file of ``exp_dir``: beside it, so that claiming creates no experiment folder."""
    exp_dir = os.path.abspath(exp_dir)
    return os.path.join(os.path.dirname(exp_dir), f".{os.path.basename(exp_dir)}.r3l-lock")


def _lock(path: str) -> Optional[int]:
    """An fd holding an exclusive lock on ``path``, or None when another process holds it. A lock whose file
    was unlinked by its releasing holder between our open and our lock is on a stale inode: tried again."""
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _held_by(fd)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise OSError(f"could not lock {path}: its file kept being replaced")


class _Held(int):
    """An fd another process locks (its pid read from the file), returned by ``_lock`` as a refusal."""


PID_WAIT_S = 2.0  # the holder writes its pid just after it locks; a loaded machine can delay that write


def _held_by(fd: int, wait_s: float = PID_WAIT_S) -> int:
    """The pid the holder wrote, waiting up to ``wait_s`` for it (-1: none came): two drivers started together
    see the lock taken before its holder wrote its pid."""
    deadline = time.monotonic() + wait_s
    while True:
        pid = os.pread(fd, 64, 0).decode(errors="replace").strip()
        if pid.isdigit() or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    os.close(fd)
    return _Held(int(pid) if pid.isdigit() else -1)


@contextlib.contextmanager
def claims() -> Iterator[Callable[[str, str], None]]:
    """``claim(exp_dir, name)`` inside the block takes ``exp_dir`` for this process until the block ends.

    A folder another live process holds raises :class:`UsageError` naming that process. A lock file that
    cannot be written (read-only or missing storage) is no claim: the storage check refuses that run itself.
    The lock file is removed when the block ends (while still locked, so no one else can hold it then)."""
    held: List[tuple] = []

    def claim(exp_dir: str, name: str) -> None:
        path = lock_path(exp_dir)
        if any(p == path for p, _fd in held):
            return
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = _lock(path)
        except OSError:
            return
        if isinstance(fd, _Held):
            who = f"process {int(fd)} on this host" if fd > 0 else "another process on this host"
            stop = f"kill -TERM {int(fd)}" if fd > 0 else "kill -TERM its process"
            raise UsageError(
                f"experiment {name!r} in {exp_dir} is being run by another `rllib-r3l train` now ({who}); "
                f"wait for it to end, or stop it first (Ctrl-C in its terminal, or {stop}), then "
                "--resume; or pass --new to start another run beside it"
            )
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        held.append((path, fd))

    try:
        yield claim
    finally:
        for path, fd in held:
            with contextlib.suppress(OSError):
                os.unlink(path)
            with contextlib.suppress(OSError):
                os.close(fd)
