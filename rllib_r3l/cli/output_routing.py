"""Where a training run's output goes: the user's console, and a log file for everything else.

:class:`Console` writes the user's lines and one live line that the next line replaces;
:func:`routed_output` redirects the process's stdout/stderr at the file-descriptor level (engine
output from C/C++, Python warnings, progress bars, library loggers with their own handlers) into a
log file, and still shows R3L's own errors as one console line each. Used by
``rllib_r3l.cli.console`` (re-exported there) for ``python -m rllib_r3l.cli.main`` and ``rllib-r3l train``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import threading
import time
from typing import Iterator, List, Optional, Sequence, TextIO

LOG_TAIL_LINES = 30


class Console:
    """Lines for the user, and one live line that the next line replaces (on a terminal)."""

    def __init__(self, stream: TextIO, live_interval: Optional[float] = None) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        # on a terminal the live line is redrawn in place every second; in a log, a line every 30 s
        self.live_interval = live_interval if live_interval is not None else (1.0 if self.tty else 30.0)
        self._lock = threading.Lock()
        self._live_shown = False

    def line(self, text: str = "") -> None:
        with self._lock:
            self._clear_live()
            self.stream.write(text + "\n")
            self.stream.flush()

    def lines(self, texts: Sequence[str]) -> None:
        for t in texts:
            self.line(t)

    def live(self, text: str) -> None:
        with self._lock:
            if self.tty:
                width = shutil.get_terminal_size((120, 20)).columns
                self.stream.write("\r\033[K" + text[: width - 1])
                self._live_shown = True
            else:
                self.stream.write(text + "\n")
            self.stream.flush()

    def _clear_live(self) -> None:
        if self._live_shown:
            self.stream.write("\r\033[K")
            self._live_shown = False


class _ConsoleErrors(logging.Handler):
    """R3L's own errors also get one line on the console (the details are in the log)."""

    def __init__(self, console: Console, log: str) -> None:
        super().__init__(level=logging.ERROR)
        self.console, self.log = console, log

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.split(".")[0] not in ("rllib_r3l", "environments"):
            return
        first = str(record.getMessage()).strip().splitlines()[:1]
        self.console.line(f"  ! {record.name}: {first[0] if first else ''} (details: {self.log})")


class _LogStream:
    """The log file as the process's stdout/stderr, surviving a full disk: the first write that fails
    is one console line (the path and why), and later output is dropped instead of raising inside
    whatever library was printing (Tune's progress table turned a full disk into a traceback)."""

    def __init__(self, f: TextIO, path: str) -> None:
        self._f, self.path = f, path
        self.failed: Optional[OSError] = None
        self.console: Optional[Console] = None

    def write(self, s: str) -> int:
        if self.failed is None:
            try:
                return self._f.write(s)
            except OSError as e:
                self._fail(e)
        return len(s)

    def flush(self) -> None:
        if self.failed is None:
            try:
                self._f.flush()
            except OSError as e:
                self._fail(e)

    def _fail(self, e: OSError) -> None:
        self.failed = e
        if self.console is not None:
            self.console.line(f"  ! the log is not written any more ({e.strerror or e}): {self.path}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._f.close()

    def __getattr__(self, name: str):  # fileno, isatty, encoding, closed, ...
        return getattr(self._f, name)


QUIET_ENV = {
    "TQDM_DISABLE": "1",  # progress bars (transformers, huggingface_hub, vLLM) would fill the log with \r
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "warning",
}


@contextlib.contextmanager
def routed_output(log_path: str, verbose: bool = False) -> Iterator[Console]:
    """Send everything the process (and the processes it starts) writes to stdout/stderr to
    ``log_path``; yield the :class:`Console` that still writes to the terminal.

    Done at the file-descriptor level, so engine output from C/C++, Python warnings, progress bars
    and library loggers with their own stream handlers all land in the file. With ``verbose``
    nothing is redirected. On an exception the last lines of the log are shown on the console.
    """
    if verbose:
        yield Console(sys.stdout)
        return
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    log = _LogStream(open(log_path, "a", buffering=1), log_path)
    log.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n")
    log.flush()
    for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            s.flush()
    saved_fds = (os.dup(1), os.dup(2))
    terminal = os.fdopen(os.dup(1), "w", buffering=1)
    saved_streams = (sys.stdout, sys.stderr)
    saved_env = {k: os.environ.get(k) for k in QUIET_ENV}
    os.environ.update(QUIET_ENV)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log  # also Python-level writers that do not go through fd 1/2
    # and logging handlers made earlier on a stream that is not fd 1/2 (pytest, notebooks)
    moved = _retarget_handlers(lambda st: any(st is x for x in saved_streams), log)
    con = Console(terminal)
    log.console = con
    root = logging.getLogger()
    handlers: List[logging.Handler] = [_ConsoleErrors(con, log_path)]
    if not root.handlers:  # what logging's last resort would print (the console handler disables it)
        handlers.append(logging.StreamHandler(log))
        handlers[-1].setLevel(logging.WARNING)
    for h in handlers:
        root.addHandler(h)
    failed: Optional[BaseException] = None
    try:
        yield con
    except BaseException as e:
        failed = e
        raise
    finally:
        for h in handlers:
            root.removeHandler(h)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        sys.stdout, sys.stderr = saved_streams
        for h, st in moved:
            h.setStream(st)
        # handlers made inside (e.g. vLLM's, configured at its import) would write to a closed file
        _retarget_handlers(lambda st: st is log, saved_streams[1])
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        log.close()
        con._clear_live()
        if failed is not None and not isinstance(failed, (SystemExit, KeyboardInterrupt)):
            terminal.write(f"failed: {type(failed).__name__}: {failed}\n--- last lines of {log_path} ---\n")
            terminal.write("".join(tail(log_path, LOG_TAIL_LINES)))
            terminal.write("---\n")
        terminal.flush()
        terminal.close()


def _retarget_handlers(match, stream) -> List[tuple]:
    """Point every logging StreamHandler whose stream ``match``-es at ``stream``; returns (handler, old)."""
    loggers = [
        logging.getLogger(),
        *(lg for lg in list(logging.Logger.manager.loggerDict.values()) if isinstance(lg, logging.Logger)),
    ]
    moved = []
    for lg in loggers:
        for h in list(lg.handlers):
            if type(h) is logging.StreamHandler and match(h.stream):
                if getattr(h.stream, "closed", False):  # setStream would flush the closed stream
                    moved.append((h, h.stream))
                    h.stream = stream
                else:
                    moved.append((h, h.setStream(stream)))
    return moved


def tail(path: str, n: int) -> List[str]:
    try:
        with open(path, errors="replace") as f:
            return f.readlines()[-n:]
    except OSError:
        return []
