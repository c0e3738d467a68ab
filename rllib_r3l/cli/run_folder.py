"""The main job's ``--out``: a finished run in it is never overwritten without ``--overwrite``, the
``--no-reflect`` comparison gets a folder of its own, and ``--resume`` continues from the newest complete
checkpoint with the config saved in it (flags that would change that config are refused, not ignored).
"""

from __future__ import annotations

import json
import os

from rllib_r3l import checkpoint_integrity as ckpt_io
from rllib_r3l.errors import UsageError

CHECKPOINT = "checkpoint"

# What a finished run leaves in --out: a second run would replace it (issue 37: never silently).
FINISHED_MARKERS = ("summary.json", "checkpoint", "run.png")


def out_dir(args) -> str:
    """--out, or a default that keeps the --no-reflect comparison beside the R3L run instead of over it."""
    if args.out:
        return os.path.abspath(args.out)
    return os.path.join(os.getcwd(), "results", "main-no-reflect" if args.reflect is False else "main")


def check_out(out: str, overwrite: bool, resume: bool = False) -> None:
    """Refuse to write into an --out that holds a finished run, unless ``overwrite`` (or ``resume``: continue it)."""
    if resume:
        if overwrite:
            raise UsageError(
                "--resume and --overwrite exclude each other: --resume continues the run in --out, "
                "--overwrite replaces it"
            )
        return
    found = [m for m in FINISHED_MARKERS if os.path.exists(os.path.join(out, m))]
    if found and not overwrite:
        interrupted = _summary_says_interrupted(out)
        what = "an interrupted run" if interrupted else "a finished run"
        cont = (
            "pass --resume to continue it, " if interrupted or os.path.exists(os.path.join(out, "checkpoint")) else ""
        )
        raise UsageError(
            f"--out {out} already holds {what} ({', '.join(found)}); {cont}give another --out "
            "to keep it, or pass --overwrite to replace it"
        )


def _summary_says_interrupted(out: str) -> bool:
    try:
        with open(os.path.join(out, "summary.json")) as f:
            return bool(json.load(f).get("interrupted"))
    except (OSError, ValueError, AttributeError):
        return False


def resume_point(args, out: str):
    """``(config, (checkpoint, iteration, notes))`` for ``--resume``: the newest complete checkpoint in
    ``out`` (incomplete ones named in ``notes``) and the config saved in it."""
    from rllib_r3l.cli.export import checkpoint_iteration, load_checkpoint_algo_config

    if args.set:
        raise UsageError(
            f"--resume with --set {args.set[0]}: a resumed run keeps the config saved in its checkpoint; "
            "drop --set, or start a fresh run in another --out"
        )
    chosen, skipped = ckpt_io.newest_complete(ckpt_io.candidates(os.path.join(out, CHECKPOINT)))
    notes = [ckpt_io.skipped_note(p, why) for p, why in skipped]
    if chosen is None:
        found = "; ".join(notes) or "no checkpoint there"
        raise UsageError(
            f"--resume: no complete checkpoint in {out} ({found}); run without --resume (with "
            "--overwrite to replace what is there)"
        )
    it = ckpt_io.marker(chosen).get("iteration")
    it = it if isinstance(it, int) else checkpoint_iteration(chosen)
    if it is not None and it >= args.iterations:
        raise UsageError(
            f"--resume: {chosen} is at iteration {it} already, --iterations {args.iterations}; pass "
            "a larger --iterations (the iterations in all) to continue"
        )
    config = load_checkpoint_algo_config(chosen)
    if args.reflect is not None and bool(args.reflect) != bool(config.reflect):  # was ignored without a word
        raise UsageError(
            f"--{'' if args.reflect else 'no-'}reflect: the run in {out} was trained with "
            f"reflect={config.reflect}, and a resumed run keeps the config saved in its checkpoint; "
            "drop the flag, or start a fresh run in another --out"
        )
    from rllib_r3l import preflight

    preflight.check_resources(config, cpus=args.num_cpus, source=f"--num-cpus {args.num_cpus}", count_driver=False)
    return config, (chosen, it, notes)
