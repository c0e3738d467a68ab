"""rllib-r3l: R3L (Reflect-then-Retry RL, arXiv 2601.03715) as a Ray RLlib algorithm.

``import rllib_r3l`` registers ``"R3L"`` with Ray Tune. Importing loads no model and starts no Ray.
"""

from rllib_r3l.algorithm import R3L
from rllib_r3l.config import R3LConfig

__all__ = ["R3L", "R3LConfig", "register"]
__version__ = "0.1.0"


def register() -> None:
    """Register ``"R3L"`` with Ray Tune (done on import).

    Tune's registry moves registrations into the Ray session when one starts and forgets them when it
    shuts down; re-registering on every ``ray.init`` keeps ``"R3L"`` resolvable across sessions.
    """
    from ray.tune.registry import register_trainable

    register_trainable("R3L", R3L)


def _register_on_init() -> None:
    try:
        from ray._private import worker
    except ImportError:  # pragma: no cover - private API moved: import-time registration still works
        return
    if register not in worker._post_init_hooks:
        worker._post_init_hooks.append(register)


register()
_register_on_init()
