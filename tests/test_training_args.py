"""``R3LConfig.training`` declares every R3L option as a keyword with an ``Args:`` line (issue 48, item 4),
generated from the option table; the table, the generated file and the signature stay together."""

from __future__ import annotations

import importlib.util
import inspect
import pydoc

from ray.rllib.algorithms.algorithm_config import NotProvided

from rllib_r3l.config import R3LConfig
from rllib_r3l.options import R3L_OPTIONS
from tests import REPO_ROOT

GENERATOR = REPO_ROOT / "scripts" / "gen_training_args.py"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_training_args", GENERATOR)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_generated_file_matches_the_option_table():
    gen = _generator()
    assert gen.TARGET.read_text() == gen.render(), (
        "rllib_r3l/training_args.py is stale: run scripts/gen_training_args.py"
    )


def test_every_option_is_a_keyword_of_training_that_defaults_to_not_provided():
    params = inspect.signature(R3LConfig.training).parameters
    declared = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert declared == {"model", *R3L_OPTIONS}
    assert all(params[n].default is NotProvided for n in declared)
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())  # RLlib's own: lr, grad_clip ...


def test_help_shows_each_option_with_its_help_and_default():
    text = " ".join(pydoc.render_doc(R3LConfig.training, renderer=pydoc.plaintext).split())
    for name, (default, help_text) in R3L_OPTIONS.items():
        assert f"{name}: {' '.join(help_text.split())} (default {default!r})" in text, name


def test_each_help_is_one_or_two_sentences_the_rationale_lives_in_docs():
    long = {n: len(h) for n, (_d, h) in R3L_OPTIONS.items() if len(h) > 240}
    assert not long, f"help past 240 characters (move the rationale to docs/options.md): {long}"


def test_training_keywords_and_rllibs_own_both_land():
    c = R3LConfig().training(group_size=4, reflect=False, lr=3e-6, grad_clip=0.5, model="tiny")
    assert (c.group_size, c.reflect, c.lr, c.grad_clip, c.model_id) == (4, False, 3e-6, 0.5, "tiny")
    untouched = R3LConfig().training(group_size=4)
    assert untouched.reflect is R3L_OPTIONS["reflect"][0] and untouched.lr == R3LConfig().lr
