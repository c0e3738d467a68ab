"""TextWorld's own game generator, run once per (challenge, settings, seed) into a cache folder shared by every
process (written aside and renamed into place, so two generators of one game never see a half-written file)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from typing import Any, List, Mapping

# ============================================================================ generic TextWorld
CHALLENGES = ("tw-coin_collector", "tw-treasure_hunter", "tw-simple", "tw-cooking")


_DEFAULT_SETTINGS = {
    "tw-coin_collector": {"level": 2},
    "tw-treasure_hunter": {"level": 1},
    "tw-simple": {"rewards": "dense", "goal": "detailed"},
    "tw-cooking": {"recipe": 1, "take": 1, "go": 1},
}


def default_cache_dir() -> str:
    base = os.environ.get("RLLIB_R3L_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rllib_r3l")
    return os.path.join(base, "textworld_games")


def _settings_args(challenge: str, settings: Mapping[str, Any]) -> List[str]:
    args: List[str] = []
    for k, v in settings.items():
        flag = "--" + str(k).replace("_", "-")
        if isinstance(v, bool):
            if v:
                args.append(flag)
        else:
            args += [flag, str(v)]
    return args


def generate_game(challenge: str, settings: Mapping[str, Any], gen_seed: int, out_dir: str) -> str:
    """Generate (or find cached) one game of a TextWorld challenge; returns the .z8 path.

    Games are written to a temporary folder and renamed into place, so concurrent generators of the
    same game do not see half-written files.
    """
    from environments.textworld_games import _import_textworld

    textworld = _import_textworld()
    import textworld.challenges  # noqa: F811 - the submodules onto the package _import_textworld checked
    import textworld.generator

    if challenge not in textworld.challenges.CHALLENGES:
        raise ValueError(f"challenge must be one of {sorted(textworld.challenges.CHALLENGES)}; got {challenge!r}")
    _desc, make, add_arguments = textworld.challenges.CHALLENGES[challenge]
    parser = argparse.ArgumentParser(prog=challenge, add_help=False, exit_on_error=False)
    add_arguments(parser)
    args = _settings_args(challenge, settings)
    try:
        ns, unknown = parser.parse_known_args(args)
    except (argparse.ArgumentError, SystemExit) as e:
        raise ValueError(f"settings: invalid settings {dict(settings)!r} for {challenge}: {e}") from e
    if unknown:
        raise ValueError(f"settings: unknown settings {unknown} for {challenge}")
    key = hashlib.sha1(
        json.dumps([challenge, sorted(vars(ns).items(), key=str), gen_seed], default=str).encode()
    ).hexdigest()[:16]
    final_dir = os.path.join(out_dir, f"{challenge}-{gen_seed}-{key}")
    final_path = os.path.join(final_dir, "game.z8")
    if os.path.isfile(final_path):
        return final_path
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".gen-", dir=out_dir)
    try:
        options = textworld.GameOptions()
        options.seeds = gen_seed
        options.path = os.path.join(tmp, "game.z8")
        options.file_ext = ".z8"
        options.force_recompile = True
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is not fully supported.*")
            game = make(settings=vars(ns), options=options)
            textworld.generator.compile_game(game, options)
        try:
            os.rename(tmp, final_dir)
        except OSError:  # another process won the race
            if not os.path.isfile(final_path):
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return final_path
