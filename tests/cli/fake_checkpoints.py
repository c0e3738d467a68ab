"""Hand-made checkpoints and experiment folders for the CLI tests (no Ray, no training): RLlib's layout
as ``checkpoint_integrity`` checks it, and an algorithm checkpoint reduced to what evaluate/export read."""

from __future__ import annotations

import json
import pickle


def fake_checkpoint(path):
    """A folder with RLlib's checkpoint layout (metadata, constructor and state files per component) that
    ``checkpoint_integrity.problem`` takes for complete; nothing in it can be restored."""
    for sub, meta, state in (
        ("", "rllib_checkpoint.json", "algorithm_state"),
        ("learner_group", "metadata.json", "state"),
    ):
        d = path / sub if sub else path
        d.mkdir(parents=True, exist_ok=True)
        (d / meta).write_text(json.dumps({"class_and_ctor_args_file": "class_and_ctor_args.pkl", "state_file": state}))
        (d / "class_and_ctor_args.pkl").write_bytes(pickle.dumps({}))
        (d / f"{state}.pkl").write_bytes(pickle.dumps({"training_iteration": 1}))
    return path


def saved_experiment(root, name, checkpoint):
    """A Tune experiment folder ``root/name`` with one trial of one row, and a complete (fake) checkpoint
    when ``checkpoint``."""
    exp = root / name
    trial = exp / "R3L_x_00000"
    trial.mkdir(parents=True)
    (exp / "experiment_state-2026.json").write_text("{}")
    (trial / "params.json").write_text("{}")
    (trial / "result.json").write_text('{"training_iteration": 1}\n')
    if checkpoint:
        fake_checkpoint(trial / "checkpoint_000000")
    return exp


def module_checkpoint(root, state, model_id="tiny", env="r3l/ToyCorridor"):
    """An algorithm checkpoint as R3L saves it, reduced to what evaluate/export read."""
    from rllib_r3l.cli import export as ex

    ckpt = root / "checkpoint_000000"
    mdir = ckpt / ex.MODULE_SUBDIR
    mdir.mkdir(parents=True)
    (ckpt / "rllib_checkpoint.json").write_text("{}")
    with open(ckpt / "class_and_ctor_args.pkl", "wb") as f:
        pickle.dump(
            {
                "ctor_args_and_kwargs": (
                    ({"env": env, "env_config": {"num_rooms": 3}, "backend": "transformers", "max_turns": 1},),
                    {},
                )
            },
            f,
        )
    with open(mdir / "class_and_ctor_args.pkl", "wb") as f:
        pickle.dump({"class": None, "ctor_args_and_kwargs": ((), {"model_config": {"model_id": model_id}})}, f)
    with open(mdir / "module_state.pkl", "wb") as f:
        pickle.dump(state, f)
    return str(ckpt)


def tiny_state():
    """The tiny model's weights as the R3L module's state holds them (``lm.`` prefix)."""
    from transformers import AutoModelForCausalLM

    from rllib_r3l.models import resolve_model

    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"))
    return {f"lm.{k}": v.clone() for k, v in model.state_dict().items()}
