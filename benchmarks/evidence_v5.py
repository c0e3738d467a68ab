"""Evidence v5 (issue 46, item 6): does a lever make the retry pay? The screening of each lever alone
against R3L today, on the task the pre-check chose (``benchmarks/task_precheck.py``), at v4's budget.

    .venv/bin/python benchmarks/evidence_v5.py --seeds 0,1 --parallel 1          # the screening; resumable
    .venv/bin/python benchmarks/evidence_v5.py --variants r3l,r3l_exclude --seeds 0
    .venv/bin/python benchmarks/evidence_v5.py --report-only                     # tables from what is there

``benchmarks/learning_curves.py``'s harness (its resumable runs, exact trajectory budget, setting.json,
held-out evaluation, per-run ``retries.jsonl``), with its own folder (``learning_curves_v5``), its own
common setting (``V5_SETTING``: v4's with the chosen task) and its own variants, each ONE lever on top of
``r3l`` (``R3LConfig()`` with ``MAIN_JOB_SETTINGS``, what ``scripts/main.sh`` trains):

* ``grpo_paper``: GRPO as the paper runs it (v4's);
* ``r3l``: R3L today (+ the control, below);
* ``r3l_exclude``: ``pivot_action="exclude_failed"`` (the retry may not repeat the failed action at its pivot);
* ``r3l_hindsight``: ``pivot_selector="hindsight"`` (the pivot where the policy's own odds blame the episode);
* ``r3l_backoff``: ``pivot_backoff=1`` (one turn before the reported pivot);
* ``r3l_pivot_temp``: ``pivot_temperature=1.2`` (a hotter pivot turn);
* ``r3l_hindsight_exclude``: ``hindsight`` + ``exclude_failed``: the combination the first screened seeds
  point at (hindsight put the pivot in time, 28/28; exclude_failed changed the action, 50/50);
* ``r3l_oracle_exclude``: the oracle's reports + ``exclude_failed``: a DIAGNOSTIC upper bound.

**The task** (``benchmarks/results/evidence_v5/precheck/summary.md``, AMD EPYC, 2 cores, one thread a run):
coin collector with 8 rooms and 15 turns (``coin8_t15``): the untrained policy wins 2 of 32 held-out games
(6 %; v4's 4 rooms and 10 turns: 1 of 96 over 3 seeds) and ``grpo_paper`` seed 0 wins 16 of 32 (50 %, under
60 %) after 64 trajectories; its base evaluation takes 61 CPU s, a GRPO run ~11 min. Of the others, 4 rooms
with 20 turns (1/32) and TWX arithmetic (0/32) are under the band; twc (1 room, 1 item, 15 turns) and
8 rooms with 25 turns are in it at 2/32 too, but cost 3.5x and 9x the CPU a game; cookingworld (1 room,
1 ingredient) had not finished its 32 games after 17 minutes. TWX simon says fits too (2/32, GRPO 16/32) at a
tenth of the cost, but its first wrong action ends the game, so the pivot is always the last turn and the
pivot-placement levers have nothing to place: not the task to screen them on.

**The control and the budget.** Every R3L variant records the fresh control (``retry_control=True``: for
each failed base episode whose retry started, one unguided episode of the same task from turn 0 at the
training temperature). It costs no trajectory of the budget and never trains: ``Explorer.explore`` counts
in ``episodes_started`` (what ``R3L.episode_cap`` caps and the harness's budget sums) only the base episodes
and the retries that started; the controls run after the retries, only for retries the cap let start, and
keep only their success (the ledger's ``control_success``, ``r3l/control_success_rate``); they are in no
group, so in no training batch (tested here and in ``tests/runner/test_retry_levers.py``). So every variant
trains on exactly ``budget`` trajectories, control or not. What the control does cost: its episodes'
CPU seconds and generated tokens are in the run's cost columns (R3L's cost per sample reads high by up to
one episode per retry), and it draws from the engine's sampling stream, so a run with the control is not
the same random run as one without (the same distribution).

Pairs: each lever against ``r3l`` at the same seed (the screening's question), ``r3l`` against
``grpo_paper``. The report adds per run and per variant the ledger's funnel (reflections -> valid ->
pivot in time -> retries -> action changed -> success) and retry vs control on the same failed tasks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402
from benchmarks import learning_curves as lc  # noqa: E402
from benchmarks.learning_curves_report import BASE, folder_variants, read_setting, report  # noqa: E402
from benchmarks.task_precheck import candidate_setting  # noqa: E402

OUT = harness.RESULTS / "learning_curves_v5"
TASK = "coin8_t15"  # task_precheck.CANDIDATES' name of the chosen task (the docstring: why)
V5_SETTING: Dict[str, Any] = candidate_setting(TASK)

CONTROL = {"retry_control": True}  # DIAGNOSTIC, never trained on, no budget (the docstring)
R3L_TODAY = {**lc.VARIANTS["r3l"], **CONTROL}
LEVERS: Dict[str, Dict[str, Any]] = {
    "r3l_exclude": {"pivot_action": "exclude_failed"},
    "r3l_hindsight": {"pivot_selector": "hindsight"},
    "r3l_backoff": {"pivot_backoff": 1},
    "r3l_pivot_temp": {"pivot_temperature": 1.2},
    "r3l_hindsight_exclude": {"pivot_selector": "hindsight", "pivot_action": "exclude_failed"},
    "r3l_oracle_exclude": {"reflector": "oracle", "pivot_action": "exclude_failed"},  # DIAGNOSTIC upper bound
}
VARIANTS: Dict[str, Dict[str, Any]] = {
    "grpo_paper": dict(lc.VARIANTS["grpo_paper"]),
    "r3l": R3L_TODAY,
    **{v: {**R3L_TODAY, **opts} for v, opts in LEVERS.items()},
}
# run order: R3L today and the first two levers, then the others and GRPO, then the diagnostic
PRIORITY: Dict[str, int] = {
    BASE: 0,
    "r3l": 0,
    "r3l_exclude": 0,
    "r3l_hindsight": 0,
    "r3l_backoff": 1,
    "r3l_pivot_temp": 1,
    "grpo_paper": 1,
    "r3l_hindsight_exclude": 1,
    "r3l_oracle_exclude": 2,
}
PAIRS: Dict[str, str] = {"r3l": "grpo_paper", **{v: "r3l" for v in LEVERS}}


def install() -> None:
    """This script's variants and run order in ``learning_curves`` (whose ``build_config`` and
    ``next_runs`` read them): in this process only, the sweep's and each ``--child``'s."""
    lc.VARIANTS.clear()
    lc.VARIANTS.update(VARIANTS)
    lc.PRIORITY.clear()
    lc.PRIORITY.update(PRIORITY)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=None, help=f"comma list of {list(VARIANTS)} (default: all)")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    install()
    out = Path(args.out).resolve()
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    if args.child:
        v, s = args.child.split(":")
        lc.run_one(out, read_setting(out)["common"], v, int(s))
        return
    variants = [v for v in (args.variants or "").split(",") if v]
    if args.report_only:
        print(report(out, variants or [v for v in folder_variants(out) if v != BASE], seeds, PAIRS))
        return
    variants = variants or list(VARIANTS)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants: unknown {bad}; choose from {list(VARIANTS)}")
    setting = dict(V5_SETTING)
    lc.check_setting(out, setting, lc.variant_diffs(setting, [BASE, *variants]))
    lc.sweep(out, setting, variants, seeds, args.parallel, __file__, lambda: report(out, variants, seeds, PAIRS))
    print(report(out, variants, seeds, PAIRS))


if __name__ == "__main__":
    main()
