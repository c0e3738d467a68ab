"""What an experiment was started with, kept beside Tune's state, so that ``--resume`` of an edited file
is refused instead of silently continuing the old config (else `reflect: false` written into the
file, then `--resume`, trains on with reflection to the old stop while `--dry-run` shows the new values).

A resumed experiment keeps the config and stop criteria Tune saved; ``--set``/``--stop`` are refused
with ``--resume`` for that reason, and so is a file whose ``config``/``stop``/``checkpoint_config`` differ
from the saved ones.
The copy is of the file as written (before ``--set``/``--stop``, which ``--resume`` drops from its
command), so a run started with overrides resumes from its unchanged file.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

from rllib_r3l.cli.result_rows import flat
from rllib_r3l.cli.storage import write_atomically

SPEC_FILE = "r3l-experiment.json"
COMPARED = ("config", "stop", "checkpoint_config")  # what Tune keeps on a resume (checkpoint_config too)


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


def _flat(d: Dict[str, Any]) -> Dict[str, Any]:
    """Dotted keys to leaves; a Tune search space (``{grid_search: [...]}``) and an empty dict are one leaf."""
    return flat(d, ".", lambda v: not v or "grid_search" in v)


def save(exp_dir: str, spec: Dict[str, Any]) -> None:
    """Keep the ``config``, ``stop`` and ``checkpoint_config`` of the file's experiment as a fresh start reads it."""
    os.makedirs(exp_dir, exist_ok=True)
    write_atomically(os.path.join(exp_dir, SPEC_FILE), json.dumps(_normal({k: spec.get(k) for k in COMPARED})))


def _saved(exp_dir: str) -> Optional[Dict[str, Any]]:
    try:
        with open(os.path.join(exp_dir, SPEC_FILE)) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def changes(exp_dir: str, spec: Dict[str, Any], limit: int = 4) -> List[str]:
    """``["config.reflect: True -> False", ...]``: where the file's experiment now differs from the file's
    experiment the run started with (a Tune search space, ``grid_search``, compared as written). Nothing for
    an experiment started without the saved copy."""
    saved = _saved(exp_dir)
    if saved is None:
        return []
    sections = [k for k in COMPARED if k in saved]  # a copy from before a section was kept: not compared there
    old, new = _flat(saved), _flat(_normal({k: spec.get(k) for k in sections}))

    def show(flat: Dict[str, Any], k: str) -> str:
        return repr(flat[k]) if k in flat else "(not set)"

    return [
        f"{k}: {show(old, k)} -> {show(new, k)}"
        for k in sorted(set(old) | set(new))
        if old.get(k, old) != new.get(k, old)
    ][:limit]
