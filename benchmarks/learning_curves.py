"""When does reflect-then-retry pay? Learning curves of R3L, its ablations and GRPO (issue 11, item 5).

    .venv/bin/python benchmarks/learning_curves.py                      # the whole sweep; resumable
    .venv/bin/python benchmarks/learning_curves.py --variants grpo,r3l_oracle --seeds 0
    .venv/bin/python benchmarks/learning_curves.py --report-only        # table, CSV and PNG from what is there

Variants (everything else identical: model, environment, group size, task groups per iteration,
learning rate, the same training task seeds for a seed):

* ``grpo``: no reflection, group-normalised advantages;
* ``r3l``: the policy reflects on its failures and retries from its pivot (paper §4);
* ``r3l_oracle``: R3L whose reports come from the environment's oracle (the oracle pivot and the gold
  action there): the DIAGNOSTIC upper bound of what reflection can hand to the rest of R3L;
* ``r3l_no_reflect``: amplification only (no reflection, no retries);
* ``r3l_no_amp``: R3L without positive amplification; ``r3l_no_pivot``: R3L without pivotal credit;
* ``r3l_oracle_plain``: R3L-oracle whose guidance is one plain sentence (``Advice for this step:
  <suggestion>``) instead of the report as JSON;
* ``r3l_no_aux``: R3L without the auxiliary reflection/retry-SFT items; ``r3l_no_reflection_sft``:
  without the reflection items only (the guided-retry items stay); ``r3l_seq_mean``: R3L with all of
  them, the loss averaged per item (``loss_aggregation="sequence_mean"``) so that a ~100-token
  reflection report weighs as one trajectory, not as ~30 actions (diagnostics of section 7).

**Equal sample budget.** A run trains until it has generated ``budget`` trajectories (base + retry;
a group of N holds N base rollouts without reflection, N/2 base + up to N/2 retries with it), so R3L
variants run more, cheaper-per-sample iterations than GRPO; tokens and CPU seconds are reported too.
Held-out evaluation: ``eval_episodes`` games of the environment's *test* fold (seeds 0..E-1, disjoint
from training) at the evaluation temperature, with the run's own engine, no reflection; ``base`` is
the untrained model evaluated the same way (once per seed).

**Resumable.** Each (variant, seed) run lives in ``<out>/<variant>/seed<k>/``: ``curve.jsonl`` (a
header, then one record per iteration, appended as it finishes) and ``checkpoint/`` (the algorithm
after the last recorded iteration; git-ignored; deleted when the run is done). A killed run restarts
from its checkpoint; a finished one (``final.json``) is skipped. ``setting.json`` at the top holds the
sweep's setting: resuming with another setting is refused (name the field, or use another ``--out``).
Runs go ``--parallel`` at a time (default 2, one thread each: the 2-core machine): cut runs first, then
the headline comparison (base, GRPO, R3L-oracle, R3L) for every seed, then the ablations, then the
diagnostic probes (``next_runs``). A running child keeps its pid in its folder's
``running.pid``: a second sweep on the same folder, or a restarted one whose killed parent left its
children running, waits for those runs instead of starting them twice.

The sweep writes its results and never commits them: commit the folder yourself when a run is worth
keeping. Not a test: a benchmark script (its arithmetic is tested in
``benchmarks/tests/test_learning_curves.py``; the intervals are ``benchmarks/harness.py``'s).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402
from benchmarks.harness import mean_interval, risk_ratio, wilson  # noqa: E402  (the statistics)
from rllib_r3l.cli.run_info import cpu_model  # noqa: E402

# v2 (issue 11's sweep) ran with vLLM's choice grammar, full TWX text and unshared sequences; v3 runs
# the shipped defaults: actions in the tokenizer's own tokens, compact observations, shared prefixes.
OUT = harness.RESULTS / "learning_curves_v3"

PLAIN_GUIDANCE = "Advice for this step: {suggestion}"
PAPER_AUX_ITEMS = ("reflection_sft", "retry_sft")

# variant -> R3L switches (everything else identical)
VARIANTS: Dict[str, Dict[str, Any]] = {
    "grpo": dict(reflect=False, pivotal_credit=False, positive_amplification=False, std_normalize=True),
    "r3l_oracle": dict(reflect=True, reflector="oracle", pivotal_credit=True, positive_amplification=True,
                       std_normalize=False),
    "r3l": dict(reflect=True, pivotal_credit=True, positive_amplification=True, std_normalize=False),
    "r3l_no_reflect": dict(reflect=False, pivotal_credit=True, positive_amplification=True, std_normalize=False),
    "r3l_no_amp": dict(reflect=True, pivotal_credit=True, positive_amplification=False, std_normalize=False),
    "r3l_no_pivot": dict(reflect=True, pivotal_credit=False, positive_amplification=True, std_normalize=False),
    # own reflections without the auxiliary reflection/retry-SFT items: do they swamp the policy
    # gradient? (the token-mean gives each report token a fixed advantage of 1.0)
    "r3l_no_aux": dict(reflect=True, aux_items=[], pivotal_credit=True, positive_amplification=True,
                       std_normalize=False),
    # ... or with the guided-retry items only: is it the policy's own reports, trained as positives?
    "r3l_no_reflection_sft": dict(reflect=True, aux_items=["retry_sft"], pivotal_credit=True,
                                  positive_amplification=True, std_normalize=False),
    # ... or with them, every item weighing as one sequence (its token mean) instead of by its length
    "r3l_seq_mean": dict(reflect=True, loss_aggregation="sequence_mean", pivotal_credit=True,
                         positive_amplification=True, std_normalize=False),
    # the oracle's report handed over as one plain sentence instead of JSON: does a small policy
    # follow guidance it can read? (docs/benchmarks.md section 7, guidance wording: 4/16 vs 1/16)
    "r3l_oracle_plain": dict(reflect=True, reflector="oracle", guidance_template=PLAIN_GUIDANCE, pivotal_credit=True,
                             positive_amplification=True, std_normalize=False),
}
BASE = "base"  # the untrained model, evaluated once per seed
HEADLINE = ("grpo", "r3l_oracle", "r3l")  # the comparison the issue asks for; the rest are ablations
DIAGNOSTIC = ("r3l_no_aux", "r3l_seq_mean", "r3l_no_reflection_sft", "r3l_oracle_plain")  # probes beyond the issue's variants: scheduled after the ablations
LOCK = "running.pid"  # a run's child writes its pid here while it runs

# The sweep's setting (the CPU default environment and model; lr 1e-5 as in the first version, which
# moved held-out success from 0-0.06 to 0.25 within 80 samples on this setting).
DEFAULT_SETTING: Dict[str, Any] = {
    "env": "r3l/CoinCollector", "env_config": {"compact_observations": True}, "model": None, "backend": "vllm",
    "group_size": 8, "tasks_per_iteration": 2, "lr": 1e-5, "micro_batch_size": 4, "micro_batch_tokens": 1024,
    "budget": 64, "max_iterations": 12, "eval_episodes": 32, "num_threads": 1, "training": {},
    "choice_tokenization": "canonical", "share_prefixes": True,
    # the same numerics on every CPU a session may draw (bf16 is native on some, emulated on others)
    "engine_dtype": "float32", "mixed_precision": "none",
}

# ---------------------------------------------------------------------------------------------------
# curves (pure)
def interpolate_curve(xs: Sequence[float], ys: Sequence[float], grid: Sequence[float]) -> List[float]:
    """Piecewise-linear ``ys(xs)`` on ``grid``; NaN outside ``[xs[0], xs[-1]]`` (no extrapolation)."""
    out = []
    for g in grid:
        if not xs or g < xs[0] or g > xs[-1]:
            out.append(math.nan)
            continue
        for i in range(len(xs)):
            if xs[i] == g:
                out.append(float(ys[i]))
                break
            if i + 1 < len(xs) and xs[i] < g < xs[i + 1]:
                w = (g - xs[i]) / (xs[i + 1] - xs[i])
                out.append(float(ys[i]) * (1 - w) + float(ys[i + 1]) * w)
                break
    return out


# ---------------------------------------------------------------------------------------------------
# what a run recorded (pure, on the files)
def run_dir(out: Path, variant: str, seed: int) -> Path:
    return out / variant / f"seed{seed}"


def read_curve(d: Path) -> Tuple[Optional[dict], List[dict]]:
    p = d / "curve.jsonl"
    if not p.exists():
        return None, []
    lines = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    header = lines[0].get("header") if lines else None
    return header, [x for x in lines[1:] if "iteration" in x]


def run_numbers(out: Path, variant: str, seed: int) -> Optional[Dict[str, Any]]:
    """A finished run's numbers: final held-out success (k/n), samples, iterations, updates, cost,
    pooled retry success and pivot accuracy; None until ``final.json`` exists."""
    d = run_dir(out, variant, seed)
    if not (d / "final.json").exists():
        return None
    final = json.loads((d / "final.json").read_text())
    _, recs = read_curve(d)
    trained = [r for r in recs if r["iteration"] > 0]

    def tot(key: str) -> float:
        return float(sum(r.get(key) or 0.0 for r in trained))

    retries = tot("num_retries")

    def per_retry(key: str) -> float:
        """A per-retry rate pooled over iterations (weighted by retries); NaN where never logged."""
        pairs = [(r.get(key), r.get("num_retries") or 0.0) for r in trained]
        pairs = [(x, w) for x, w in pairs if x is not None and not math.isnan(x) and w > 0]
        return sum(x * w for x, w in pairs) / sum(w for _, w in pairs) if pairs else math.nan

    valid = tot("reflection_valid")
    pivots = [(r.get("pivot_accuracy"), r.get("reflection_valid") or 0.0) for r in trained]
    pivots = [(p, w) for p, w in pivots if p is not None and not math.isnan(p) and w > 0]
    samples = trained[-1]["samples_cumulative"] if trained else 0.0
    return {
        "variant": variant, "seed": seed,
        "eval_success": final["eval_successes"] / max(final["eval_episodes"], 1),
        "eval_successes": int(final["eval_successes"]), "eval_episodes": int(final["eval_episodes"]),
        "iterations": len(trained), "samples": samples,
        "updates": sum(1 for r in trained if (r.get("trained_tokens") or 0) > 0),
        "train_success_last": trained[-1].get("success_rate") if trained else math.nan,
        "retry_success": per_retry("retry_success_rate"),
        "retry_changed_pivot_action": per_retry("retry_changed_pivot_action"),
        "retry_took_oracle_action": per_retry("retry_took_oracle_action"),
        "retries": retries,
        "pivot_accuracy": sum(p * w for p, w in pivots) / sum(w for _, w in pivots) if pivots else math.nan,
        "reflections_valid": valid,
        "cpu_s": tot("cpu_s"), "wall_s": tot("wall_s"),
        "cpu_s_per_iteration": tot("cpu_s") / len(trained) if trained else math.nan,
        "cpu_s_per_sample": tot("cpu_s") / samples if samples else math.nan,
        "generated_tokens": tot("generated_tokens"), "learner_forward_tokens": tot("forward_tokens"),
        "trained_tokens": tot("trained_tokens"),
    }


def summarize(out: Path, variants: Sequence[str], seeds: Sequence[int]) -> Dict[str, Any]:
    """Per variant: final held-out success over seeds (mean, std, 95 % t-interval; pooled k/n with its
    Wilson interval), cost and reflection numbers; and each variant against GRPO: paired differences
    over seeds and the pooled risk ratio (Katz)."""
    per: Dict[str, Dict[int, Dict[str, Any]]] = {}
    for v in [BASE, *variants]:
        for s in seeds:
            n = run_numbers(out, v, s)
            if n is not None:
                per.setdefault(v, {})[s] = n
    table: Dict[str, Any] = {}
    for v, by_seed in per.items():
        rows = list(by_seed.values())
        k = sum(r["eval_successes"] for r in rows)
        n = sum(r["eval_episodes"] for r in rows)
        entry = {"seeds": sorted(by_seed), "eval_success": mean_interval([r["eval_success"] for r in rows]),
                 "pooled": {"k": k, "n": n, "rate": k / n if n else math.nan, "wilson": wilson(k, n)}}
        for key in ("samples", "iterations", "updates", "retry_success", "retry_changed_pivot_action",
                    "retry_took_oracle_action", "pivot_accuracy", "cpu_s_per_iteration",
                    "cpu_s_per_sample", "generated_tokens", "learner_forward_tokens", "trained_tokens"):
            entry[key] = mean_interval([r[key] for r in rows])
        entry["retries_total"] = sum(r["retries"] for r in rows)
        table[v] = entry
    ref = per.get("grpo", {})
    for v, by_seed in per.items():
        if v == "grpo" or not ref:
            continue
        common = sorted(set(by_seed) & set(ref))
        if not common:
            continue
        k1 = sum(by_seed[s]["eval_successes"] for s in common)
        n1 = sum(by_seed[s]["eval_episodes"] for s in common)
        k0 = sum(ref[s]["eval_successes"] for s in common)
        n0 = sum(ref[s]["eval_episodes"] for s in common)
        table[v]["vs_grpo"] = {
            "seeds": common,
            "diff": harness.paired_difference({s: by_seed[s]["eval_success"] for s in common},
                                              {s: ref[s]["eval_success"] for s in common}),
            "risk_ratio": risk_ratio(k1, n1, k0, n0),
            "cpu_s_per_sample_ratio": mean_interval([by_seed[s]["cpu_s_per_sample"] / ref[s]["cpu_s_per_sample"]
                                                     for s in common if ref[s]["cpu_s_per_sample"]]),
        }
    return {"variants": table, "per_seed": {v: {str(s): r for s, r in d.items()} for v, d in per.items()}}


def held_by(d: Path) -> Optional[int]:
    """The pid of a live sweep child running the run in ``d`` (its ``running.pid``), else None.

    A pid whose process is gone, or is not a ``--child`` of this script (the pid was reused), does
    not hold the run."""
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
        if b"--child" not in args or not any(a.endswith(os.path.basename(__file__).encode()) for a in args):
            return None
    return pid


def next_runs(out: Path, variants: Sequence[str], seeds: Sequence[int]) -> List[Tuple[str, int]]:
    """The runs still to do: runs already started (a cut run resumes from its checkpoint) first, then
    the headline comparison (the base evaluation, GRPO, R3L-oracle, R3L) for every seed, then the
    ablations for every seed, then the diagnostic probes; seed-major within each group. So a sweep cut
    short has the headline ratios over all seeds before it spends time on ablations. Runs that a live
    child holds (another sweep's, or one whose parent was killed) are listed too: ``sweep`` waits for
    them instead of starting them twice."""
    started, headline, ablations, diagnostic = [], [], [], []
    for s in seeds:
        for v in [BASE, *variants]:
            d = run_dir(out, v, s)
            if (d / "final.json").exists():
                continue
            if (d / "curve.jsonl").exists() or held_by(d):
                started.append((v, s))
            elif v == BASE or v in HEADLINE:
                headline.append((v, s))
            elif v in DIAGNOSTIC:
                diagnostic.append((v, s))
            else:
                ablations.append((v, s))
    return started + headline + ablations + diagnostic


def check_setting(out: Path, setting: Dict[str, Any]) -> None:
    """Write ``setting.json`` the first time; refuse a different setting later (naming the fields)."""
    p = out / "setting.json"
    if not p.exists():
        out.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(setting, indent=1, sort_keys=True))
        return
    old = json.loads(p.read_text())
    diff = sorted(k for k in set(old) | set(setting) if old.get(k) != setting.get(k))
    if diff:
        detail = ", ".join(f"{k}: {old.get(k)!r} there, {setting.get(k)!r} now" for k in diff)
        raise SystemExit(f"{out} holds a sweep with another setting ({detail}); pass the same options to "
                         f"resume it, or --out <new folder> for a new sweep")


# ---------------------------------------------------------------------------------------------------
# one run (a child process)
def build_config(setting: Dict[str, Any], variant: str, seed: int):
    from rllib_r3l import R3LConfig

    # the sweep's R3L is the paper's: both auxiliary items unless a variant says otherwise (the
    # embedded default dropped the reflection-SFT item after this sweep; its runs stay resumable)
    switches = {"aux_items": list(PAPER_AUX_ITEMS), **VARIANTS["grpo" if variant == BASE else variant]}
    training = dict(group_size=setting["group_size"], tasks_per_iteration=setting["tasks_per_iteration"],
                    lr=setting["lr"], micro_batch_size=setting["micro_batch_size"],
                    micro_batch_tokens=setting["micro_batch_tokens"], backend=setting["backend"],
                    num_threads=setting["num_threads"], sampling_seed=seed,
                    # the v2 sweep trained every sequence on its own (share_prefixes became the
                    # default later; same gradient, other float summation order): kept for its runs
                    share_prefixes=bool(setting.get("share_prefixes", False)),
                    # a setting.json without the key is v2's, which sampled actions with vLLM's grammar
                    backend_options={"choice_tokenization": setting.get("choice_tokenization", "any"),
                                     **({"dtype": setting["engine_dtype"]} if setting.get("engine_dtype") else {})},
                    **switches)
    if setting.get("mixed_precision"):
        training["mixed_precision"] = setting["mixed_precision"]
    if setting.get("model"):
        training["model"] = setting["model"]
    training.update(setting.get("training") or {})
    return (R3LConfig().environment(setting["env"], env_config=dict(setting["env_config"]))
            .training(**training).debugging(seed=seed))


def evaluate_heldout(algo, episodes: int) -> Dict[str, Any]:
    """``episodes`` games of the test fold (seeds 0..E-1) with the runner's engine at the evaluation
    temperature: base episodes, no reflection. Lost episodes (errors) are counted, not dropped."""
    import environments
    from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions

    runner = algo.env_runner  # local runner (num_env_runners=0): holds the synced engine
    c = algo.config
    env_config = dict(c.env_config, split="test")
    opts = RolloutOptions(max_turns=c.max_turns, max_response_tokens=c.max_response_tokens,
                          max_context_tokens=c.max_context_tokens, temperature=c.evaluation_temperature,
                          top_p=c.top_p, action_decoding=c.action_decoding, system_prompt=c.system_prompt)
    counters: Counter = Counter()
    er = EpisodeRunner(runner.backend, runner._chat, lambda: environments.make(c.env, env_config), opts, counters)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        trajs = er.run([EpisodeSpec(seed=s, group_id=f"eval-{s}") for s in range(episodes)])
    finally:
        er.close()
    ok = [t for t in trajs if t is not None]
    return {"eval_successes": sum(bool(t.success) for t in ok), "eval_episodes": episodes,
            "eval_lost": episodes - len(ok), "eval_return_mean": sum(float(t.reward) for t in ok) / max(len(ok), 1),
            "eval_temperature": c.evaluation_temperature, "eval_seconds": round(time.perf_counter() - t0, 1),
            "eval_cpu_s": round(time.process_time() - c0, 1)}


def iteration_numbers(result: Dict[str, Any]) -> Dict[str, Any]:
    """The numbers a curve keeps from one ``algo.train()`` result (NaN where absent)."""
    from rllib_r3l.cli.main import iteration_record

    rec = iteration_record(0, result)
    r3l, learner = rec["r3l"], rec["learner"]
    keep = {"success_rate": rec["success_rate"], "num_episodes": result.get("env_runners", {}).get("num_episodes")}
    for k in ("num_retries", "retry_success_rate", "reflection_valid", "reflection_total", "reflection_valid_rate",
              "pivot_accuracy", "pivot_error_mean", "pivot_early_rate", "mean_pivot_turn", "generated_tokens",
              "generated_tokens_per_sample", "prompt_tokens_computed_per_sample", "retry_changed_pivot_action",
              "retry_took_oracle_action"):
        keep[k] = r3l.get(k)
    for k in ("trained_tokens", "forward_tokens", "update_seconds"):
        keep[k] = learner.get(k)
    for k, v in rec["batch"].items():  # credited tokens and loss share of each item kind
        if k.startswith(("credited_tokens_", "loss_share_")):
            keep[k] = v
    return {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in keep.items()}


def keep_training(samples: float, budget: float, last_iteration_samples: float) -> bool:
    """Another iteration while it brings the run's samples nearer the budget: stop at the budget, or
    when less than half an iteration (the last one's samples) is left, so that a variant whose
    iterations yield 15 samples stops at 63 rather than 78 of a 64 budget (the samples actually
    used are reported per run)."""
    gap = budget - samples
    return gap > 0 and gap > 0.5 * last_iteration_samples


def _samples_of(num: Dict[str, Any]) -> float:
    return float(num.get("num_episodes") or 0.0) + float(num.get("num_retries") or 0.0)


def run_one(out: Path, setting: Dict[str, Any], variant: str, seed: int) -> Dict[str, Any]:
    """Train ``variant`` at ``seed`` until the sample budget, checkpointing after every iteration,
    then evaluate on the held-out fold; resumes from the checkpoint; returns ``final.json``'s dict.
    While it runs, ``running.pid`` in the run's folder holds this process's pid (``held_by``)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    d = run_dir(out, variant, seed)
    if (d / "final.json").exists():
        return json.loads((d / "final.json").read_text())
    d.mkdir(parents=True, exist_ok=True)
    (d / LOCK).write_text(f"{os.getpid()}\n")
    try:
        return _train_and_evaluate(d, out, setting, variant, seed)
    finally:
        (d / LOCK).unlink(missing_ok=True)


def _train_and_evaluate(d: Path, out: Path, setting: Dict[str, Any], variant: str, seed: int) -> Dict[str, Any]:
    import ray

    import rllib_r3l  # noqa: F401
    from rllib_r3l.algorithm import R3L

    ckpt, tmp = d / "checkpoint", d / "checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # a save that was cut short
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    header, recs = read_curve(d)
    algo = None
    try:
        if header is not None and ckpt.exists():
            algo = R3L.from_checkpoint(str(ckpt))
            recs = [r for r in recs if r["iteration"] <= algo.iteration]  # a record written after the save
            if not recs or recs[-1]["iteration"] != algo.iteration:
                raise RuntimeError(f"{d}: checkpoint at iteration {algo.iteration} but the curve's last record "
                                   f"is {recs[-1]['iteration'] if recs else None}; delete the folder to rerun")
            _write_curve(d, header, recs)
            print(f"[{variant} seed {seed}] resumed at iteration {algo.iteration}", flush=True)
        else:
            t0 = time.perf_counter()
            algo = build_config(setting, variant, seed).build_algo()
            header = {"variant": variant, "seed": seed, "switches": VARIANTS["grpo" if variant == BASE else variant],
                      "setting": setting, "build_seconds": round(time.perf_counter() - t0, 1),
                      "cpu_model": cpu_model(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
            recs = []
            _write_curve(d, header, recs)
        samples = recs[-1]["samples_cumulative"] if recs else 0.0
        last = _samples_of(recs[-1]) if recs else 0.0
        while (variant != BASE and keep_training(samples, setting["budget"], last)
               and algo.iteration < setting["max_iterations"]):
            w0, c0 = time.perf_counter(), time.process_time()
            result = algo.train()
            num = iteration_numbers(result)
            last = _samples_of(num)
            samples += last
            rec = {"iteration": algo.iteration, **num, "samples_cumulative": samples,
                   "wall_s": round(time.perf_counter() - w0, 2), "cpu_s": round(time.process_time() - c0, 2),
                   "loadavg_1m": round(os.getloadavg()[0], 2),
                   "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}
            algo.save_to_path(str(tmp))  # save, record, then swap: a kill at any point resumes cleanly
            recs.append(rec)
            _write_curve(d, header, recs)
            shutil.rmtree(ckpt, ignore_errors=True)
            tmp.rename(ckpt)
            print(f"[{variant} seed {seed}] iteration {algo.iteration}: samples {samples:.0f}/{setting['budget']} "
                  f"success {_fmt(num['success_rate'])} retries {num.get('num_retries') or 0:.0f} "
                  f"retry success {_fmt(num.get('retry_success_rate'))} update {_fmt(num.get('trained_tokens'))} tok "
                  f"{rec['wall_s']:.0f} s (cpu {rec['cpu_s']:.0f})", flush=True)
        final = {"variant": variant, "seed": seed, "iterations": algo.iteration, "samples": samples,
                 **evaluate_heldout(algo, setting["eval_episodes"]),
                 "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        (d / "final.json").write_text(json.dumps(final, indent=1))
        shutil.rmtree(ckpt, ignore_errors=True)
        print(f"[{variant} seed {seed}] held-out {final['eval_successes']}/{final['eval_episodes']} "
              f"({final['eval_seconds']:.0f} s)", flush=True)
        return final
    finally:
        if algo is not None:
            algo.stop()
        if own_ray:
            ray.shutdown()


def _write_curve(d: Path, header: dict, recs: List[dict]) -> None:
    tmp = d / "curve.jsonl.tmp"
    tmp.write_text("".join(json.dumps(x) + "\n" for x in [{"header": header}, *recs]))
    tmp.replace(d / "curve.jsonl")


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}" if x < 10 else f"{x:.0f}"


# ---------------------------------------------------------------------------------------------------
# report
def _ci(e: Dict[str, float], digits: int = 3) -> str:
    if not e or e.get("n", 0) == 0 or math.isnan(e["mean"]):
        return "-"
    if e["n"] == 1:
        return f"{e['mean']:.{digits}f} (1 seed)"
    return f"{e['mean']:.{digits}f} ± {e['std']:.{digits}f} [{e['lo']:.{digits}f}, {e['hi']:.{digits}f}]"


def report(out: Path, variants: Sequence[str], seeds: Sequence[int]) -> str:
    """The markdown table (also written to ``summary.md``), ``summary.json``, ``runs.csv`` and the PNG."""
    s = summarize(out, variants, seeds)
    lines = ["| variant | seeds | held-out success: mean ± std [95 % t] | pooled k/n [Wilson] | vs GRPO: paired diff over seeds "
             "[95 % t] | vs GRPO: risk ratio [Katz] | samples | iterations | retry success | retry changed its pivot "
             "action | retry took the oracle's action | pivot acc. | CPU s / sample |", "|" + "---|" * 13]
    for v in [BASE, *variants]:
        e = s["variants"].get(v)
        if e is None:
            continue
        p = e["pooled"]
        vs = e.get("vs_grpo", {})
        rr = vs.get("risk_ratio")
        rr_s = "-" if not rr or math.isnan(rr["ratio"]) else (
            f"{rr['ratio']:.2f} [{rr['lo']:.2f}, {rr['hi']:.2f}]" + (" (0.5-corrected)" if rr["corrected"] else ""))
        lines.append(f"| {v} | {len(e['seeds'])} | {_ci(e['eval_success'])} | {p['k']}/{p['n']} "
                     f"[{p['wilson'][0]:.2f}, {p['wilson'][1]:.2f}] | {_ci(vs.get('diff', {}))} | {rr_s} | "
                     f"{_ci(e['samples'], 0)} | {_ci(e['iterations'], 1)} | {_ci(e['retry_success'], 2)} | "
                     f"{_ci(e['retry_changed_pivot_action'], 2)} | {_ci(e['retry_took_oracle_action'], 2)} | "
                     f"{_ci(e['pivot_accuracy'], 2)} | {_ci(e['cpu_s_per_sample'], 0)} |")
    text = "\n".join(lines)
    (out / "summary.md").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps(s, indent=1, default=float))
    _write_csv(out, s)
    _plot(out, variants, seeds, s)
    return text


def _write_csv(out: Path, s: Dict[str, Any]) -> None:
    import csv

    rows = [r for d in s["per_seed"].values() for r in d.values()]
    if not rows:
        return
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _plot(out: Path, variants: Sequence[str], seeds: Sequence[int], s: Dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    color = {v: f"C{i % 10}" for i, v in enumerate([BASE, *VARIANTS])}  # one colour per variant, both panels
    for v in variants:
        curves = []
        for seed in seeds:
            _, recs = read_curve(run_dir(out, v, seed))
            tr = [r for r in recs if r["iteration"] > 0 and r.get("success_rate") is not None]
            if tr:
                curves.append(([r["samples_cumulative"] for r in tr], [r["success_rate"] for r in tr]))
        if not curves:
            continue
        top = max(c[0][-1] for c in curves)
        grid = np.linspace(min(c[0][0] for c in curves), top, 24)
        ys = np.array([interpolate_curve(x, y, grid) for x, y in curves], dtype=float)
        with np.errstate(all="ignore"):
            m, sd = np.nanmean(ys, axis=0), np.nanstd(ys, axis=0)
        axes[0].plot(grid, m, label=f"{v} ({len(curves)} seeds)", color=color[v])
        axes[0].fill_between(grid, m - sd, m + sd, alpha=0.2, color=color[v])
    names = [v for v in [BASE, *variants] if v in s["variants"]]
    for i, v in enumerate(names):
        e = s["variants"][v]["eval_success"]
        err = None if math.isnan(e["lo"]) else [[e["mean"] - e["lo"]], [e["hi"] - e["mean"]]]
        axes[1].errorbar([i], [e["mean"]], yerr=err, fmt="o", capsize=4, color=color[v])
        for r in s["per_seed"][v].values():
            axes[1].plot([i + 0.12], [r["eval_success"]], ".", color="gray")
    axes[1].set_xticks(range(len(names)), names, rotation=30, ha="right")
    axes[0].set_title("base-rollout success on training tasks (mean ± std over seeds)")
    axes[0].set_xlabel("trajectories generated (base + retry)")
    axes[1].set_title("final held-out success (mean, 95 % t-interval; dots: seeds)")
    for ax in axes:
        ax.set_ylabel("success rate")
        ax.set_ylim(-0.02, 1.0)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------
def sweep(out: Path, setting: Dict[str, Any], variants: Sequence[str], seeds: Sequence[int], parallel: int) -> None:
    """Run what is left, ``parallel`` child processes at a time (one thread each); report after each.

    Runs a live child already holds (``held_by``: another sweep's, or a killed sweep's orphan) are not
    started again: they count against ``parallel`` until they end, then are reported if they
    finished, or resumed from their checkpoint if they were cut."""
    todo = next_runs(out, variants, seeds)
    print(f"{len(todo)} run(s) to do in {out}: {', '.join(f'{v}/seed{s}' for v, s in todo)}", flush=True)
    running: List[Tuple[subprocess.Popen, str, int, float]] = []
    held: Dict[Tuple[str, int], int] = {}
    failed: Counter = Counter()
    env = harness.child_env(OMP_NUM_THREADS=str(setting["num_threads"]))

    def finished(v: str, s: int, took: Optional[float]) -> None:
        print(f"{time.strftime('%H:%M:%S')} {v}/seed{s} done" + (f" in {took:.1f} min" if took else ""), flush=True)
        print(report(out, variants, seeds), flush=True)

    while todo or running or held:
        for (v, s), pid in list(held.items()):
            if held_by(run_dir(out, v, s)) == pid:
                continue
            del held[(v, s)]
            if (run_dir(out, v, s) / "final.json").exists():
                finished(v, s, None)
            else:
                print(f"{time.strftime('%H:%M:%S')} {v}/seed{s}: its process (pid {pid}) ended before the run "
                      f"finished; resuming it from its checkpoint", flush=True)
                todo.insert(0, (v, s))
        while todo and len(running) + len(held) < parallel:
            v, s = todo.pop(0)
            d = run_dir(out, v, s)
            pid = held_by(d)
            if pid:
                held[(v, s)] = pid
                print(f"{time.strftime('%H:%M:%S')} {v}/seed{s} is running in process {pid}; waiting for it", flush=True)
                continue
            if (d / "final.json").exists():
                continue
            d.mkdir(parents=True, exist_ok=True)
            log = open(d / "run.log", "a")
            cmd = [sys.executable, __file__, "--out", str(out), "--child", f"{v}:{s}"]
            running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT), env=env),
                            v, s, time.time()))
            print(f"{time.strftime('%H:%M:%S')} started {v}/seed{s}", flush=True)
        time.sleep(5)
        for item in list(running):
            p, v, s, t0 = item
            if p.poll() is None:
                continue
            running.remove(item)
            took = (time.time() - t0) / 60
            if p.returncode != 0:
                failed[(v, s)] += 1
                print(f"{time.strftime('%H:%M:%S')} {v}/seed{s} FAILED rc={p.returncode} after {took:.1f} min "
                      f"(log: {run_dir(out, v, s) / 'run.log'})", flush=True)
                if failed[(v, s)] < 2:
                    todo.insert(0, (v, s))  # once more, from its checkpoint
                continue
            finished(v, s, took)
    if failed:
        print(f"failed runs (rerun the script to resume them): {dict(failed)}", flush=True)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {list(VARIANTS)}")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--budget", type=int, default=DEFAULT_SETTING["budget"], help="trajectories per run (base + retry)")
    ap.add_argument("--eval-episodes", type=int, default=DEFAULT_SETTING["eval_episodes"])
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants: unknown {bad}; choose from {list(VARIANTS)}")
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    if args.child:
        v, s = args.child.split(":")
        run_one(out, json.loads((out / "setting.json").read_text()), v, int(s))
        return
    if args.report_only:
        if not (out / "setting.json").exists():
            raise SystemExit(f"--report-only: {out} holds no sweep (no setting.json); run the sweep first or "
                             f"pass --out <its folder>")
        print(report(out, variants, seeds))
        return
    setting = dict(DEFAULT_SETTING, budget=args.budget, eval_episodes=args.eval_episodes)
    check_setting(out, setting)
    sweep(out, setting, variants, seeds, args.parallel)
    print(report(out, variants, seeds))


if __name__ == "__main__":
    main()
