"""``rllib-r3l evaluate | export | report | options``: the commands that read a checkpoint or an experiment
(``train`` is in :mod:`rllib_r3l.cli.commands`, beside the parser)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Optional

from rllib_r3l.cli.experiments import validate_env_only
from rllib_r3l.cli.storage import write_atomically
from rllib_r3l.errors import UsageError

EXIT_OK = 0
EXIT_FAILED = 1


def _parse_json_flag(text: Optional[str], flag: str) -> Optional[Dict[str, Any]]:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as e:
        example = '{"num_threads": 2}' if flag == "--backend-options" else '{"num_rooms": 3}'
        raise UsageError(f"{flag}: not valid JSON ({e}); e.g. {flag} '{example}'") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: expected a JSON object, got {value!r}")
    return value


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


def cmd_evaluate(args) -> int:
    from rllib_r3l.cli import evaluate as ev

    _quiet_transformers()
    env_config = _parse_json_flag(args.env_config, "--env-config")
    backend_options = _parse_json_flag(args.backend_options, "--backend-options")
    if args.env is not None:
        validate_env_only(args.env, env_config or {})
    out = ev.check_flags(args)  # numbers and --out, before anything loads
    summary, episodes = ev.evaluate(
        args.checkpoint,
        env=args.env,
        episodes=args.episodes,
        env_config=env_config,
        split=args.split,
        temperature=0.0 if args.greedy else args.temperature,
        backend=args.backend,
        backend_options=backend_options,
        max_turns=args.max_turns,
        max_response_tokens=args.max_response_tokens,
        seed=args.seed,
        batch_size=args.batch_size,
        base_model=args.base_model,
    )
    print(ev.format_summary(summary))
    if args.out:
        try:
            os.makedirs(os.path.dirname(out) or ".", exist_ok=True)  # else a new folder fails after the run
            write_atomically(out, lambda tmp: episodes.to_csv(tmp, index=False))  # no half CSV left
            print(f"per-episode results: {out}")
        except OSError as e:  # the table above is printed; only the CSV is missing
            print(
                f"rllib-r3l evaluate: error: --out {out}: the per-episode CSV could not be written "
                f"({e.strerror or e}); the summary above is complete",
                file=sys.stderr,
            )
            return EXIT_FAILED
    if summary["errors"] == summary["episodes"]:
        print(
            f"rllib-r3l evaluate: error: all {summary['episodes']} episodes failed (environment or generation "
            "errors, logged above); the table measures nothing",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK


def cmd_export(args) -> int:
    from rllib_r3l.cli import export as ex

    _quiet_transformers()
    out = ex.export_checkpoint(
        args.checkpoint, args.out, dtype=args.dtype, force=args.force, base_model=args.base_model
    )
    print(f"exported a Hugging Face model directory: {out}")
    print(f"  load: transformers.AutoModelForCausalLM.from_pretrained({out!r})  |  vllm.LLM(model={out!r})")
    return EXIT_OK


def cmd_report(args) -> int:
    from rllib_r3l.cli import experiment_report as report
    from rllib_r3l.cli.report_warnings import warnings

    table, pngs, out_dir = report.make_report(args.experiment_dir, args.out)
    import pandas as pd

    with pd.option_context("display.max_columns", None, "display.width", 200):
        print(table.to_string(index=False))
    for line in report.notes(table):
        print(line)
    from rllib_r3l.cli.ledger_report import chain_lines

    for line in chain_lines(table.attrs.get("chain")):
        print(line)
    print(f"\ntable: {os.path.join(out_dir, report.SUMMARY_FILE)}")
    for p in pngs:
        print(f"plot:  {p}")
    for line in warnings(table):
        print(line, file=sys.stderr)
    return EXIT_OK


def cmd_options(args) -> int:
    from rllib_r3l.config import R3L_OPTIONS

    for name, (default, help_text) in R3L_OPTIONS.items():
        key = "model" if name == "model_id" else name
        print(f"{key:24s} {default!r:38s} {help_text}")
    print(
        "\nRLlib options (AlgorithmConfig attribute names) work too: lr, grad_clip, env, env_config, "
        "num_env_runners, num_gpus_per_env_runner, num_learners, num_gpus_per_learner, seed, ..."
    )
    return EXIT_OK
