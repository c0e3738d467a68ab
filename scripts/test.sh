#!/usr/bin/env bash
# The test suite: set up .venv if needed, then pytest on tests/ (the package) and benchmarks/tests/ (the
# benchmarks' own arithmetic); CPU, the slow real-model tests included. --fast: the tier that starts no Ray,
# vLLM, JVM or child process (conftest.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export RAY_AUTH_MODE=disabled VLLM_ENABLE_V1_MULTIPROCESSING=0
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 tests benchmarks/tests "$@"
