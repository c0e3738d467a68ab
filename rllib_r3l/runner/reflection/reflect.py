"""Reflection: prompt the policy to diagnose an episode, and turn its report into retry guidance.

R3L's reflect-then-retry step (paper §4 "Reflect-then-retry") shows a finished episode to the same
policy model and asks it for a structured report: a summary of what happened, a root cause, an
outcome judgement, a corrective suggestion and the pivot turn to restart from. A valid report that
is not ``success`` triggers a retry from the pivot with the report inserted as guidance (the
guidance is stripped from what is trained on, paper §4); pivotal credit then masks the turns
before the pivot (paper §4 "Pivotal Credit Assignment").

This module is pure Python (no torch / vLLM). It provides:

* :func:`build_reflection_messages` - the chat messages for the reflection pass;
* :data:`REPORT_JSON_SCHEMA` / :func:`report_json_schema` - for constrained decoding;
* :func:`format_guidance` - the text inserted into the retry's context.

The report itself (its model, the parser that never raises, the per-status counts) is
:mod:`rllib_r3l.runner.reflection.report`; its names are re-exported here.
"""

from __future__ import annotations

import os
import re
import string
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from rllib_r3l.errors import template_problem
from rllib_r3l.runner.reflection.parse import parse_report
from rllib_r3l.runner.reflection.report import Outcome, ParseResult, ParseStatus, ReflectionReport, ReflectionStats

__all__ = [
    "Outcome",
    "ReflectionReport",
    "ParseStatus",
    "ParseResult",
    "parse_report",
    "ReflectionStats",
    "DEFAULT_REFLECTION_SYSTEM",
    "DEFAULT_REFLECTION_TEMPLATE",
    "REQUIRED_PLACEHOLDERS",
    "OPTIONAL_PLACEHOLDERS",
    "load_template",
    "build_reflection_messages",
    "REPORT_JSON_SCHEMA",
    "report_json_schema",
    "DEFAULT_GUIDANCE_TEMPLATE",
    "format_guidance",
]


# ==================================================================================================
# Prompt construction
# ==================================================================================================
DEFAULT_REFLECTION_SYSTEM = (
    "You are a careful reviewer of an AI agent's attempts at tasks. You read a complete record of "
    "one attempt, work out what went right or wrong and why, and answer with a single JSON object."
)

# Written for this project. Placeholders: {rules} {task} {trajectory} {reward} {num_steps}
# {max_step}; literal braces are doubled.
DEFAULT_REFLECTION_TEMPLATE = """\
Below is a record of one attempt by an agent at a task. Review it and diagnose it.

## Rules of the environment
{rules}

## Task
{task}

## The attempt ({num_steps} steps, numbered 0 to {max_step})
{trajectory}

## Result
Final reward: {reward}

## What to do
1. Summarise what the agent did, step by step, and how it ended.
2. Find the root cause of the result. Write it as a chain of questions and answers: "Why did X \
happen? Because Y. Why Y? Because Z. ..." until you reach the first decision that went wrong \
(or, for a good attempt, what made it work).
3. Judge the outcome as exactly one of:
   - "success": the task was completed and there was nothing important to improve;
   - "success_but_inefficient": the task was completed, but with wasted or unnecessary steps;
   - "failure": the task was not completed.
4. Unless the outcome is "success", give one concrete, actionable suggestion that would have led \
to a better result, and name the step to retry from: the earliest step whose action should change. \
Steps before it are kept as they are; the agent restarts by choosing a new action at that step. \
It must be an integer from 0 to {max_step}.

Answer with exactly one JSON object and nothing else, with these fields:
{{
  "summary": "<what happened>",
  "root_cause": "<Why ...? Because ... Why ...? Because ...>",
  "outcome": "success" | "success_but_inefficient" | "failure",
  "suggestion": "<what to do differently>" or null if the outcome is "success",
  "retry_from_step": <integer from 0 to {max_step}> or null if the outcome is "success"
}}
"""

REQUIRED_PLACEHOLDERS: Tuple[str, ...] = ("rules", "task", "trajectory")
OPTIONAL_PLACEHOLDERS: Tuple[str, ...] = ("reward", "num_steps", "max_step")


def style_prompt(style: str) -> Tuple[Optional[str], Optional[str]]:
    """``(system, template)`` of a ``reflection_style``: None, None = this module's defaults
    (``"structured"``); the paper's Reflector prompt for ``"paper"`` (``paper_prompt``)."""
    if style == "paper":
        from rllib_r3l.runner.reflection.paper_prompt import PAPER_REFLECTION_SYSTEM, PAPER_REFLECTION_TEMPLATE

        return PAPER_REFLECTION_SYSTEM, PAPER_REFLECTION_TEMPLATE
    if style != "structured":
        raise ValueError(f"reflection_style must be 'structured' or 'paper', got {style!r}")
    return None, None


def _check_template(template: str) -> str:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ValueError(f"malformed reflection template ({e}); write literal braces as '{{{{' and '}}}}'") from None
    allowed = set(REQUIRED_PLACEHOLDERS) | set(OPTIONAL_PLACEHOLDERS)
    for f in fields:
        if f not in allowed:
            raise ValueError(
                f"reflection template has unknown placeholder {{{f}}}; allowed: "
                + ", ".join("{" + p + "}" for p in (*REQUIRED_PLACEHOLDERS, *OPTIONAL_PLACEHOLDERS))
                + " (write literal braces as '{{' and '}}')"
            )
    for p in REQUIRED_PLACEHOLDERS:
        if p not in fields:
            raise ValueError(f"reflection template is missing the required placeholder {{{p}}}")
    return template


def load_template(template: Union[str, "os.PathLike[str]"]) -> str:
    """Return a checked reflection template given as text or as a path to a text file.

    A ``PathLike``, or a single-line string without ``{`` naming an existing file or not, is a
    path (a missing file raises ``FileNotFoundError``); other strings are template text. The
    template must contain {rules}, {task} and {trajectory}, may contain {reward}, {num_steps} and
    {max_step}, and nothing else (literal braces doubled); otherwise ``ValueError`` names the
    offending placeholder.
    """
    if isinstance(template, os.PathLike) or (
        isinstance(template, str) and "{" not in template and "\n" not in template
    ):
        path = os.fspath(template)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"reflection template file not found: {path!r}")
        with open(path, encoding="utf-8") as fh:
            template = fh.read()
    if not isinstance(template, str):
        raise TypeError(f"template must be a str or a path, got {type(template).__name__}")
    return _check_template(template)


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _format_reward(reward: Any, success: Any, status: Any) -> str:
    if isinstance(reward, (int, float)) and not isinstance(reward, bool):
        text = str(round(float(reward), 4))
    elif reward is None:
        text = "(unknown)"
    else:
        text = str(reward)
    if success is not None:
        text += " (the task was completed)" if success else " (the task was not completed)"
    status_value = getattr(status, "value", status)
    if status_value not in (None, "", "ok"):
        text += f"; the episode ended with status: {status_value}"
    return text


def _format_steps(observations: Sequence[Any], actions: Sequence[Any]) -> str:
    blocks = []
    for k, action in enumerate(actions):
        obs = str(observations[k]).strip() if k < len(observations) else "(no observation recorded)"
        blocks.append(f"### Step {k}\nObservation:\n{obs}\n\nAction:\n{str(action).strip()}")
    if not actions:
        blocks.append("(the agent took no steps)")
    if len(observations) > len(actions):
        extra = "\n\n".join(str(o).strip() for o in observations[len(actions) :])
        where = f"After step {len(actions) - 1}" if actions else "Observation"
        blocks.append(f"### {where}\nFinal observation:\n{extra}")
    return "\n\n".join(blocks)


def build_reflection_messages(
    traj_or_fields: Any,
    template: Optional[Union[str, "os.PathLike[str]"]] = None,
    *,
    rules: Optional[str] = None,
    system: Optional[str] = None,
) -> List[Dict[str, str]]:
    """Chat messages (system + user) asking the policy to reflect on an episode (paper §4).

    ``traj_or_fields`` is a :class:`~rllib_r3l.trajectory.Trajectory` or a mapping with
    ``actions``, ``observations``, ``task``, ``reward`` and optionally ``success``, ``status``
    and ``rules``. The rules come from ``rules=``, else the mapping's ``rules``, else a
    trajectory's ``info["rules"]``. Step ``k`` shows observation ``k`` then action ``k``, for
    ``k = 0..K-1`` with ``K = len(actions)``; an observation beyond the last action is shown as
    the final observation. Pass the same ``K`` to :func:`parse_report` as ``num_turns``.

    An episode without actions still gets a prompt (``K = 0``, so any non-success report parses
    as ``BAD_PIVOT``; callers may prefer to skip such episodes). A bad template raises (see
    :func:`load_template`).
    """
    tmpl = DEFAULT_REFLECTION_TEMPLATE if template is None else load_template(template)
    actions = list(_get(traj_or_fields, "actions", None) or [])
    observations = list(_get(traj_or_fields, "observations", None) or [])
    if rules is None:
        rules = _get(traj_or_fields, "rules", None)
    if rules is None:
        info = _get(traj_or_fields, "info", None)
        if isinstance(info, Mapping):
            rules = info.get("rules")
    rules_text = str(rules).strip() if rules else ""
    if not rules_text:
        rules_text = "(no separate rules; see the task and the observations)"
    task_text = str(_get(traj_or_fields, "task", "") or "").strip() or "(see the first observation)"
    k = len(actions)
    values = {
        "rules": rules_text,
        "task": task_text,
        "trajectory": _format_steps(observations, actions),
        "reward": _format_reward(
            _get(traj_or_fields, "reward", None),
            _get(traj_or_fields, "success", None),
            _get(traj_or_fields, "status", None),
        ),
        "num_steps": str(k),
        "max_step": str(k - 1),
    }
    return [
        {"role": "system", "content": DEFAULT_REFLECTION_SYSTEM if system is None else system},
        {"role": "user", "content": tmpl.format(**values)},
    ]


# ==================================================================================================
# Structured outputs
# ==================================================================================================
def report_json_schema(
    num_steps: Optional[int] = None, failed: Optional[bool] = None, max_chars: Optional[int] = None
) -> Dict[str, Any]:
    """JSON schema of a report, for constrained decoding (vLLM structured outputs).

    The text fields (summary, root cause, suggestion) hold at least one character; with ``max_chars``
    at most that many each: a compact report costs fewer generated tokens per reflection.

    With ``num_steps`` the pivot is also bounded above by ``num_steps - 1``. With ``failed=True``
    (the environment's reward says the episode failed) the outcome ``success`` is not allowed and
    a pivot and a suggestion are required: a weak reflector otherwise calls failures successes.
    The schema cannot express "null exactly on success"; :func:`parse_report` still enforces that.
    """
    # minLength 1: the parser refuses an empty summary, root cause or suggestion, so the grammar never
    # spends a reflection on one
    text: Dict[str, Any] = {"type": "string", "minLength": 1}
    if max_chars is not None:
        text["maxLength"] = int(max_chars)
    pivot: Dict[str, Any] = {"type": "integer", "minimum": 0}
    if num_steps is not None:
        pivot["maximum"] = max(0, int(num_steps) - 1)
    if failed:
        outcomes = [Outcome.FAILURE.value]
        suggestion: Dict[str, Any] = dict(text)
        retry: Dict[str, Any] = pivot
    else:
        outcomes = [o.value for o in Outcome]
        suggestion = {"anyOf": [dict(text), {"type": "null"}]}
        retry = {"anyOf": [pivot, {"type": "null"}]}
    properties = {
        "summary": dict(text),
        "root_cause": dict(text),
        "outcome": {"type": "string", "enum": outcomes},
        "suggestion": suggestion,
        "retry_from_step": retry,
    }
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


REPORT_JSON_SCHEMA: Dict[str, Any] = report_json_schema()


# ==================================================================================================
# Retry guidance
# ==================================================================================================
# Written for this project. Placeholder: {report} (the report as JSON).
DEFAULT_GUIDANCE_TEMPLATE = """\
A reviewer studied an earlier attempt at this same task and wrote the following report:
{report}
Use this report to act better from this point on. Treat it as private notes: do not mention, \
quote or refer to the report or the reviewer in any of your responses; just act."""


GUIDANCE_PLACEHOLDERS = ("report", "suggestion", "root_cause", "summary", "pivot")


def check_guidance_template(template: Any) -> str:
    """A guidance template: text with ``{report}`` (the whole report as JSON) or ``{suggestion}``,
    and optionally ``{root_cause}``, ``{summary}``, ``{pivot}``; ``ValueError`` names what is wrong."""
    problem = template_problem(template, GUIDANCE_PLACEHOLDERS, ("report", "suggestion"))
    if problem:
        raise ValueError(f"guidance template {problem}")
    return template


def format_guidance(report: Union[ReflectionReport, ParseResult], template: Optional[str] = None) -> str:
    """The guidance inserted into the retry's context (paper §4 "Reflect-then-retry"): the whole
    report plus an instruction not to mention it. Training strips it again (guidance segments).

    ``template`` may override the wording (:func:`check_guidance_template`): for example only the
    suggestion, for a policy too small to read the report's JSON.
    """
    if isinstance(report, ParseResult):
        if report.report is None:
            raise ValueError(f"no report to format (parse status {report.status.value})")
        report = report.report
    if not isinstance(report, ReflectionReport):
        raise TypeError(f"expected a ReflectionReport, got {type(report).__name__}")
    tmpl = DEFAULT_GUIDANCE_TEMPLATE if template is None else check_guidance_template(template)
    values = {
        "report": report.to_json(),
        "suggestion": report.suggestion or "",
        "root_cause": report.root_cause,
        "summary": report.summary,
        "pivot": "" if report.pivot is None else str(report.pivot),
    }
    return re.sub(r"{(\w+)}", lambda m: values[m.group(1)], tmpl)
