"""What every benchmark shares: where results go, intervals, child processes, Markdown tables, and
the main job run under several settings, alternating and resumable.

Intervals: the unit is a run (or a seed), never an episode or a game. ``mean_interval`` is the mean
over runs with a 95 % Student t interval; ``paired_difference`` the mean of the per-unit differences
between two settings over the units both have (seed k against seed k, or run k against run k of an
alternating sweep), with its t interval; ``paired_ratio`` the same pairs as ratios, its interval
taken on the log ratio. ``wilson`` is the interval of one count k of n; episodes
pooled over runs are not independent trials (a run's episodes share one policy, and the same games
repeat at every seed), so a pooled Wilson interval describes a count and is never the evidence for
a difference between settings.

The main job (``python -m rllib_r3l.cli.main``) under several settings: ``MainJob`` is one run
(its folder, its ``--set`` overrides); ``alternating`` lays out K runs of every setting, settings
alternating, so every setting sees the same machine; ``sweep`` runs those not yet done. A run whose
``summary.json`` exists is kept, so an interrupted sweep continues where it stopped; after a run its
checkpoint is deleted (1.7 GB with AdamW's state), its console goes to ``<run>.console`` and its
wall and CPU seconds to ``<run>.run.json``. The benchmarks write results; a person commits them.
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The main job's command before its own options (a test points it at a stand-in).
MAIN_JOB_COMMAND: List[str] = [sys.executable, "-m", "rllib_r3l.cli.main"]
RESULT_PREFIX = "RESULT "  # a child process's one line of results (``emit_result`` / ``run_child``)


# ---------------------------------------------------------------------------------------------------
# statistics (pure)
def wilson(k: int, n: int, z: float = 1.96) -> Tuple[float, float]:
    """95 % Wilson interval of the proportion k/n (NaN, NaN when n is 0)."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def t_quantile(df: int) -> float:
    """The exact 97.5 % Student t quantile for ``df`` degrees of freedom (``rllib_r3l.stats``): a table's
    nearest smaller entry, or 1.96 beyond 30, made paired intervals wider or narrower than they are."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    from rllib_r3l.stats import t_quantile as exact

    return exact(0.975, df)


def _finite(xs: Iterable[Any]) -> List[float]:
    return [float(x) for x in xs if x is not None and not math.isnan(float(x))]


def mean_interval(xs: Sequence[Optional[float]]) -> Dict[str, float]:
    """Mean, sample standard deviation and the 95 % t interval of the mean over the units ``xs``
    (None and NaN left out); NaN where undefined (the interval needs two units)."""
    xs = _finite(xs)
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": math.nan, "std": math.nan, "lo": math.nan, "hi": math.nan}
    m = sum(xs) / n
    if n == 1:
        return {"n": 1, "mean": m, "std": math.nan, "lo": math.nan, "hi": math.nan}
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    h = t_quantile(n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": m, "std": sd, "lo": m - h, "hi": m + h}


def paired_difference(a: Mapping[Any, Optional[float]], b: Mapping[Any, Optional[float]]) -> Dict[str, Any]:
    """``a - b`` paired by unit (the keys: seeds, or run numbers of an alternating sweep): the
    mean difference over the units both have, with ``mean_interval``'s t interval, and ``units``,
    the keys paired. A unit missing or NaN on either side is left out of the pairs."""
    units = sorted(k for k in set(a) & set(b) if _finite([a[k]]) and _finite([b[k]]))
    return {**mean_interval([float(a[k]) - float(b[k]) for k in units]), "units": units}


def paired_ratio(a: Mapping[Any, Optional[float]], b: Mapping[Any, Optional[float]]) -> Dict[str, Any]:
    """``a / b`` paired by unit, for a claim such as "1.3x the baseline": the per-unit ratios, their
    arithmetic ``mean``, and the geometric mean ``ratio`` with the 95 % t interval of the mean log
    ratio (df = units - 1) taken back to a ratio (``lo``, ``hi``). A ratio is a multiplicative effect,
    so its interval is symmetric in the log, not in the ratio. A unit with 0 on either side has no log
    ratio: then every summary is NaN and ``zero`` names those units (``"a"``, ``"b"`` or ``"both"``);
    ``ratios`` still lists what is defined. Units missing or NaN on either side are left out, as in
    ``paired_difference``."""
    units = sorted(k for k in set(a) & set(b) if _finite([a[k]]) and _finite([b[k]]))
    zero = {
        k: ("both" if a[k] == 0 and b[k] == 0 else "a" if a[k] == 0 else "b") for k in units if a[k] == 0 or b[k] == 0
    }
    ratios = {k: (float(a[k]) / float(b[k]) if b[k] else math.nan) for k in units}
    out: Dict[str, Any] = {
        "units": units,
        "ratios": ratios,
        "zero": zero,
        "n": len(units),
        "mean": math.nan,
        "ratio": math.nan,
        "lo": math.nan,
        "hi": math.nan,
        "log_std": math.nan,
    }
    if zero or not units:
        return out
    logs = mean_interval([math.log(r) for r in ratios.values()])
    out.update(mean=sum(ratios.values()) / len(units), ratio=math.exp(logs["mean"]), log_std=logs["std"])
    if len(units) > 1:
        out.update(lo=math.exp(logs["lo"]), hi=math.exp(logs["hi"]))
    return out


def mean_std(xs: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for one value; NaN, NaN for none)."""
    xs = [float(v) for v in xs]
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((v - m) ** 2 for v in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def risk_ratio(k1: int, n1: int, k0: int, n0: int, z: float = 1.96) -> Dict[str, float]:
    """(k1/n1) / (k0/n0) with the Katz log interval; a zero count gets the Haldane 0.5 correction
    (estimate and interval), flagged in ``corrected``. Episodes as the unit: it ignores the spread
    between seeds, which ``paired_difference`` shows."""
    if min(n1, n0) <= 0:
        return {"ratio": math.nan, "lo": math.nan, "hi": math.nan, "corrected": False}
    corrected = k1 == 0 or k0 == 0
    a, b = (k1 + 0.5, k0 + 0.5) if corrected else (k1, k0)
    m1, m0 = (n1 + 0.5, n0 + 0.5) if corrected else (n1, n0)
    r = (a / m1) / (b / m0)
    se = math.sqrt(1 / a - 1 / m1 + 1 / b - 1 / m0)
    return {"ratio": r, "lo": r * math.exp(-z * se), "hi": r * math.exp(z * se), "corrected": corrected}


def fmt_interval(e: Mapping[str, float], digits: int = 2, signed: bool = False) -> str:
    """``mean [lo, hi]`` of a ``mean_interval``; ``-`` without units, ``mean (1 unit)`` for one."""
    if not e or e.get("n", 0) == 0 or math.isnan(e["mean"]):
        return "-"
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    if e["n"] == 1:
        return f.format(e["mean"]) + " (1 unit)"
    return f"{f.format(e['mean'])} [{f.format(e['lo'])}, {f.format(e['hi'])}]"


# ---------------------------------------------------------------------------------------------------
# tables and records
def markdown_table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (as docs/benchmarks.md quotes them): the header, ``|---|``, the rows."""
    lines = ["| " + " | ".join(str(c) for c in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    """The records of a JSON-lines file ([] when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def machine() -> str:
    """The CPU, its core count and the load average now: the line above every table."""
    from rllib_r3l.cli.run_info import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"


# ---------------------------------------------------------------------------------------------------
# child processes
def child_env(**extra: str) -> Dict[str, str]:
    """The environment of a benchmark's child process: Ray without auth tokens, vLLM's engine in
    the calling process (a CPU machine has no cores to spare for a second one)."""
    return dict(os.environ, RAY_AUTH_MODE="disabled", VLLM_ENABLE_V1_MULTIPROCESSING="0", **extra)


def emit_result(result: Mapping[str, Any]) -> None:
    """A child's result, as the one line ``run_child`` reads."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def run_child(
    cmd: Sequence[str], env: Optional[Mapping[str, str]] = None, cwd: Path = ROOT
) -> Tuple[Optional[Dict[str, Any]], subprocess.CompletedProcess]:
    """Run ``cmd`` (a benchmark's worker in a fresh process: its own engine, threads and peak
    memory) and return its last ``RESULT`` line (None when it failed or printed none) and the
    process (``stderr`` for the failure's cause)."""
    p = subprocess.run(list(cmd), capture_output=True, text=True, env=dict(env) if env else child_env(), cwd=str(cwd))
    got = [line[len(RESULT_PREFIX) :] for line in p.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    return (json.loads(got[-1]) if p.returncode == 0 and got else None), p


# ---------------------------------------------------------------------------------------------------
# the main job under several settings
def split_overrides(text: str) -> List[str]:
    """``'key=value key=[a, b]'`` -> ``["key=value", "key=[a, b]"]``: split on spaces outside brackets."""
    sets, depth, cur = [], 0, ""
    for ch in text.strip():
        depth += 1 if ch in "[{" else -1 if ch in "]}" else 0
        if ch == " " and depth == 0:
            if cur:
                sets.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        sets.append(cur)
    if depth != 0 or any("=" not in s for s in sets):
        raise ValueError(text)
    return sets


def parse_variant(spec: str) -> Tuple[str, List[str]]:
    """``name=key=value key=value`` -> (name, ["key=value", ...]); ``name=`` is the plain default."""
    name, sep, rest = spec.partition("=")
    if not sep or not name or not name.replace("_", "").replace("-", "").isalnum():
        raise SystemExit(
            f"--variant expects NAME=OVERRIDES (NAME of letters, digits, '_' or '-'; "
            f"OVERRIDES 'key=value key=value' or empty), got {spec!r}"
        )
    try:
        return name, split_overrides(rest)
    except ValueError:
        raise SystemExit(
            f"--variant {name}: overrides must be key=value with balanced brackets, got {rest!r}"
        ) from None


@dataclass
class MainJob:
    """One main job: ``python -m rllib_r3l.cli.main --out <out> [--iterations N] --set <sets>``.
    ``needs_meta``: done only once ``<out>.run.json`` (its CPU seconds) exists too."""

    name: str
    out: Path
    sets: List[str] = field(default_factory=list)
    iterations: Optional[int] = None
    needs_meta: bool = False

    @property
    def console(self) -> Path:
        return self.out.with_name(self.out.name + ".console")

    @property
    def meta(self) -> Path:
        return self.out.with_name(self.out.name + ".run.json")

    @property
    def done(self) -> bool:
        return (self.out / "summary.json").exists() and (self.meta.exists() or not self.needs_meta)

    def command(self) -> List[str]:
        its = ["--iterations", str(self.iterations)] if self.iterations is not None else []
        # a job that is not done is run again from the start: what an interrupted run left is replaced
        # (the main job refuses an --out that holds a run, unless told to overwrite it)
        return [*MAIN_JOB_COMMAND, "--out", str(self.out), "--overwrite", *its] + (
            ["--set", *self.sets] if self.sets else []
        )


def run_main_job(job: MainJob, verbose: bool = False) -> Dict[str, Any]:
    """Run ``job`` as a child process (console to ``job.console``, or the terminal with ``verbose``),
    delete its checkpoint, and record its exit status, wall and CPU seconds (the child and what it
    waited for) in ``job.meta``; returns that record."""
    job.out.parent.mkdir(parents=True, exist_ok=True)
    cmd = job.command()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    with open(job.console, "w") as f:
        rc = subprocess.call(cmd, cwd=ROOT, env=child_env(), stdout=None if verbose else f, stderr=subprocess.STDOUT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(job.out / "checkpoint", ignore_errors=True)  # summary, console, log and plot stay
    from rllib_r3l.cli.run_info import cpu_model

    meta = {
        "variant": job.name,
        "rc": rc,
        "cmd": cmd,
        "wall_s": time.time() - t0,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "load_after": os.getloadavg()[0],
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if rc == 0:
        job.meta.write_text(json.dumps(meta, indent=1))
    return meta


def alternating(variants: Mapping[str, Sequence[str]], runs: int, out: Path) -> List[MainJob]:
    """``runs`` main jobs of every variant, variants alternating (run 1 of each, then run 2, ...),
    in ``out/<variant>_<k>``."""
    return [MainJob(v, out / f"{v}_{k}", list(sets)) for k in range(1, runs + 1) for v, sets in variants.items()]


def rotated(names: Sequence[str], seed: int, rotate: bool = True) -> List[str]:
    """``names`` rotated by ``seed``: over as many seeds as names each runs first once (the first
    main job of a sequence can run slower than the same work later: position must not favour one)."""
    if not rotate or not names:
        return list(names)
    k = seed % len(names)
    return list(names[k:]) + list(names[:k])


def sweep(jobs: Sequence[MainJob], verbose: bool = False, log: Callable[[str], None] = print) -> int:
    """Run the jobs not yet done, in order; stop at the first that fails (its exit status; a rerun
    resumes). 0 when every job is done."""
    for job in jobs:
        if job.done:
            log(f"{job.out.name}: done (kept)")
            continue
        log(f"{time.strftime('%H:%M:%S')} {job.out.name} (load {os.getloadavg()[0]:.1f}) ...")
        meta = run_main_job(job, verbose)
        if meta["rc"] != 0:
            log(f"{job.out.name}: exit {meta['rc']}; see {job.console}")
            return meta["rc"]
        log(f"  {meta['wall_s']:.0f} s wall, {meta['cpu_s']:.0f} CPU s")
    return 0
