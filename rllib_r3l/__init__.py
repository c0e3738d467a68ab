"""rllib-r3l: R3L (Reflect-then-Retry RL, arXiv 2601.03715) as a Ray RLlib algorithm.

``import rllib_r3l`` registers ``"R3L"`` with Ray Tune where Ray is installed (``tune.run("R3L", ...)``,
``tune.Tuner("R3L", ...)``, YAML experiment files). Importing loads no model and starts no Ray; the
pure parts (``core_algos``, ``batch``, ``trajectory``, ``options``, ``learner.prefix_tree``) import on a
machine with torch and numpy alone. Where things live: docs/layout.md.
"""

from typing import Any

__all__ = ["R3L", "R3LConfig", "register"]
__version__ = "0.1.0"


def _algorithm_and_default_config():
    from rllib_r3l.algorithm import R3L

    return R3L, R3L.get_default_config()


def register() -> bool:
    """Register ``"R3L"`` with Ray Tune (done on import); False where Ray RLlib is not installed.

    ``"R3L"`` goes into RLlib's table of algorithms, which Tune consults for every name it does not
    know (``ray.tune.registry.validate_trainable``), the way it finds RLlib's own algorithms: the name
    resolves in any Ray session, also after ``ray.shutdown()`` and a new ``ray.init()``, and the
    algorithm is imported only when Tune asks for it. (Tune's public ``register_trainable`` keys the name to
    the first Ray job's id: after ``ray.shutdown()`` and a new ``ray.init()`` it no longer resolves.)

    Nothing else happens at import: the check of Tune's stop keys is installed when the algorithm is
    imported (Tune resolving ``"R3L"``, or ``from rllib_r3l import R3L``), see ``rllib_r3l.stopping``.
    """
    try:
        from ray.rllib.algorithms import registry as rllib_registry
    except ImportError:
        return False
    rllib_registry.ALGORITHMS["R3L"] = _algorithm_and_default_config
    rllib_registry.ALGORITHMS_CLASS_TO_NAME["R3L"] = "R3L"
    return True


def __getattr__(name: str) -> Any:
    # ``rllib_r3l.R3L`` / ``rllib_r3l.R3LConfig`` without importing Ray for ``import rllib_r3l.core_algos``.
    if name == "R3L":
        from rllib_r3l.algorithm import R3L

        return R3L
    if name == "R3LConfig":
        from rllib_r3l.config import R3LConfig

        return R3LConfig
    raise AttributeError(f"module 'rllib_r3l' has no attribute {name!r}")


register()
