"""The test suite; its folders mirror the package (tests/runner/ tests rllib_r3l/runner/, ...)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
