"""A shared-memory data plane for the gloo weight transfer when every engine is on the learner's machine.

Over gloo, each packed buffer crosses a loopback socket: the sender's copy into the kernel, the
receiver's copy out, and the socket's threads, ~0.1-0.25 s for SmolLM2-135M's 257 MiB on two cores.
Here the sender casts straight into ``num_buffers`` files in ``/dev/shm`` mapped by both ends, and the
group carries only two small messages per buffer: a header broadcast (the buffer is filled) and an
all-reduce (every engine has copied it out, so the sender may fill it again). Engines copy each buffer
out before loading: vLLM's layerwise reload keeps references to the tensors it is given until a
layer is complete (attention layers: until the end of the update).

Whether to use it is agreed in-band when the group opens: the sender writes a random token into a
probe file and every engine reports (an all-reduce of 0/1) whether it reads the same token there (a
different machine or container sees no file, or another one). Files are named by the sender's pid;
files of dead senders are removed when a sender opens a group.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import secrets
from typing import List, Optional

import torch

SHM_DIR = "/dev/shm"
_PREFIX = "r3l-wt-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(shm_dir: str = SHM_DIR) -> None:
    """Remove the buffer files of senders that died without closing them (a killed learner)."""
    for path in glob.glob(os.path.join(shm_dir, _PREFIX + "*")):
        m = re.match(rf"{_PREFIX}(\d+)-", os.path.basename(path))
        if m and not _alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                os.remove(path)


def create_probe(shm_dir: str = SHM_DIR) -> Optional[str]:
    """The sender's token, written into its probe file; None where ``shm_dir`` cannot be written."""
    token = f"{os.getpid()}-{secrets.token_hex(8)}"
    try:
        with open(os.path.join(shm_dir, f"{_PREFIX}{token}-probe"), "w") as f:
            f.write(token)
    except OSError:
        return None
    return token


def sees_probe(token: Optional[str], shm_dir: str = SHM_DIR) -> bool:
    """Whether this process reads the sender's token in its probe file (the same machine and /dev/shm)."""
    if not token:
        return False
    try:
        with open(os.path.join(shm_dir, f"{_PREFIX}{token}-probe")) as f:
            return f.read() == token
    except OSError:
        return False


def remove_probe(token: Optional[str], shm_dir: str = SHM_DIR) -> None:
    if token:
        with contextlib.suppress(OSError):
            os.remove(os.path.join(shm_dir, f"{_PREFIX}{token}-probe"))


class ShmSlots:
    """``num_buffers`` byte buffers backed by files in ``shm_dir``, mapped shared; the sender creates and
    grows the files (``owner=True``) and removes them on ``close``."""

    def __init__(self, token: str, num_buffers: int, owner: bool, shm_dir: str = SHM_DIR) -> None:
        self.paths = [os.path.join(shm_dir, f"{_PREFIX}{token}-{i}") for i in range(num_buffers)]
        self.owner = owner
        self.views: List[torch.Tensor] = []
        self.size = 0

    def ensure(self, size: int) -> List[torch.Tensor]:
        """The buffers, each at least ``size`` bytes (the sender grows the files before it announces a
        buffer, so a receiver maps them only after the first header of a round)."""
        if self.views and size <= self.size:
            return self.views
        if self.owner:
            for p in self.paths:
                with open(p, "ab"):
                    pass
                if os.path.getsize(p) < size:
                    os.truncate(p, size)
        self.views = [torch.from_file(p, shared=True, size=size, dtype=torch.uint8) for p in self.paths]
        self.size = size
        return self.views

    def close(self) -> None:
        self.views, self.size = [], 0
        if self.owner:
            for p in self.paths:
                with contextlib.suppress(OSError):
                    os.remove(p)
