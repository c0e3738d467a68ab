"""The shared-memory data plane's pieces (generation/shm_plane.py), without vLLM: the probe that tells an
engine on the sender's machine, buffers shared between two mappings and grown by the sender, and the
sweep of files a killed sender left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rllib_r3l.generation import shm_plane


def test_the_probe_is_seen_only_with_the_same_token_in_the_same_folder(tmp_path):
    token = shm_plane.create_probe(str(tmp_path))
    assert token and token.startswith(f"{os.getpid()}-")
    assert shm_plane.sees_probe(token, str(tmp_path))
    assert not shm_plane.sees_probe(token, str(tmp_path / "elsewhere"))  # another machine: no file
    assert not shm_plane.sees_probe(token[:-1] + "x", str(tmp_path)) and not shm_plane.sees_probe("", str(tmp_path))
    shm_plane.remove_probe(token, str(tmp_path))
    assert not shm_plane.sees_probe(token, str(tmp_path)) and os.listdir(tmp_path) == []
    assert shm_plane.create_probe(str(tmp_path / "missing")) is None  # cannot write: gloo only


def test_buffers_are_shared_grown_by_the_owner_and_removed_on_close(tmp_path):
    owner = shm_plane.ShmSlots("1-ab", 2, owner=True, shm_dir=str(tmp_path))
    reader = shm_plane.ShmSlots("1-ab", 2, owner=False, shm_dir=str(tmp_path))
    views = owner.ensure(64)
    views[1][:4].copy_(torch.tensor([1, 2, 3, 4], dtype=torch.uint8))
    assert reader.ensure(64)[1][:4].tolist() == [1, 2, 3, 4]  # the other mapping sees the bytes
    grown = owner.ensure(1 << 12)  # a round with a larger buffer: files grown, contents kept
    assert all(os.path.getsize(p) == 1 << 12 for p in owner.paths) and grown[1][:4].tolist() == [1, 2, 3, 4]
    grown[0][4000] = 7
    assert reader.ensure(1 << 12)[0][4000].item() == 7
    assert owner.ensure(100) is grown  # smaller: the same mapping
    reader.close()
    assert all(os.path.isfile(p) for p in owner.paths)  # a reader never removes the sender's files
    owner.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.subprocess
def test_the_sweep_removes_the_files_of_dead_senders_only(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    for name in (f"r3l-wt-{dead_pid}-aa-0", f"r3l-wt-{os.getpid()}-bb-0", "r3l-wt-notapid", "other-file"):
        (tmp_path / name).write_bytes(b"x")
    shm_plane.sweep(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted([f"r3l-wt-{os.getpid()}-bb-0", "r3l-wt-notapid", "other-file"])
