"""Writes rllib_r3l/training_args.py: ``R3LConfig.training``'s keyword arguments and their ``Args:`` lines,
from the option table (rllib_r3l/options.py, the single source). Run it after adding or changing an option;
tests/test_training_args.py fails until the file matches the table.

    .venv/bin/python scripts/gen_training_args.py
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET = ROOT / "rllib_r3l" / "training_args.py"

HEAD = '''"""``R3LConfig.training``'s keywords: every R3L option, as RLlib's configs declare theirs (issue 48).

GENERATED from rllib_r3l/options.py by scripts/gen_training_args.py: edit the table there and run the
script; tests/test_training_args.py holds this file, the table and the signature together.
"""

from __future__ import annotations

from typing import Any, List, Optional

from ray.rllib.algorithms.algorithm_config import NotProvided


class TrainingArgs:
    """Mixin of :class:`rllib_r3l.config.R3LConfig`: the declared ``training()``."""

    def training(
        self,
        *,
'''


def annotation(name: str, default, help_text: str, choices) -> str:
    if name in choices:
        kind = "str"
    elif isinstance(default, list):
        kind = "List[str]"
    elif isinstance(default, (bool, int, float, str)):
        kind = type(default).__name__
    else:
        return "Any"
    return f"Optional[{kind}]" if "None = " in help_text or "None (" in help_text else kind


def render() -> str:
    from rllib_r3l.options import CHOICES, R3L_OPTIONS

    lines = [HEAD.rstrip("\n")]
    lines.append("        model: Any = NotProvided,")
    for name, (default, _help) in R3L_OPTIONS.items():
        lines.append(f"        {name}: {annotation(name, default, _help, CHOICES)} = NotProvided,")
    lines.append("        **kwargs: Any,")
    lines.append('    ) -> "TrainingArgs":')
    lines.append(
        '        """Set R3L\'s training options, and RLlib\'s own through ``**kwargs`` (``lr``, ``grad_clip``, ...).'
    )
    lines.append("")
    lines.append("        Args:")
    wrap = textwrap.TextWrapper(
        width=116, initial_indent=" " * 12, subsequent_indent=" " * 16, break_on_hyphens=False, break_long_words=False
    )
    lines += wrap.wrap(
        "model: the policy model as a Hugging Face id or local path (stored as model_id); "
        "a dict is RLlib's old-stack model config."
    )
    for name, (default, help_text) in R3L_OPTIONS.items():
        lines += wrap.wrap(f"{name}: {help_text} (default {default!r})")
    lines.append('        """')
    lines.append(
        "        given = {k: v for k, v in locals().items() if k not in ('self', 'kwargs') and v is not NotProvided}"
    )
    lines.append("        return self._set_training(**given, **kwargs)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    TARGET.write_text(render())
    print(f"wrote {TARGET.relative_to(ROOT)}")
