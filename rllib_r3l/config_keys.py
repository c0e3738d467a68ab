"""The keys a config may hold, checked at every door (build_algo, tune.run with an R3LConfig or a dict, YAML,
the CLI): an unknown key is refused with "did you mean", and a value RLlib would drop silently is refused."""

from __future__ import annotations

import difflib
from typing import Any, Dict

from rllib_r3l import ray_internals, validation
from rllib_r3l.not_options import UNUSED_RLLIB, removed_option_error
from rllib_r3l.options import R3L_OPTIONS


def check_config_keys(config_dict: Dict[str, Any], known: frozenset) -> None:
    """``ValueError("R3LConfig.<key>: unknown config key ...")`` for the first key not in ``known`` (every key a
    config dict may hold: ``rllib_r3l.config.config_keys()``)."""
    for key in config_dict:
        removed = removed_option_error(str(key))
        if removed:
            raise ValueError(removed)
        if key in known or ray_internals.translate_config_key(str(key)) in known:
            continue
        if key in UNUSED_RLLIB:  # a known RLlib option (a property): validate() names what R3L uses instead
            continue
        if str(key).startswith("__") and str(key).endswith("__"):  # Tune's own (__trial_info__, __stdout_file__)
            continue
        concept = validation.unknown_key_hint(str(key))
        if concept:
            raise ValueError(f"R3LConfig.{key}: unknown config key {key!r}: {concept}")
        public = [k for k in known if not str(k).startswith("_")]
        close = difflib.get_close_matches(str(key), list(R3L_OPTIONS) + ["model"], n=1) or difflib.get_close_matches(
            str(key), public, n=1
        )
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"R3LConfig.{key}: unknown config key {key!r}{hint}; rllib_r3l.config.R3L_OPTIONS lists "
            "the R3L options (RLlib's AlgorithmConfig attribute names work too)"
        )


def check_no_dropped_values(cfg: Any, defaults: Dict[str, Any]) -> None:
    """Reject a value RLlib would silently drop: ``AlgorithmConfig.get_state`` leaves out every
    attribute equal to -1 (its ``DEPRECATED_VALUE``), so the copy the algorithm runs with would hold
    the default instead."""
    DEPRECATED_VALUE = ray_internals.deprecated_value()
    dropped = [
        k
        for k, v in vars(cfg).items()
        if not isinstance(v, bool)
        and isinstance(v, (int, float))
        and v == DEPRECATED_VALUE
        and defaults.get(k, None) != DEPRECATED_VALUE
    ]
    if not dropped:
        return
    cfg.validate_r3l()  # a field where -1 is invalid anyway gets its own message first
    field = dropped[0]
    default = R3L_OPTIONS[field][0] if field in R3L_OPTIONS else defaults.get(field)
    raise ValueError(
        f"R3LConfig.{field}: the value -1 cannot be used: RLlib's AlgorithmConfig.get_state() drops "
        f"every value equal to -1 (its DEPRECATED_VALUE), so the algorithm would silently run with "
        f"the default {default!r}; {validation.minus_one_advice(field)}"
    )
