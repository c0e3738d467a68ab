#!/usr/bin/env bash
# The main job: set up .venv if needed, then a short R3L training run on CPU (default model/env).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec .venv/bin/python -m rllib_r3l.cli.main "$@"
