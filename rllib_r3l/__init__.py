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
    algorithm is imported only when Tune asks for it.
    """
    try:
        from ray.rllib.algorithms import registry as rllib_registry
    except ImportError:
        return False
    rllib_registry.ALGORITHMS["R3L"] = _algorithm_and_default_config
    rllib_registry.ALGORITHMS_CLASS_TO_NAME["R3L"] = "R3L"
    from rllib_r3l.stopping import install_env_callback

    install_env_callback()  # tune.run("R3L", stop={misspelt key}) is refused, not run forever
    _drop_new_api_stack_notice()
    return True


class _DropNewApiStackNotice:
    """RLlib warns on every R3L config that the new API stack is on (R3L runs on nothing else): noise on every
    console, the main job's --resume included (re-probe 11)."""

    def filter(self, record) -> bool:
        return "running R3L on the new API stack" not in str(record.msg)


def _drop_new_api_stack_notice() -> None:
    import logging

    rllib_config_logger = logging.getLogger("ray.rllib.algorithms.algorithm_config")
    if not any(isinstance(f, _DropNewApiStackNotice) for f in rllib_config_logger.filters):
        rllib_config_logger.addFilter(_DropNewApiStackNotice())


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
