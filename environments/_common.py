"""Helpers shared by the environment adapters: splits, action text, invalid-action feedback, JVMs."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
from typing import Any, Iterator, List, Optional, Sequence

SPLITS = ("train", "dev", "test")

_WS = re.compile(r"\s+")


def check_split(split: Any) -> str:
    """``split`` must be one of train/dev/test (``valid``/``validation`` read as dev)."""
    if isinstance(split, str):
        s = split.strip().lower()
        s = {"valid": "dev", "validation": "dev", "eval": "dev"}.get(s, s)
        if s in SPLITS:
            return s
    raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")


def check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
    return value


def normalize_action(action: str) -> str:
    """Lower case, one space between words, no surrounding whitespace, quotes or final period."""
    a = _WS.sub(" ", action).strip().strip("'\"`").strip()
    while a.endswith(".") and not a.endswith(".."):
        a = a[:-1].rstrip()
    return a.lower()


def invalid_feedback(action: str, reason: str, admissible: Optional[Sequence[str]], max_listed: int = 40) -> str:
    """Language feedback for an invalid action: what was said, why it failed, what is valid now."""
    shown = action if len(action) <= 200 else action[:200] + "..."
    text = f"Invalid action '{shown}': {reason.strip()}"
    if admissible:
        acts = list(admissible)
        if len(acts) > max_listed:  # a long list: show first the actions with the same verb
            words = normalize_action(action).split()
            verb = words[0] if words else ""
            related = [a for a in acts if a.split(" ", 1)[0] == verb]
            acts = related + [a for a in acts if a.split(" ", 1)[0] != verb]
        listed = ", ".join(acts[:max_listed])
        more = f" (and {len(acts) - max_listed} more)" if len(acts) > max_listed else ""
        text += f" Valid actions now: {listed}{more}."
    return text


# --------------------------------------------------------------------------------------- JVMs
_JAVA_OPTS_LOCK = threading.Lock()


# A short-lived game JVM (TextWorldExpress) spends more CPU compiling its own code with C2 and
# running a parallel collector than playing: C1 only and a serial GC start, reset and step it for
# less CPU (docs/benchmarks.md, 'Where does an iteration's time go?').
QUICK_START_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


@contextlib.contextmanager
def java_heap(max_heap: Optional[str], quick_start: bool = False) -> Iterator[None]:
    """Start JVMs inside this block with ``-Xmx<max_heap>`` (via ``JAVA_TOOL_OPTIONS``), and with
    ``quick_start`` the :data:`QUICK_START_OPTIONS`.

    What the user already set in ``JAVA_TOOL_OPTIONS`` wins: an ``-Xmx``, a tiered-compilation
    level or a collector of theirs keeps ours out. The variable is restored after.
    """
    with _JAVA_OPTS_LOCK:
        old = os.environ.get("JAVA_TOOL_OPTIONS")
        have, add = (old or "").split(), []
        if max_heap and not any(o.startswith("-Xmx") for o in have):
            add.append(f"-Xmx{max_heap}")
        if quick_start:
            if not any(o.startswith("-XX:TieredStopAtLevel") for o in have):
                add.append(QUICK_START_OPTIONS[0])
            if not any(re.fullmatch(r"-XX:[+-]Use\w+GC", o) for o in have):
                add.append(QUICK_START_OPTIONS[1])
        if add:
            os.environ["JAVA_TOOL_OPTIONS"] = " ".join(([old] if old else []) + add)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("JAVA_TOOL_OPTIONS", None)
            else:
                os.environ["JAVA_TOOL_OPTIONS"] = old


def check_heap(name: str, value: Any) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"\d+[kKmMgG]?", value):
        raise ValueError(f"{name} must be a JVM heap size like '768m' or '2g' (or None); got {value!r}")
    return value


def disarm_close(wrapper: Any) -> Any:
    """Make a TWX/ScienceWorld wrapper's own ``close`` (also run by its ``__del__``) a no-op.

    Our ``stop_py4j_wrapper`` stops the JVM instead; the wrapper's ``close`` fails noisily when the
    garbage collector runs it after the JVM's pipes are closed. A JVM whose environment is never
    closed still exits with this Python process (py4j's ``die_on_exit``).
    """
    with contextlib.suppress(Exception):
        wrapper.close = lambda: None
    return wrapper


def stop_py4j_wrapper(wrapper: Any, timeout: float = 10.0) -> Optional[int]:
    """Shut down the py4j gateway of a TWX/ScienceWorld wrapper and make sure its JVM has exited.

    Returns the JVM's pid (or None).
    """
    gateway = getattr(wrapper, "_gateway", None)
    if gateway is None:
        return None
    proc: Optional[subprocess.Popen] = getattr(gateway, "java_process", None)
    pid = proc.pid if proc is not None else None
    with contextlib.suppress(Exception):
        gateway.shutdown()
    if proc is not None:
        if proc.poll() is None:  # py4j's JVM exits when its stdin gets a line or closes
            with contextlib.suppress(Exception):
                proc.stdin.write(b"\n")
                proc.stdin.flush()
            with contextlib.suppress(Exception):
                proc.stdin.close()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.close()
    disarm_close(wrapper)
    return pid


def sorted_unique(actions: Sequence[str]) -> List[str]:
    """A deterministic order for engines that return valid actions from a hash set."""
    return sorted(set(actions))


__all__ = [
    "SPLITS",
    "check_split",
    "check_positive_int",
    "normalize_action",
    "invalid_feedback",
    "java_heap",
    "check_heap",
    "disarm_close",
    "stop_py4j_wrapper",
    "sorted_unique",
]
