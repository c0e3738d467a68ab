"""Does R3L learn better than GRPO here, with today's defaults? Learning curves of R3L and two GRPO
baselines at one trajectory budget (issue 39, item 4; the v3 sweep of issue 11 keeps its own folder).

    .venv/bin/python benchmarks/learning_curves.py --seeds 0,1,2 --parallel 2    # the sweep; resumable
    .venv/bin/python benchmarks/learning_curves.py --variants grpo_ds,r3l --seeds 0
    .venv/bin/python benchmarks/learning_curves.py --report-only                  # tables, CSV and PNG from what is
                                                                                # there

Every variant starts from ``R3LConfig()``'s defaults, what a user gets, plus the common setting
(``DEFAULT_SETTING``: environment, model, group, budget, numerics); only its own options go on top:

* ``base``: the untrained model, evaluated once per seed;
* ``grpo_paper``: GRPO as the paper's implementation appendix runs it (``tuned_examples/generate.py``'s
  ``GRPO``: no R3L component, std-normalised advantages, reference KL, clipped importance ratio);
* ``grpo_ds``: ``grpo_paper`` with the main job's dynamic sampling (``MAIN_JOB_SETTINGS``);
* ``r3l``: ``R3LConfig()`` with ``MAIN_JOB_SETTINGS``, what ``scripts/main.sh`` trains;
* ``r3l_oracle``: ``r3l`` whose reports come from the environment's oracle: the DIAGNOSTIC upper
  bound of what reflection can hand to the rest of R3L (it never trains on its reports);
* ``r3l_paper``: R3L as the paper runs it (its reflection style and temperature, both auxiliary
  items, its loss aggregation, no dynamic sampling).

Pairs (``learning_curves_report.PAIRS``): each R3L against the GRPO with the same dynamic sampling,
which changes how many trajectories an iteration spends and which tasks train, so it is on both
sides of a pair or on neither; ``grpo_ds`` against ``grpo_paper`` shows what it does alone.

**Equal sample budget, exactly.** A run trains until it has started ``budget`` trajectories (base +
retry episodes, lost ones and a partial retry included; a group of N holds N base rollouts without
reflection, N/2 base + up to N/2 retries with it; dynamic sampling's extra rounds count too): before each
iteration ``R3L.episode_cap`` is set to what is left, so the last iteration stops at the budget
(``r3l/episodes_started``), and variants run different numbers of iterations; tokens, CPU
seconds and the reflection cost (tokens the reflector generated, seconds spent reflecting) are
reported per run. Held-out evaluation: ``eval_episodes`` games of the environment's *test* fold
(seeds 0..E-1, disjoint from training) at the evaluation temperature, with the run's own engine, no
reflection.

**What ran is on file.** ``setting.json`` holds the common setting and, per variant, every option
that differs from ``R3LConfig()``, computed from the built config: a reader sees exactly what ran
without knowing the defaults of the day, and a run is refused (each field named, old and new) when
the common setting or a recorded variant's options differ from the folder's, e.g. after a default
changed in the code; a variant not yet recorded is added. Each run's curve header records the git
commit it ran (``-dirty`` with uncommitted tracked changes; again at each resume) and the CPU.

**Resumable.** Each (variant, seed) run lives in ``<out>/<variant>/seed<k>/``: ``curve.jsonl`` (a
header, then one record per iteration, appended as it finishes) and ``checkpoint/`` (the algorithm
after the last recorded iteration; git-ignored; deleted when the run is done). A killed run restarts
from its checkpoint; a finished one (``final.json``) is skipped. Runs go ``--parallel`` at a time
(one thread each: the 2-core machine): cut runs first, then the headline comparison (base,
``grpo_ds``, ``r3l``) for every seed, then the paper pair, then the oracle diagnostic. A running
child keeps its pid in its folder's ``running.pid``: a second sweep on the same folder, or a
restarted one whose killed parent left its children running, waits for those runs instead of
starting them twice.

The sweep writes its results and never commits them: commit the folder yourself when a run is worth
keeping. The tables and statistics are ``benchmarks/learning_curves_report.py``'s (pure; tested with
this script in ``benchmarks/tests/test_learning_curves.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import numbers
import os
import resource
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402
from benchmarks.learning_curves_report import (  # noqa: F401 - also lc.<name>
    BASE,
    PAIRS,
    folder_variants,
    read_curve,
    read_setting,
    report,
    run_dir,
    run_numbers,
    summarize,
)
from rllib_r3l.cli.main import MAIN_JOB_SETTINGS  # noqa: E402
from rllib_r3l.cli.run_info import cpu_model  # noqa: E402
from tuned_examples.generate import GRPO as PAPER_GRPO  # noqa: E402  (the paper's GRPO, set once there)

OUT = harness.RESULTS / "learning_curves_v4"

# R3L in the paper's mode. max_reflection_tokens is ours: the paper's 4096 (K.1) would let one free
# report of a small policy run for minutes on a 2-core CPU; 512 holds the authors' report form.
PAPER_R3L: Dict[str, Any] = dict(
    reflection_style="paper",
    reflection_temperature=0.7,
    aux_items=["reflection_sft", "retry_sft"],
    loss_aggregation="paper",
    max_reflection_tokens=512,
    dynamic_sampling_rounds=0,
)

# variant -> its options on top of R3LConfig()'s defaults and the common setting
VARIANTS: Dict[str, Dict[str, Any]] = {
    "grpo_paper": {**PAPER_GRPO, "dynamic_sampling_rounds": 0},
    "grpo_ds": {**PAPER_GRPO, **MAIN_JOB_SETTINGS},
    "r3l": dict(MAIN_JOB_SETTINGS),
    "r3l_oracle": {**MAIN_JOB_SETTINGS, "reflector": "oracle"},
    "r3l_paper": PAPER_R3L,
}
# run order: the headline comparison first, then the paper pair, then the diagnostic (others: 1)
PRIORITY: Dict[str, int] = {BASE: 0, "grpo_ds": 0, "r3l": 0, "grpo_paper": 1, "r3l_paper": 1, "r3l_oracle": 2}
LOCK = "running.pid"  # a run's child writes its pid here while it runs

# The common setting (v3's: the CPU default environment and model; lr 1e-5 as in the first version,
# which moved held-out success from 0-0.06 to 0.25 within 80 samples on this setting).
DEFAULT_SETTING: Dict[str, Any] = {
    "env": "r3l/CoinCollector",
    "env_config": {"compact_observations": True},
    "model": None,
    "backend": "vllm",
    "group_size": 8,
    "tasks_per_iteration": 2,
    "lr": 1e-5,
    "micro_batch_size": 4,
    "micro_batch_tokens": 1024,
    "budget": 64,
    "max_iterations": 12,
    "eval_episodes": 32,
    "num_threads": 1,
    "training": {},
    "choice_tokenization": "canonical",
    "share_prefixes": True,
    # the same numerics on every CPU a session may draw (bf16 is native on some, emulated on others)
    "engine_dtype": "float32",
    "mixed_precision": "none",
}
# What setting.json compares with R3LConfig(): every R3L option and the RLlib options this script
# sets, less those that differ by seed rather than by setting (RLlib's seed is not among them).
RLLIB_SET = ("lr", "env", "env_config")
PER_SEED = ("sampling_seed",)


# ---------------------------------------------------------------------------------------------------
# the setting
def build_config(setting: Dict[str, Any], variant: str, seed: int):
    """The config of ``variant`` at ``seed``: ``R3LConfig()``, the common setting, the variant's options."""
    from rllib_r3l import R3LConfig

    training = dict(
        group_size=setting["group_size"],
        tasks_per_iteration=setting["tasks_per_iteration"],
        lr=setting["lr"],
        micro_batch_size=setting["micro_batch_size"],
        micro_batch_tokens=setting["micro_batch_tokens"],
        backend=setting["backend"],
        num_threads=setting["num_threads"],
        sampling_seed=seed,
        share_prefixes=setting["share_prefixes"],
        backend_options={
            "choice_tokenization": setting["choice_tokenization"],
            **({"dtype": setting["engine_dtype"]} if setting.get("engine_dtype") else {}),
        },
    )
    if setting.get("mixed_precision"):
        training["mixed_precision"] = setting["mixed_precision"]
    if setting.get("model"):
        training["model"] = setting["model"]
    training.update({} if variant == BASE else VARIANTS[variant])
    training.update(setting.get("training") or {})
    config = (
        R3LConfig()
        .environment(setting["env"], env_config=dict(setting["env_config"]))
        .training(**training)
        .debugging(seed=seed)
    )
    runners = int(setting.get("num_env_runners") or 0)  # v3-v5: 0, the local runner samples
    if runners:  # one process per runner beside the learner's (lag_heldout.py: max_policy_lag needs one)
        config = config.env_runners(num_env_runners=runners, num_cpus_per_env_runner=1)
    return config


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, sort_keys=True, default=str))


def option_diff(config) -> Dict[str, Any]:
    """Every option of ``config`` that differs from a fresh ``R3LConfig()``: the R3L options and
    ``RLLIB_SET``, less ``PER_SEED``; values as JSON holds them."""
    from rllib_r3l import R3LConfig
    from rllib_r3l.options import R3L_OPTIONS

    fresh = R3LConfig()
    out = {}
    for k in sorted({*R3L_OPTIONS, *RLLIB_SET} - set(PER_SEED)):
        mine = _jsonable(getattr(config, k))
        if mine != _jsonable(getattr(fresh, k)):
            out[k] = mine
    return out


def variant_diffs(setting: Dict[str, Any], variants: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """``option_diff`` of every variant's validated config (``SystemExit`` naming a variant that does not build)."""
    diffs = {}
    for v in variants:
        try:
            config = build_config(setting, v, 0)
            config.validate()
        except (ValueError, TypeError, KeyError) as e:
            raise SystemExit(f"variant {v}: its config does not build ({e}); leave it out of --variants") from e
        diffs[v] = option_diff(config)
    return diffs


_UNSET = "(R3LConfig default)"


def _changes(old: Mapping[str, Any], new: Mapping[str, Any], missing: Any = None) -> List[str]:
    return [
        f"{k}: {old.get(k, missing)!r} there, {new.get(k, missing)!r} now"
        for k in sorted(set(old) | set(new))
        if old.get(k, missing) != new.get(k, missing)
    ]


def check_setting(out: Path, setting: Dict[str, Any], diffs: Dict[str, Dict[str, Any]]) -> None:
    """Write ``setting.json`` (the common setting, each variant's ``option_diff``) the first time;
    later refuse a different common setting or a recorded variant whose options differ (naming every
    field), and add the variants not yet recorded."""
    p = out / "setting.json"
    if p.exists() and "common" not in json.loads(p.read_text()):
        raise SystemExit(
            f"{out} holds a sweep whose setting.json predates per-variant options (v3): report it with "
            f"--report-only, and run new sweeps with --out <new folder>"
        )
    rec = read_setting(out) if p.exists() else {"common": _jsonable(setting), "variants": {}}
    problems = _changes(rec["common"], _jsonable(setting))
    for v, d in diffs.items():
        if v in rec["variants"]:
            problems += [f"variant {v}: {c}" for c in _changes(rec["variants"][v], d, _UNSET)]
    if problems:
        raise SystemExit(
            f"{out} holds a sweep with another setting ({'; '.join(problems)}); pass the same options "
            f"to resume it, or --out <new folder> for a new sweep"
        )
    new = {v: d for v, d in diffs.items() if v not in rec["variants"]}
    if new or not p.exists():
        out.mkdir(parents=True, exist_ok=True)
        rec["variants"].update(new)
        p.write_text(json.dumps(rec, indent=1, sort_keys=True))


def check_recorded(out: Path, variant: str, options: Dict[str, Any]) -> None:
    """A run about to start: refuse options that differ from what ``setting.json`` records for its
    variant (the code's defaults changed since the sweep began)."""
    recorded = read_setting(out)["variants"].get(variant) if (out / "setting.json").exists() else None
    if recorded is not None and recorded != options:
        raise SystemExit(
            f"{out}: variant {variant} would run with other options than the folder records "
            f"({'; '.join(_changes(recorded, options, _UNSET))}); restore the code it ran, or "
            f"--out <new folder>"
        )


def git_commit() -> str:
    """``git rev-parse HEAD``, with ``-dirty`` when tracked files have uncommitted changes; "unknown"
    outside a checkout. Read-only (no index refresh is written: ``GIT_OPTIONAL_LOCKS=0``)."""
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


# ---------------------------------------------------------------------------------------------------
# which runs
def held_by(d: Path, script: str = __file__) -> Optional[int]:
    """The pid of a live sweep child running the run in ``d`` (its ``running.pid``), else None.

    A pid whose process is gone, or is not a ``--child`` of ``script`` (this one unless another
    sweep script reuses the lock: the pid was reused), does not hold the run."""
    try:
        pid = int((d / LOCK).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists():
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            return None
        if b"--child" not in args or not any(a.endswith(os.path.basename(script).encode()) for a in args):
            return None
    return pid


def next_runs(out: Path, variants: Sequence[str], seeds: Sequence[int]) -> List[Tuple[str, int]]:
    """The runs still to do: runs already started (a cut run resumes from its checkpoint) first, then
    by ``PRIORITY`` (the headline comparison: base, ``grpo_ds``, ``r3l``; then the paper pair; then the
    oracle diagnostic), seed-major within each: a sweep cut short has the headline over all seeds
    before it spends time on the rest. Runs that a live child holds (another sweep's, or one whose
    parent was killed) are listed too: ``sweep`` waits for them instead of starting them twice."""
    started, rest = [], []
    for s in seeds:
        for i, v in enumerate(dict.fromkeys([BASE, *variants])):
            d = run_dir(out, v, s)
            if (d / "final.json").exists():
                continue
            if (d / "curve.jsonl").exists() or held_by(d):
                started.append((v, s))
            else:
                rest.append(((PRIORITY.get(v, 1), s, i), (v, s)))
    return started + [r for _, r in sorted(rest)]


# ---------------------------------------------------------------------------------------------------
# one run (a child process)
def evaluate_heldout(algo, episodes: int, batch: Optional[int] = None) -> Dict[str, Any]:
    """``episodes`` games of the test fold (seeds 0..E-1) with the runner's engine at the evaluation
    temperature: base episodes, no reflection. Lost episodes (errors) are counted, not dropped.
    ``batch``: at most that many games at a time (long games of many at once outgrow the CPU
    engine's KV cache; the same games, in turn)."""
    import environments
    from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions

    if algo.env_runner_group.num_remote_workers() > 0:  # the local runner holds no engine then
        return evaluate_on_runners(algo, episodes)
    runner = algo.env_runner  # local runner (num_env_runners=0): holds the synced engine
    c = algo.config
    env_config = dict(c.env_config, split="test")
    opts = RolloutOptions(
        max_turns=c.max_turns,
        max_response_tokens=c.max_response_tokens,
        max_context_tokens=c.max_context_tokens,
        temperature=c.evaluation_temperature,
        top_p=c.top_p,
        action_decoding=c.action_decoding,
        system_prompt=c.system_prompt,
    )
    counters: Counter = Counter()
    er = EpisodeRunner(runner.backend, runner._chat, lambda: environments.make(c.env, env_config), opts, counters)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        specs = [EpisodeSpec(seed=s, group_id=f"eval-{s}") for s in range(episodes)]
        step = batch or max(episodes, 1)
        trajs = [t for i in range(0, episodes, step) for t in er.run(specs[i : i + step])]
    finally:
        er.close()
    ok = [t for t in trajs if t is not None]
    # each game as it went (raw, per held-out seed): a lost game is None
    games = [
        None
        if t is None
        else {
            "seed": s.seed,
            "success": bool(t.success),
            "reward": float(t.reward),
            "turns": int(t.num_turns),
            "status": getattr(t.status, "value", str(t.status)),
        }
        for s, t in zip(specs, trajs)
    ]
    return {
        "eval_successes": sum(bool(t.success) for t in ok),
        "eval_episodes": episodes,
        "eval_games": games,
        "eval_lost": episodes - len(ok),
        "eval_return_mean": sum(float(t.reward) for t in ok) / max(len(ok), 1),
        "eval_temperature": c.evaluation_temperature,
        "eval_seconds": round(time.perf_counter() - t0, 1),
        "eval_cpu_s": round(time.process_time() - c0, 1),
    }


def evaluate_on_runners(algo, episodes: int) -> Dict[str, Any]:
    """``evaluate_heldout`` with remote env runners: the same games (test fold, seeds 0..E-1, evaluation
    temperature, no reflection) through each runner's own ``evaluate_episodes`` (what ``R3L.evaluate()``
    runs, ``runner/evaluation.play_heldout``). The setting's ``env_config.eval_split`` must be "test"; a
    runner that fails loses its games (``None``, counted in ``eval_lost``)."""
    from rllib_r3l.runner.evaluation import LOST_STATUSES, play_heldout

    c = algo.config
    if (c.env_config or {}).get("eval_split") != "test":
        raise SystemExit(
            "env_config.eval_split: held-out evaluation on remote env runners reads the runners' eval split; "
            "set it to 'test' in the setting's env_config"
        )
    if algo.engine_weights_version != algo.learner_updates:
        raise SystemExit("weight_sync_interval > 1: the engines hold older weights than the learner; evaluate at 1")
    seeds = list(range(episodes))
    t0 = time.perf_counter()
    by_seed = {row["seed"]: row for row in play_heldout(algo.env_runner_group, seeds)[0]}
    games = [
        None
        if by_seed.get(s) is None or by_seed[s]["status"] in LOST_STATUSES
        else {k: by_seed[s][k] for k in ("seed", "success", "turns", "status")} | {"reward": by_seed[s]["return"]}
        for s in seeds
    ]
    ok = [g for g in games if g is not None]
    return {
        "eval_successes": sum(bool(g["success"]) for g in ok),
        "eval_episodes": episodes,
        "eval_games": games,
        "eval_lost": episodes - len(ok),
        "eval_return_mean": sum(g["reward"] for g in ok) / max(len(ok), 1),
        "eval_temperature": c.evaluation_temperature,
        "eval_seconds": round(time.perf_counter() - t0, 1),
        "eval_cpu_s": None,  # in the runners' processes, not measured here
    }


def iteration_numbers(result: Dict[str, Any]) -> Dict[str, Any]:
    """The numbers a curve keeps from one ``algo.train()`` result (NaN or None where absent)."""
    from rllib_r3l.cli.main import iteration_record

    rec = iteration_record(0, result)
    r3l, learner = rec["r3l"], rec["learner"]
    keep = {"success_rate": rec["success_rate"], "num_episodes": result.get("env_runners", {}).get("num_episodes")}
    for k in (
        "num_retries",
        "retry_success_rate",
        "reflection_valid",
        "reflection_total",
        "reflection_valid_rate",
        "pivot_accuracy",
        "pivot_error_mean",
        "pivot_early_rate",
        "mean_pivot_turn",
        "generated_tokens",
        "generated_tokens_per_sample",
        "prompt_tokens_computed_per_sample",
        "retry_changed_pivot_action",
        "retry_took_oracle_action",
        "rollout_seconds",
        "prompt_tokens_computed_reflect",
        "reflections_skipped_successes",
        "generated_tokens_reflect",
        "reflections_truncated",
        "episodes_started",
        "retries_cut_by_budget",
        "pivot_exact_rate",
        "pivot_in_time_rate",
        "control_success_rate",
        "hindsight_pivot_shift",
    ):
        keep[k] = r3l.get(k)
    # the report's name for the tokens the reflector wrote
    keep["reflection_generated_tokens"] = keep.pop("generated_tokens_reflect")
    keep["reflect_s"] = rec["timers"].get("reflect_s")  # the part of the rollout spent reflecting
    keep["policy_lag_max"] = rec["credit"].get("policy_lag_max")  # max_policy_lag runs only (lag_heldout.py)
    keep["dynamic_extra_rounds"] = rec["dynamic_sampling"].get("extra_rounds")
    keep["groups_without_signal"] = rec["dynamic_sampling"].get("groups_without_signal")
    for k in ("trained_tokens", "forward_tokens", "update_seconds"):
        keep[k] = learner.get(k)
    for k, v in rec["batch"].items():  # credited tokens and loss share of each item kind
        if k.startswith(("credited_tokens_", "loss_share_")):
            keep[k] = v
    return {k: (float(v) if isinstance(v, numbers.Real) else v) for k, v in keep.items()}  # numpy's too


def keep_training(samples: float, budget: float) -> bool:
    """Another iteration while trajectories are left: the run stops at exactly ``budget`` (each
    iteration is capped at what is left, ``R3L.episode_cap``)."""
    return budget - samples > 0


def _samples_of(num: Dict[str, Any]) -> float:
    """Trajectories an iteration spent: every base and retry episode started (lost ones too); an older
    record without the count: its base episodes and retries."""
    if num.get("episodes_started") is not None:
        return float(num["episodes_started"])
    return float(num.get("num_episodes") or 0.0) + float(num.get("num_retries") or 0.0)


def run_one(out: Path, setting: Dict[str, Any], variant: str, seed: int) -> Dict[str, Any]:
    """Train ``variant`` at ``seed`` until the sample budget, checkpointing after every iteration,
    then evaluate on the held-out fold; resumes from the checkpoint; returns ``final.json``'s dict.
    While it runs, ``running.pid`` in the run's folder holds this process's pid (``held_by``)."""
    d = run_dir(out, variant, seed)
    if (d / "final.json").exists():
        return json.loads((d / "final.json").read_text())
    with holding(d):
        return _train_and_evaluate(d, out, setting, variant, seed)


@contextlib.contextmanager
def holding(d: Path) -> Iterator[None]:
    """``running.pid`` in ``d`` holds this process's pid while the body runs (``held_by``)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / LOCK).write_text(f"{os.getpid()}\n")
    try:
        yield
    finally:
        (d / LOCK).unlink(missing_ok=True)


@contextlib.contextmanager
def opened_run(
    d: Path, out: Path, setting: Dict[str, Any], variant: str, seed: int
) -> Iterator[Tuple[Any, Dict[str, Any], List[dict]]]:
    """The run's algorithm with its curve, ``(algo, header, records)``: resumed from ``d/checkpoint``
    (the records cut back to its iteration, the resume noted in the header) or built fresh (a new
    header, no records); Ray is started for it unless it runs, and both are stopped afterwards."""
    import ray

    import rllib_r3l  # noqa: F401
    from rllib_r3l.algorithm import R3L

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    ckpt, tmp, old = d / "checkpoint", d / "checkpoint.tmp", d / "checkpoint.old"
    header, recs = read_curve(d)
    if not ckpt.exists() and tmp.exists() and recs:
        tmp.rename(ckpt)  # a swap cut short: the save had finished, its record is written (``save_and_record``)
    shutil.rmtree(tmp, ignore_errors=True)  # a save that was cut short
    shutil.rmtree(old, ignore_errors=True)
    if header is not None and recs and not ckpt.exists():
        raise SystemExit(
            f"{d}: the curve records {len(recs)} iteration(s) but there is no checkpoint to resume "
            f"them from; delete the folder to rerun it"
        )
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    algo = None
    try:
        if header is not None and ckpt.exists():
            algo = R3L.from_checkpoint(str(ckpt))  # the config it started with, whatever the code's defaults now
            recs = [r for r in recs if r["iteration"] <= algo.iteration]  # a record written after the save
            if not recs or recs[-1]["iteration"] != algo.iteration:
                raise RuntimeError(
                    f"{d}: checkpoint at iteration {algo.iteration} but the curve's last record "
                    f"is {recs[-1]['iteration'] if recs else None}; delete the folder to rerun"
                )
            header.setdefault("resumed", []).append(
                {
                    "iteration": algo.iteration,
                    "git_commit": git_commit(),
                    "cpu_model": cpu_model(),
                    "at": time.strftime("%Y-%m-%d %H:%M:%S"),
                }
            )
            _write_curve(d, header, recs)
            print(f"[{variant} seed {seed}] resumed at iteration {algo.iteration}", flush=True)
        else:
            t0 = time.perf_counter()
            config = build_config(setting, variant, seed)
            options = option_diff(config)
            check_recorded(out, variant, options)
            algo = config.build_algo()
            header = {
                "variant": variant,
                "seed": seed,
                "options": options,
                "setting": setting,
                "git_commit": git_commit(),
                "build_seconds": round(time.perf_counter() - t0, 1),
                "cpu_model": cpu_model(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            }
            recs = []
            _write_curve(d, header, recs)
        # the run's retry ledger in its folder: a restore's rows are the checkpoint's (what ran after it reruns)
        from rllib_r3l import retry_ledger

        retry_ledger.adopt(algo, str(d / retry_ledger.LEDGER_FILE), restored=bool(recs))
        yield algo, header, recs
    finally:
        if algo is not None:
            algo.stop()
        if own_ray:
            ray.shutdown()


def train_iteration(d: Path, algo, header: Dict[str, Any], recs: List[dict]) -> Dict[str, Any]:
    """One ``algo.train()``; its record (``iteration_numbers``, cumulative samples, wall and CPU
    seconds, load, peak memory) is appended to ``recs`` and the curve with ``save_and_record``."""
    w0, c0 = time.perf_counter(), time.process_time()
    result = algo.train()
    num = iteration_numbers(result)
    samples = (recs[-1]["samples_cumulative"] if recs else 0.0) + _samples_of(num)
    rec = {
        "iteration": algo.iteration,
        **num,
        "samples_cumulative": samples,
        "wall_s": round(time.perf_counter() - w0, 2),
        "cpu_s": round(time.process_time() - c0, 2),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }
    save_and_record(d, algo, header, recs, rec)
    return rec


def save_and_record(d: Path, algo, header: Dict[str, Any], recs: List[dict], rec: Dict[str, Any]) -> None:
    """Save to ``checkpoint.tmp``, append ``rec`` to the curve, then swap the save in by two renames
    (``checkpoint`` -> ``checkpoint.old``, ``checkpoint.tmp`` -> ``checkpoint``): a kill at any point
    resumes cleanly (``opened_run``: a record without its save is dropped; a swap cut between its
    renames is finished)."""
    ckpt, tmp, old = d / "checkpoint", d / "checkpoint.tmp", d / "checkpoint.old"
    algo.save_to_path(str(tmp))
    recs.append(rec)
    _write_curve(d, header, recs)
    if ckpt.exists():
        ckpt.rename(old)
    tmp.rename(ckpt)
    shutil.rmtree(old, ignore_errors=True)


def iteration_line(variant: str, seed: int, rec: Dict[str, Any], progress: str) -> str:
    """The console's line for one iteration's record (``progress``: e.g. the samples against the budget)."""
    return (
        f"[{variant} seed {seed}] iteration {rec['iteration']}: {progress} "
        f"success {_fmt(rec.get('success_rate'))} retries {rec.get('num_retries') or 0:.0f} "
        f"retry success {_fmt(rec.get('retry_success_rate'))} update {_fmt(rec.get('trained_tokens'))} tok "
        f"reflection {_fmt(rec.get('reflection_generated_tokens'))} tok {_fmt(rec.get('reflect_s'))} s "
        f"{rec['wall_s']:.0f} s (cpu {rec['cpu_s']:.0f})"
    )


def _train_and_evaluate(d: Path, out: Path, setting: Dict[str, Any], variant: str, seed: int) -> Dict[str, Any]:
    with opened_run(d, out, setting, variant, seed) as (algo, header, recs):
        samples = recs[-1]["samples_cumulative"] if recs else 0.0
        while (
            variant != BASE and keep_training(samples, setting["budget"]) and algo.iteration < setting["max_iterations"]
        ):
            algo.episode_cap = int(setting["budget"] - samples)  # the last iteration stops at the budget
            rec = train_iteration(d, algo, header, recs)
            samples = rec["samples_cumulative"]
            print(iteration_line(variant, seed, rec, f"samples {samples:.0f}/{setting['budget']}"), flush=True)
        final = {
            "variant": variant,
            "seed": seed,
            "iterations": algo.iteration,
            "samples": samples,
            **evaluate_heldout(algo, setting["eval_episodes"]),
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        (d / "final.json").write_text(json.dumps(final, indent=1))
        shutil.rmtree(d / "checkpoint", ignore_errors=True)
        print(
            f"[{variant} seed {seed}] held-out {final['eval_successes']}/{final['eval_episodes']} "
            f"({final['eval_seconds']:.0f} s)",
            flush=True,
        )
        return final


def _write_curve(d: Path, header: dict, recs: List[dict]) -> None:
    tmp = d / "curve.jsonl.tmp"
    tmp.write_text("".join(json.dumps(x) + "\n" for x in [{"header": header}, *recs]))
    tmp.replace(d / "curve.jsonl")


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}" if x < 10 else f"{x:.0f}"


# ---------------------------------------------------------------------------------------------------
def sweep(
    out: Path,
    setting: Dict[str, Any],
    variants: Sequence[str],
    seeds: Sequence[int],
    parallel: int,
    script: str = __file__,
    tables: Optional[Callable[[], str]] = None,
) -> None:
    """Run what is left (``next_runs``), ``parallel`` child processes of ``script`` at a time (``run_children``);
    report after each (``tables``: a script's own report; default ``report``). Scripts over this harness
    (evidence_v5.py, lag_heldout.py) call it with their own ``script`` and ``tables``."""
    tables = tables or (lambda: report(out, variants, seeds))
    todo = next_runs(out, variants, seeds)
    print(f"{len(todo)} run(s) to do in {out}: {', '.join(f'{v}/seed{s}' for v, s in todo)}", flush=True)

    def finished(v: str, s: int, took: Optional[float]) -> None:
        print(f"{time.strftime('%H:%M:%S')} {v}/seed{s} done" + (f" in {took:.1f} min" if took else ""), flush=True)
        print(tables(), flush=True)

    run_children(out, todo, parallel, setting["num_threads"], finished, script=script)


def run_children(
    out: Path,
    todo: List[Tuple[str, int]],
    parallel: int,
    threads: Optional[int],
    finished: Callable[[str, int, Optional[float]], None],
    script: str = __file__,
    child_args: Sequence[str] = (),
    done: Optional[Callable[[Path], bool]] = None,
    poll: Optional[Callable[[], None]] = None,
) -> None:
    """Run ``todo``'s (variant, seed) runs as ``script --out OUT --child V:S CHILD_ARGS``, ``parallel``
    at a time (``threads`` threads each; output in the run folder's ``run.log``); ``finished`` is called
    after each run that ends ``done`` (default: its ``final.json`` exists); a failed run is retried once
    (from its checkpoint); ``poll``, if given, every 5 s.

    Runs a live child already holds (``held_by``: another sweep's, or a killed sweep's orphan) are not
    started again: they count against ``parallel`` until they end, then are reported if they
    finished, or resumed from their checkpoint if they were cut."""
    done = done or (lambda d: (d / "final.json").exists())
    todo = list(todo)
    running: List[Tuple[subprocess.Popen, str, int, float]] = []
    held: Dict[Tuple[str, int], int] = {}
    failed: Counter = Counter()
    env = harness.child_env(**({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    while todo or running or held:
        for (v, s), pid in list(held.items()):
            if held_by(run_dir(out, v, s), script) == pid:
                continue
            del held[(v, s)]
            if done(run_dir(out, v, s)):
                finished(v, s, None)
            else:
                print(
                    f"{time.strftime('%H:%M:%S')} {v}/seed{s}: its process (pid {pid}) ended before the run "
                    f"finished; resuming it from its checkpoint",
                    flush=True,
                )
                todo.insert(0, (v, s))
        while todo and len(running) + len(held) < parallel:
            v, s = todo.pop(0)
            d = run_dir(out, v, s)
            pid = held_by(d, script)
            if pid:
                held[(v, s)] = pid
                print(
                    f"{time.strftime('%H:%M:%S')} {v}/seed{s} is running in process {pid}; waiting for it", flush=True
                )
                continue
            if done(d):
                continue
            d.mkdir(parents=True, exist_ok=True)
            log = open(d / "run.log", "a")
            cmd = [sys.executable, script, "--out", str(out), "--child", f"{v}:{s}", *child_args]
            running.append(
                (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT), env=env), v, s, time.time())
            )
            print(f"{time.strftime('%H:%M:%S')} started {v}/seed{s}", flush=True)
        time.sleep(5)
        if poll is not None:
            poll()
        for item in list(running):
            p, v, s, t0 = item
            if p.poll() is None:
                continue
            running.remove(item)
            took = (time.time() - t0) / 60
            if p.returncode != 0:
                failed[(v, s)] += 1
                print(
                    f"{time.strftime('%H:%M:%S')} {v}/seed{s} FAILED rc={p.returncode} after {took:.1f} min "
                    f"(log: {run_dir(out, v, s) / 'run.log'})",
                    flush=True,
                )
                if failed[(v, s)] < 2:
                    todo.insert(0, (v, s))  # once more, from its checkpoint
                continue
            finished(v, s, took)
    if failed:
        print(f"failed runs (rerun the script to resume them): {dict(failed)}", flush=True)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--variants",
        default=None,
        help=f"comma list of {list(VARIANTS)} (default: all; with --report-only: those in --out)",
    )
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--budget", type=int, default=DEFAULT_SETTING["budget"], help="trajectories per run (base + retry)")
    ap.add_argument("--eval-episodes", type=int, default=DEFAULT_SETTING["eval_episodes"])
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    variants = [v for v in (args.variants or "").split(",") if v]
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    if args.child:
        v, s = args.child.split(":")
        run_one(out, read_setting(out)["common"], v, int(s))
        return
    if args.report_only:
        if not (out / "setting.json").exists():
            raise SystemExit(
                f"--report-only: {out} holds no sweep (no setting.json); run the sweep first or pass --out <its folder>"
            )
        print(report(out, variants or [v for v in folder_variants(out) if v != BASE], seeds))
        return
    variants = variants or list(VARIANTS)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants: unknown {bad}; choose from {list(VARIANTS)}")
    setting = dict(DEFAULT_SETTING, budget=args.budget, eval_episodes=args.eval_episodes)
    check_setting(out, setting, variant_diffs(setting, [BASE, *variants]))
    sweep(out, setting, variants, seeds, args.parallel)
    print(report(out, variants, seeds))


if __name__ == "__main__":
    main()
