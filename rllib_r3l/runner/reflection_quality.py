"""Reflection quality on finished episodes (held-out evaluation): the policy reflects, nothing is retried;
the counts of ``Explorer.reflect`` plus pivot metrics where the environment has an oracle
(rllib_r3l.runner.reflection.oracle). :func:`reflection_summary` adds them to an evaluation's summary
(``rllib_r3l.cli.evaluate.evaluate(extra=...)``; no ``rllib-r3l evaluate`` flag reaches it)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from rllib_r3l.options import resolve_reflection_context, resolve_reflection_structured
from rllib_r3l.runner.explore import LOST, ExploreOptions, Explorer
from rllib_r3l.runner.rollout import EpisodeSpec

__all__ = ["score_reflections", "reflection_quality", "reflection_summary"]
# what :func:`reflection_summary` adds to an evaluation's summary
SUMMARY_KEYS = (
    "reflected",
    "reflection_valid_rate",
    "pivot_exact_rate",
    "pivot_in_time_rate",
    "pivot_error_mean",
    "pivot_early_rate",
    "pivot_accuracy",
)


def score_reflections(
    episodes: Any,
    chat: Any,
    trajectories: Sequence[Any],
    *,
    reflector: Any = None,
    reflector_chat: Any = None,
    max_reflection_tokens: int = 256,
    temperature: float = 0.4,
    structured: Optional[bool] = None,
    style: str = "structured",
    template: Optional[str] = None,
    success_reward: float = 1.0,
) -> dict:
    """How good are a policy's reflections on finished episodes? (held-out evaluation)

    The policy (or ``reflector``) reflects on each of ``trajectories`` (run by ``episodes``, an
    :class:`~rllib_r3l.runner.rollout.EpisodeRunner`, whose environments also serve the oracle); nothing is
    retried. Returns ``reflection_valid_rate`` and the other reflection counts, and, where the
    environment has an oracle, ``pivot_exact_rate``, ``pivot_in_time_rate``, ``pivot_error_mean``, ``pivot_early_rate``
    and (secondary, within one turn) ``pivot_accuracy``; plus
    ``reflected`` (episodes with at least one action, the ones reflected on). ``style`` is the config's
    ``reflection_style`` (its prompt and context); ``structured`` None = by the style.
    """
    opts = ExploreOptions(
        group_size=2,
        reflect=True,
        max_reflection_tokens=max_reflection_tokens,
        temperature=temperature,
        reflection_structured=resolve_reflection_structured(structured, style),
        reflection_style=style,
        reflection_context=resolve_reflection_context("auto", "policy", style),
        reflection_template=template,
        success_reward=success_reward,
    )
    ex = Explorer(episodes, chat, opts, reflector=reflector, reflector_chat=reflector_chat)
    todo = [t for t in trajectories if t is not None and t.status not in LOST and t.actions]
    for t in todo:
        t.success = ex.is_success(t)
    if todo:
        ex.reflect(todo)
    out = ex.pop_metrics()
    out["reflected"] = float(len(todo))
    return out


def reflection_quality(episodes: Any, chat: Any, seeds: Sequence[int], **kw: Any) -> dict:
    """:func:`score_reflections` on one fresh base episode per seed; adds ``episodes`` and
    ``success_rate`` (of those episodes)."""
    runs = episodes.run([EpisodeSpec(seed=int(s), group_id=f"reflection-quality-{s}") for s in seeds])
    bases = [t for t in runs if t is not None and t.status not in LOST]
    out = score_reflections(episodes, chat, bases, **kw)
    out.update(
        {
            "episodes": float(len(bases)),
            "success_rate": float(sum(b.success for b in bases) / len(bases)) if bases else 0.0,
        }
    )
    return out


def reflection_summary(max_reflection_tokens: Optional[int] = None) -> Callable[..., dict]:
    """The ``extra`` of ``rllib_r3l.cli.evaluate.evaluate`` that lets the policy also reflect on each evaluated
    episode (no retry) and adds its reflection quality to the summary: ``reflection_valid_rate`` and, where the
    environment has an oracle, ``pivot_exact_rate``, ``pivot_in_time_rate``, ``pivot_error_mean``,
    ``pivot_early_rate``, ``pivot_accuracy`` (``rllib_r3l.runner.reflection.oracle``). The reflection settings are
    the checkpoint's; ``max_reflection_tokens`` replaces its own. No CLI flag reaches it (tests and scripts do)."""

    def score(runner: Any, chat: Any, trajectories: Sequence[Any], setting, temperature: float, success_reward: float):
        m = score_reflections(
            runner,
            chat,
            trajectories,
            temperature=temperature,
            max_reflection_tokens=int(max_reflection_tokens or setting("max_reflection_tokens")),
            structured=setting("reflection_structured"),
            style=setting("reflection_style"),
            template=setting("reflection_template"),
            success_reward=success_reward,
        )
        return {k: m[k] for k in SUMMARY_KEYS if k in m}

    return score
