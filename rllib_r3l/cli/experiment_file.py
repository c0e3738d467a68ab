"""Experiment files as written: Tune-style YAML read with duplicate keys refused, scalars parsed as YAML
(``1e-6`` a float), and each experiment's own keys (``run``, ``stop``, ``num_samples``, ``time_budget_s``,
...) checked. What the configs inside mean is checked in :mod:`rllib_r3l.cli.experiments`.
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any, Dict

from rllib_r3l.errors import UsageError, did_you_mean

# Keys of one experiment spec (Tune's ``Experiment`` arguments that make sense in a file).
SPEC_KEYS = (
    "run",
    "stop",
    "config",
    "num_samples",
    "storage_path",
    "checkpoint_config",
    "time_budget_s",
    "max_failures",
    "log_to_file",
    "sync_config",
)


# ==================================================================================================
# YAML
# ==================================================================================================
def _yaml_loader():
    """``yaml.SafeLoader`` that also reads ``1e-6`` as a float (YAML 1.2; PyYAML reads it as a string)
    and refuses a key repeated in one mapping (PyYAML keeps the last: a second ``lr:`` would replace the
    first, a repeated experiment name drop the first experiment, without a word)."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            _refuse_duplicate_keys(self, node)
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    return Loader


class DuplicateKeyError(Exception):
    """A key written twice in one YAML mapping (``line`` 1-based, ``first_line`` where it was first)."""

    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key, self.line, self.first_line = key, line, first_line


def _refuse_duplicate_keys(loader, node) -> None:
    """Raise :class:`DuplicateKeyError` for a key written twice in ``node`` itself. Keys a merge
    (``<<: *anchor``) brings in may be overridden: that is what a merge is for."""
    seen: Dict[Any, int] = {}
    for key_node, _value in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            continue  # PyYAML refuses an unhashable key itself
        line = key_node.start_mark.line + 1
        if key in seen:
            raise DuplicateKeyError(key, line, seen[key])
        seen[key] = line


def parse_value(text: str) -> Any:
    """A ``--set``/``--stop`` value as a YAML scalar or flow collection (``4``, ``true``, ``1e-6``,
    ``null``, ``[1, 2]``, ``{num_rooms: 3}``); text that is not valid YAML, or repeats a key, stays a
    string (:func:`parse_assignment` refuses a repeated key)."""
    try:
        return _parse_value_strict(text)
    except DuplicateKeyError:
        return text


def _parse_value_strict(text: str) -> Any:
    """:func:`parse_value`, with :class:`DuplicateKeyError` for ``{a: 1, a: 2}``."""
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())
    except yaml.YAMLError:
        return text


def load_yaml_file(path: str) -> Dict[str, Dict[str, Any]]:
    """Read an experiments file: ``{name: {run: ..., stop: ..., config: ...}}``."""
    import yaml

    if os.path.isdir(path):  # not "no such file"
        raise UsageError(
            f"{path}: is a folder; give a YAML experiments file in it, e.g. tuned_examples/cpu/coin_collector.yaml"
        )
    if not os.path.isfile(path):
        raise UsageError(
            f"{path}: no such file (give a YAML experiments file, e.g. tuned_examples/cpu/coin_collector.yaml)"
        )
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=_yaml_loader())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise UsageError(f"{path}:{where}: not valid YAML ({problem}); fix the syntax there") from None
    except UnicodeDecodeError as e:  # else a traceback
        raise UsageError(
            f"{path}: not a text file in UTF-8 (byte {e.start}: {e.reason}); give a YAML "
            "experiments file, e.g. tuned_examples/cpu/coin_collector.yaml"
        ) from None
    except OSError as e:
        raise UsageError(f"{path}: cannot be read ({e.strerror or e})") from None
    except DuplicateKeyError as e:
        raise UsageError(
            f"{path}:{e.line}: duplicate key {e.key!r} (first at line {e.first_line}): YAML would "
            "silently keep only the last one; remove or rename one of them"
        ) from None
    if data is None or data == {}:  # not "expected a mapping ..., got dict"
        raise UsageError(
            f"{path}: holds no experiment; write one as NAME: {{run: R3L, stop: {{...}}, config: "
            "{...}}, e.g. tuned_examples/cpu/coin_collector.yaml"
        )
    if not isinstance(data, dict):
        raise UsageError(
            f"{path}: expected a mapping of experiment names to {{run, stop, config}}, got {type(data).__name__}"
        )
    data = {name: copy.deepcopy(spec) for name, spec in data.items()}  # YAML anchors share objects
    for name, spec in data.items():
        where = f"{path}: experiment {name!r}"
        if not isinstance(spec, dict):
            raise UsageError(f"{where}: expected a mapping with run/stop/config, got {type(spec).__name__}")
        if "env" in spec:  # Tune moves a spec-level env into the config; so do we
            spec.setdefault("config", {})["env"] = spec.pop("env")
        for key in spec:
            if key not in SPEC_KEYS:
                raise UsageError(
                    f"{where}: unknown key {key!r}{did_you_mean(key, SPEC_KEYS)}; "
                    f"an experiment has {', '.join(SPEC_KEYS)} (R3L options go under 'config:')"
                )
        if "run" not in spec:
            raise UsageError(f"{where}: missing 'run'; add `run: R3L`")
        if spec["run"] != "R3L":
            raise UsageError(f"{where}: run: {spec['run']!r} is not supported here; use `run: R3L`")
        spec.setdefault("config", {})
        if not isinstance(spec["config"], dict):
            raise UsageError(f"{where}: 'config' must be a mapping of option names to values")
        if spec.get("stop") is not None and not isinstance(spec["stop"], dict):
            raise UsageError(f"{where}: 'stop' must be a mapping like {{training_iteration: 100}}")
        _check_spec_numbers(spec, where)
    return data


def _check_spec_numbers(spec: Dict[str, Any], where: str) -> None:
    """Tune's numeric experiment keys: ``num_samples: 0`` ran no trial and exited 0, ``num_samples: two`` was
    Tune's TypeError inside the run, ``time_budget_s: -5`` stopped the run at once as "interrupted"."""

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    n = spec.get("num_samples")
    if n is not None and not (is_int(n) and n >= 1):  # -1 (Tune: "until stopped") started no trial here
        raise UsageError(
            f"{where}: num_samples: {n!r}: must be an integer >= 1 (trials per point of the config's grid)"
        )
    budget = spec.get("time_budget_s")
    if budget is not None and not (
        isinstance(budget, (int, float)) and not isinstance(budget, bool) and 0 < budget < float("inf")
    ):
        raise UsageError(
            f"{where}: time_budget_s: {budget!r}: must be a number of seconds > 0 (the whole "
            "experiment's budget), or left out"
        )
    failures = spec.get("max_failures")
    if failures is not None and not (is_int(failures) and failures >= -1):
        raise UsageError(
            f"{where}: max_failures: {failures!r}: must be an integer >= 0 (restarts of a failed "
            "trial from its last checkpoint), or -1 (no limit)"
        )
