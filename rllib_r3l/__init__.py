"""rllib-r3l: R3L (Reflect-then-Retry RL, arXiv 2601.03715) as a Ray RLlib algorithm.

``import rllib_r3l`` registers ``"R3L"`` with Ray Tune. Importing loads no model and starts no Ray.
"""

from rllib_r3l.algorithm import R3L
from rllib_r3l.config import R3LConfig

__all__ = ["R3L", "R3LConfig", "register"]
__version__ = "0.1.0"


def register() -> None:
    """Register ``"R3L"`` with Ray Tune (done on import; call again in a fresh process if needed)."""
    from ray.tune.registry import register_trainable

    register_trainable("R3L", R3L)


register()
