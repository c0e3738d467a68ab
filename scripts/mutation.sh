#!/usr/bin/env bash
# Mutation testing of the core modules with the fast tests (mutmut 3.x; docs/mutation.md).
# Not run by CI. Works on a snapshot of the working tree in a scratch directory, so the checkout
# is never touched and other work can go on meanwhile.
#
#   bash scripts/mutation.sh                       # every core module
#   bash scripts/mutation.sh core_algos runner/explore   # some of them (paths under rllib_r3l/)
#   MUTATION_CHILDREN=2 MUTATION_WORKDIR=/tmp/mm bash scripts/mutation.sh core_algos
#   MUTATION_SOURCE=HEAD bash scripts/mutation.sh batch   # rllib_r3l/environments as committed at a rev
#   MUTATION_TESTS="tests/test_core_algos.py tests/runner/test_explore.py" bash scripts/mutation.sh batch
#   MUTATION_NAMES=names.txt bash scripts/mutation.sh core_algos   # only these mutants (one name a line)
#   MUTATION_DESELECT="" bash scripts/mutation.sh learner/torch_learner         # also the learner-building tests
#
# Writes <workdir>/mutation-report.md (score per module, survivors) and mutation-report.json;
# `cd <workdir> && mutmut show <name>` prints a survivor's diff.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
WORK="${MUTATION_WORKDIR:-/tmp/r3l-mutation}"
CHILDREN="${MUTATION_CHILDREN:-1}"
ALL_MODULES=(core_algos batch trajectory learner/torch_learner learner/rl_module runner/explore runner/reflection/reflect)
MODULES=("$@")
[ ${#MODULES[@]} -gt 0 ] || MODULES=("${ALL_MODULES[@]}")
# The fast tests (no Ray runtime, no RLlib learner built; the tiny model at most): the ones that pin
# the core modules. Tests that build a learner (test_learner_loss, two of test_learner) or run an
# evaluation take a minute a mutant on two cores; test_learner_update runs the learner's own code on a
# stub instead, and the rest is checked with planted bugs (docs/mutation.md).
TESTS=(tests/test_core_algos.py tests/test_core_hand_values.py tests/test_batch.py tests/learner/test_torch_learner.py
       tests/runner/test_aux_rules.py tests/runner/test_explore.py tests/runner/reflection/test_reflect.py tests/test_trajectory.py
       tests/learner/test_torch_learner_update.py tests/learner/test_rl_module.py tests/runner/test_explore_items.py
       tests/runner/reflection/test_context.py tests/runner/reflection/test_oracle.py tests/runner/reflection/test_reflect_values.py)
DESELECT="${MUTATION_DESELECT-not micro_batching_leaves_the_gradient_unchanged and not bf16_autocast_gradient and not evaluate_reports_reflection_quality}"
[ -z "${MUTATION_TESTS:-}" ] || read -r -a TESTS <<< "$MUTATION_TESTS"

[ -x "$VENV/bin/mutmut" ] || { echo "mutmut missing: $VENV/bin/pip install -r requirements/mutation.txt" >&2; exit 2; }
for m in "${MODULES[@]}"; do
  [ -f "$ROOT/rllib_r3l/$m.py" ] || { echo "no module rllib_r3l/$m.py" >&2; exit 2; }
done

# a fresh snapshot (a previous run's mutants/ is reused only when the sources are unchanged)
mkdir -p "$WORK"
copy() { rm -rf "$WORK/$1" && cp -a "$ROOT/$1" "$WORK/$1" && find "$WORK/$1" -name __pycache__ -prune -exec rm -rf {} +; }
copy tests
if [ -n "${MUTATION_SOURCE:-}" ]; then  # the code under test as committed at that revision
  rm -rf "$WORK/rllib_r3l" "$WORK/environments"
  git -C "$ROOT" archive "$MUTATION_SOURCE" rllib_r3l environments | tar -x -C "$WORK"
else
  copy rllib_r3l
  copy environments
fi
{
  echo "[mutmut]"
  echo "source_paths = rllib_r3l"
  echo "only_mutate ="
  for m in "${MODULES[@]}"; do echo "    rllib_r3l/$m.py"; done
  echo "also_copy = environments"
  printf 'pytest_add_cli_args =\n    -p\n    no:cacheprovider\n    -W\n    ignore\n'
  [ -z "$DESELECT" ] || printf '    -k\n    %s\n' "$DESELECT"
  echo "pytest_add_cli_args_test_selection ="
  for t in "${TESTS[@]}"; do echo "    $t"; done
  # a mutant whose tests run 20x longer (+60 s) than unmutated is a timeout (counted killed); generous,
  # because on a shared machine a loaded minute must not pass for an endless loop
  echo "timeout_multiplier = 20.0"
  echo "timeout_constant = 60.0"
  echo "use_git_change_detection = false"
} > "$WORK/setup.cfg"

cd "$WORK"
# one BLAS/OpenMP thread: mutmut forks a child per mutant (fork after an OpenMP pool can hang),
# and the machine is shared
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 RAY_AUTH_MODE=disabled VLLM_ENABLE_V1_MULTIPROCESSING=0
export PATH="$VENV/bin:$PATH"
NAMES=()
[ -z "${MUTATION_NAMES:-}" ] || mapfile -t NAMES < "$MUTATION_NAMES"
nice -n 19 "$VENV/bin/mutmut" run --max-children "$CHILDREN" "${NAMES[@]}" || true
"$VENV/bin/python" "$ROOT/scripts/mutation_report.py" "$WORK" "${MODULES[@]}"
