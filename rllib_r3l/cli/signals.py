"""Signals while ``rllib-r3l train`` runs: SIGTERM (what Slurm and Kubernetes send to preempt) does what Ctrl-C
does, before Tune runs and while it does; a signal to the whole process group that also stopped Ray's GCS
ends the command at once with the advice instead of a minute's wait and exit 1."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Callable, List, Optional

from rllib_r3l import ray_internals

_STOPS_BEFORE_TUNE: List[int] = []  # SIGTERMs that arrived before Tune's handler could take them


def stop_requested_before_tune() -> bool:
    """Whether a SIGTERM arrived before Tune ran: its KeyboardInterrupt can be swallowed on the way (a
    finalizer, a library's ``except BaseException`` while Ray starts), and the run then trained to its end
    with exit 0; the driver checks this before Tune starts and :class:`ConsoleCallback` at Tune's first step."""
    return bool(_STOPS_BEFORE_TUNE)


def interrupt_on_sigterm() -> None:
    """Until Tune runs (the experiment checks, Ray starting; a SIGTERM would end ``train`` with
    Ray's ``sys.exit(15)`` and no word): SIGTERM stops the command as Ctrl-C does, exit 130 with the advice;
    a second one exits 130 at once."""

    def handler(signum, frame):
        _STOPS_BEFORE_TUNE.append(signum)
        signal.signal(signal.SIGTERM, lambda *_: os._exit(130))
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def sigterm_as_sigint(on_runtime_lost: Optional[Callable[[], None]] = None):
    """SIGTERM (what Slurm and Kubernetes send to preempt) does what Ctrl-C does: Tune's SIGINT handler
    stops the run at a safe point and keeps the last checkpoint; a second signal ends it at once.

    With ``on_runtime_lost`` (Ray started by this process): a SIGTERM sent to the whole process group
    (``timeout``, Slurm's ``scancel``) also stops Ray's GCS (see :func:`local_gcs_alive`), and Tune's
    stop would wait on it for a minute before Ray's core worker ends this process with exit 1. A thread
    started by the signal asks the GCS for a few seconds; when it no longer answers and the run is not
    over, ``on_runtime_lost()`` says what to do next and the process exits 130 at once. Yields an Event
    to set when the run is over (Ray's own shutdown then stops the GCS: no loss)."""
    finished = threading.Event()

    def watch_runtime():
        deadline = time.time() + RUNTIME_WATCH_S
        while time.time() < deadline and not finished.is_set():
            if local_gcs_alive(timeout_s=1.0) is False and not finished.is_set():
                with contextlib.suppress(Exception):
                    on_runtime_lost()
                os._exit(130)
            time.sleep(0.2)

    def forward(signum, frame):
        if on_runtime_lost is not None and not finished.is_set():
            threading.Thread(target=watch_runtime, name="r3l-runtime-watch", daemon=True).start()
        handler = signal.getsignal(signal.SIGINT)  # Tune's while it runs; Python's (KeyboardInterrupt) after
        if handler is signal.default_int_handler and not finished.is_set():  # Tune not running yet
            _STOPS_BEFORE_TUNE.append(signum)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:  # SIG_IGN / SIG_DFL: nothing of ours would stop the run
            raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield finished
        return
    previous = signal.signal(signal.SIGTERM, forward)
    try:
        yield finished
    finally:
        finished.set()
        signal.signal(signal.SIGTERM, previous)


RUNTIME_WATCH_S = 6.0  # a group signal stops the GCS within a second; a plain stop never does


def local_gcs_alive(timeout_s: float = 2.0) -> Optional[bool]:
    """Whether the GCS of this process's Ray session still answers (None: no Ray session here).

    A SIGTERM sent to the whole process group (``timeout``, Slurm's ``scancel``) reaches the GCS this
    process started too (Ray's processes block SIGINT, not SIGTERM): it stops answering though its
    process lives on; ``ray.shutdown()`` then waits a minute and Ray's core worker ends the process
    with exit 1. One key lookup with a short timeout tells."""
    try:  # in a signal handler: never raise (train checked the Ray version before it started)
        client = ray_internals.gcs_client()
    except Exception:  # noqa: BLE001
        return None
    if client is None:
        return None
    try:
        client.internal_kv_exists(b"__r3l_alive", b"r3l", timeout=timeout_s)
        return True
    except Exception:  # noqa: BLE001 - RpcError: "Timed out while waiting for GCS to become available"
        return False


@contextlib.contextmanager
def noted(arrived: List[int]):
    """Append to ``arrived`` every signal the process received inside the block, whatever handler took it
    (Python's wakeup fd gets one byte per signal): ``ray.init`` installs its own SIGTERM handler, whose
    ``sys.exit`` can be swallowed on the way out, and the run then trained to its end with exit 0."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        try:
            arrived.extend(os.read(read_end, 4096))
        except BlockingIOError:  # nothing arrived
            pass
        os.close(read_end)
        os.close(write_end)


@contextlib.contextmanager
def unraisable_stops_quiet():
    """Inside the block, a stop raised where Python cannot raise it (Ray's SIGTERM handler's ``SystemExit``
    landing in logging's fork hook while ``ray.init`` starts its processes) prints no "Exception ignored ...
    Traceback": :func:`noted` records the signal and the caller stops with exit 130 and the advice. Any other
    unraisable exception still goes to the hook that was there before."""
    import sys

    previous = sys.unraisablehook

    def hook(unraisable):
        if not isinstance(unraisable.exc_value, (KeyboardInterrupt, SystemExit)):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def exit_process(code: int) -> None:
    """End a command's process with ``code``: the exit hooks run (Ray's, logging's), the interpreter's
    teardown of torch's and vLLM's modules (about a second) is skipped, and a signal while it ends keeps
    ``code`` (with SIGTERM back at its default it exited 143)."""
    import atexit
    import sys

    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(code))
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def init_ray(reinstall: Callable[[], None], **kwargs) -> None:
    """``ray.init(**kwargs)``, then ``reinstall()`` our SIGTERM handler (ray.init installs its own, whose
    ``sys.exit`` may be swallowed inside it); a SIGTERM that arrived meanwhile raises KeyboardInterrupt."""
    import ray

    arrived: List[int] = []
    try:
        with noted(arrived), unraisable_stops_quiet():
            ray.init(**kwargs)
    except SystemExit as e:  # Ray's own SIGTERM handler, installed first thing in ray.init
        if e.code != signal.SIGTERM:
            raise
        raise KeyboardInterrupt from None
    reinstall()
    if signal.SIGTERM in arrived:  # it arrived while Ray started and its SystemExit went nowhere
        raise KeyboardInterrupt
