"""Environment ids usable in configs (``env="r3l/CoinCollector"``), each also registered with gymnasium."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, Optional, Union

import gymnasium as gym

from environments.base import TextEnv

_REGISTRY: Dict[str, str] = {}


def register(env_id: str, entry_point: str) -> None:
    """Register ``env_id`` -> ``"module:Class"`` (lazy: the module is imported on first ``make``)."""
    _REGISTRY[env_id] = entry_point
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=entry_point, disable_env_checker=True)


def registered() -> list:
    return sorted(_REGISTRY)


def _load(entry_point: str) -> Callable[..., TextEnv]:
    mod, _, attr = entry_point.partition(":")
    return getattr(importlib.import_module(mod), attr)


def resolve(env_id: Union[str, Callable[..., TextEnv]]) -> Callable[..., TextEnv]:
    """The class/factory behind an environment id (without building it)."""
    if callable(env_id) and not isinstance(env_id, str):
        return env_id
    if env_id in _REGISTRY:
        return _load(_REGISTRY[env_id])
    if isinstance(env_id, str) and ":" in env_id:
        return _load(env_id)
    raise ValueError(
        f"unknown environment id {env_id!r}; registered ids: {', '.join(registered())} (or pass 'module:Class')"
    )


def make(env_id: Union[str, Callable[..., TextEnv]], env_config: Optional[Dict[str, Any]] = None) -> TextEnv:
    """Build an environment from a registered id (or a class/factory) and its ``env_config``."""
    env_config = dict(env_config or {})
    if callable(env_id) and not isinstance(env_id, str):
        return env_id(**env_config)
    if env_id not in _REGISTRY:
        if isinstance(env_id, str) and ":" in env_id:  # "package.module:Class"
            return _load(env_id)(**env_config)
        raise ValueError(
            f"unknown environment id {env_id!r}; registered ids: {', '.join(registered())} (or pass 'module:Class')"
        )
    factory = _load(_REGISTRY[env_id])
    try:
        return factory(**env_config)
    except TypeError as e:
        raise ValueError(f"bad env_config for {env_id!r}: {e}") from e
