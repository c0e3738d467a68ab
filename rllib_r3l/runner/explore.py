"""Language-guided exploration (paper §4 "Reflect-then-retry", "Data construction").

Per task group (N = ``group_size``):

1. ``base``: N/2 on-policy rollouts (all N when reflection is off: the GRPO exploration budget;
   N/(1+r) with ``retries_per_failure = r``, so base + retries never exceed N);
2. ``reflect``: the policy (or a separate reflector) diagnoses each base rollout: outcome, root
   cause, suggestion and the pivot turn;
3. ``retry``: a failed/inefficient rollout is restarted at its pivot with the guidance in context;
   the retry's training input has the guidance stripped and joins the base rollouts' group;
4. ``pivot``: base and retry share the prefix before the pivot, which carries no credit;
5. auxiliary items: a successful retry that beats its base adds the reflection (prompt -> report)
   and the guided retry as positive items (advantage 1.0, weight ``aux_weight``); one reflection
   item per reflection, however many of its retries succeed.

Success is decided once, by ``core_algos.is_success`` (the environment's ``won``, else the return
within tolerance of ``success_reward``), and stored on ``Trajectory.success`` for every later use.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from rllib_r3l import core_algos, retry_ledger
from rllib_r3l.generation.base import GenerationBackend
from rllib_r3l.options import default, resolve_reflection_context, resolve_reflection_structured
from rllib_r3l.runner.aux_items import AuxItems
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.reflecting import Reflecting
from rllib_r3l.runner.reflection import hindsight as hindsight_lib
from rllib_r3l.runner.reflection import oracle as oracle_lib
from rllib_r3l.runner.reflection import reflect as reflect_lib
from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec
from rllib_r3l.trajectory import Kind, Status, Trajectory

logger = logging.getLogger(__name__)

LOST = (Status.ENV_ERROR, Status.GENERATION_ERROR)


@dataclass
class ExploreOptions:
    """What ``Explorer`` reads of the config (field names and defaults are ``R3LConfig``'s, from
    ``rllib_r3l.options``; ``from_config`` builds it from a config)."""

    group_size: int = default("group_size")
    reflect: bool = default("reflect")
    retries_per_failure: int = default("retries_per_failure")
    success_reward: float = default("success_reward")
    aux_items: Sequence[str] = tuple(default("aux_items"))
    aux_weight: float = default("aux_weight")
    reflection_template: Optional[str] = default("reflection_template")
    guidance_template: Optional[str] = default("guidance_template")  # None: reflect_lib.DEFAULT_GUIDANCE_TEMPLATE
    reflection_style: str = default("reflection_style")
    reflection_temperature: Optional[float] = default("reflection_temperature")  # None: temperature
    # None resolved by the style (from_config): the paper samples freely
    reflection_structured: bool = resolve_reflection_structured(
        default("reflection_structured"), default("reflection_style")
    )
    max_reflection_tokens: int = default("max_reflection_tokens")
    temperature: float = default("temperature")
    pivotal_credit: bool = default("pivotal_credit")
    max_context_tokens: Optional[int] = default("max_context_tokens")  # longer auxiliary items are dropped (counted)
    # the behaviour model's log-probs on base rollouts (use_importance_ratio, max_policy_lag)
    score_behaviour: bool = default("use_importance_ratio")
    # "auto" resolved: "transcript" continues the episode's own context (rllib_r3l.runner.reflection.context)
    reflection_context: str = resolve_reflection_context(default("reflection_context"), default("reflector"))
    reflection_max_chars: Optional[int] = default("reflection_max_chars")
    reflector: str = default("reflector")  # "oracle": DIAGNOSTIC reports (rllib_r3l.runner.reflection.oracle)
    reflect_on: str = default("reflect_on")
    pivot_selector: str = default("pivot_selector")
    pivot_backoff: int = default("pivot_backoff")
    retry_control: bool = default("retry_control")  # DIAGNOSTIC: a fresh unguided episode beside each retry

    @classmethod
    def from_config(cls, config: Any, evaluation: bool = False) -> "ExploreOptions":
        """The options of ``config`` (an ``R3LConfig``); ``evaluation``: base episodes only, nothing scored."""
        kw = {f.name: getattr(config, f.name) for f in fields(cls) if f.name not in ("score_behaviour",)}
        kw.update(
            aux_items=tuple(config.aux_items),
            reflect=bool(config.reflect) and not evaluation,
            reflection_context=config.resolved_reflection_context(),
            reflection_structured=config.resolved_reflection_structured(),
            score_behaviour=bool(config.use_importance_ratio or config.max_policy_lag) and not evaluation,
        )
        return cls(**kw)

    @property
    def num_base(self) -> int:
        """Base rollouts per group: N/(1+r) with reflection (r = retries per failure), else N."""
        if not self.reflect:
            return self.group_size
        return max(1, self.group_size // (1 + self.retries_per_failure))


@dataclass
class GroupResult:
    """One task's trajectories, ready for advantage computation, plus what happened on the way."""

    group_id: str
    trajectories: List[Trajectory] = field(default_factory=list)  # base + stripped retries + aux
    lost: List[Trajectory] = field(default_factory=list)  # episodes that failed (env/generation error)
    complete: bool = True
    ledger: List[Dict[str, Any]] = field(default_factory=list)  # rllib_r3l.retry_ledger rows of this group
    policy_version: Optional[int] = None  # learner updates in the weights it was sampled with (driver-tagged)


def _base_success(group: GroupResult) -> float:
    """Success rate of a group's base episodes (what the ledger compares a retry's task by)."""
    bases = [t for t in group.trajectories if t.kind == Kind.BASE]
    return sum(1 for t in bases if t.success) / len(bases) if bases else 0.0


class Explorer(Reflecting, AuxItems):
    """Runs R3L's exploration for a batch of task groups with one policy backend."""

    def __init__(
        self,
        episodes: EpisodeRunner,
        chat: ChatFormat,
        options: ExploreOptions,
        reflector: Optional[GenerationBackend] = None,
        reflector_chat: Optional[ChatFormat] = None,
    ) -> None:
        self.episodes = episodes
        self.chat = chat
        self.opts = options
        self.reflector = reflector or episodes.backend
        self.reflector_chat = reflector_chat or chat
        # the style's prompt (the paper's: a Reflector system prompt over the episode's log); a configured
        # template replaces the style's user message
        self.reflection_system, style_template = reflect_lib.style_prompt(options.reflection_style)
        self.template = (
            reflect_lib.load_template(options.reflection_template) if options.reflection_template else style_template
        )
        self.counters: Counter = episodes.counters
        self.reflection_stats = reflect_lib.ReflectionStats()
        self.samples: Dict[str, List[float]] = {}
        self.reflect_seconds = 0.0  # time spent reflecting in the last explore() (r3l/timers/reflect_s)
        self._retry_allowance: Optional[int] = None  # explore(max_episodes=...): retries that may still start

    def _log(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(float(value))

    def is_success(self, t: Trajectory) -> bool:
        """``t.success`` holds the environment's ``won`` until this sets the final verdict."""
        return core_algos.is_success(t.reward, t.success, success_reward=self.opts.success_reward)

    # ------------------------------------------------------------------------------------------------
    def explore(
        self, seeds: Sequence[int], group_ids: Sequence[str], max_episodes: Optional[int] = None
    ) -> List[GroupResult]:
        """Base rollouts -> reflect -> retry from the pivot, for every task (batched across tasks).

        ``max_episodes``: at most this many base and retry episodes start (an exact trajectory budget:
        the base episodes task by task first, then the retries in reflection order; a retry cut off is
        counted as ``retries_cut_by_budget`` and ledgered as ``cut``); the episodes started are counted
        in ``counters["episodes_started"]``."""
        n_base = self.opts.num_base
        self.reflect_seconds = 0.0
        specs = [EpisodeSpec(seed=s, group_id=g) for s, g in zip(seeds, group_ids) for _ in range(n_base)]
        if max_episodes is not None:
            specs = specs[: max(0, int(max_episodes))]
            group_ids = [g for g in group_ids if any(s.group_id == g for s in specs)]
        self.counters["episodes_started"] += len(specs)
        self._retry_allowance = None if max_episodes is None else max(0, int(max_episodes) - len(specs))
        ran = None
        if self.pipelined:  # reflections and retries start as their bases end (rllib_r3l.runner.pipeline)
            from rllib_r3l.runner.pipeline import explore_pipelined

            ran = explore_pipelined(self, specs, self._retry_allowance)
        bases = [b for b in (ran.bases if ran else self.episodes.run(specs)) if b is not None]
        for b in bases:
            b.success = self.is_success(b)
        if self.opts.score_behaviour:
            self.episodes.score_behaviour(bases)
        groups = {g: GroupResult(group_id=g) for g in group_ids}
        for b in bases:
            (groups[b.group_id].lost if b.status in LOST else groups[b.group_id].trajectories).append(b)
        if self.opts.reflect:
            self._reflect_and_retry(self._to_reflect([b for g in groups.values() for b in g.trajectories]), groups, ran)
        for g in groups.values():
            if g.lost:
                g.complete = False
        return list(groups.values())

    # -- reflect -------------------------------------------------------------------------------------
    def _to_reflect(self, bases: List[Trajectory]) -> List[Trajectory]:
        """The base episodes that get a reflection. ``reflect_on="failures"`` (paper §3: "unsuccessful
        samples are diagnosed") passes over successes, counted as ``reflections_skipped_successes``;
        ``"all"`` (the authors' code) also reflects on successes, which may retry an inefficient
        one or, with ``reflection_sft``, add a recognised success's report."""
        if self.opts.reflect_on == "all":
            return bases
        failed = [b for b in bases if not b.success]
        self.counters["reflections_skipped_successes"] += len(bases) - len(failed)
        return failed

    # -- retry ---------------------------------------------------------------------------------------
    @property
    def pipelined(self) -> bool:
        """Episode loops with reflection: no barrier between the phases (rllib_r3l.runner.pipeline). Hindsight
        pivots score with the engine's batch call, which would run the loop's requests too: phases then."""
        return (
            self.opts.reflect
            and getattr(self.episodes.opts, "rollout_loop", "waves") == "episodes"
            and self.opts.pivot_selector != "hindsight"
        )

    def retry_of(self, b: Trajectory, parsed: Any, hindsight_pivot: Optional[int]) -> Optional[tuple]:
        """``(pivot, guidance)`` of the retries ``parsed`` (a report on ``b``) starts, or None."""
        if parsed is None or not (parsed.triggers_retry and b.actions):
            return None
        guidance = reflect_lib.format_guidance(parsed.report, self.opts.guidance_template)
        pivot = int(parsed.report.pivot) if hindsight_pivot is None else hindsight_pivot
        return max(0, pivot - self.opts.pivot_backoff), guidance

    def _reflect_and_retry(self, bases: List[Trajectory], groups: Dict[str, GroupResult], ran: Any = None) -> None:
        if ran is None:
            t0 = time.perf_counter()
            reflections = self.reflect(bases)
            self.reflect_seconds += time.perf_counter() - t0
            hindsight = hindsight_lib.explorer_pivots(self, bases, reflections)  # pivot_selector="hindsight"
        else:  # reflected and retried as each base ended (rllib_r3l.runner.pipeline)
            reflections = [ran.reflections[id(b)] for b in bases]
            if self.opts.reflector != "oracle":
                oracle_lib.log_pivot_quality(self, bases, reflections)
            hindsight = ran.hindsight
            self.reflect_seconds += ran.reflect_seconds
        retry_specs: List[EpisodeSpec] = []
        retry_keys: List[tuple] = []  # (id(base), attempt) per retry spec
        rows = []  # per reflection: its ledger row and the indices of its retries in retry_specs
        for i, (b, (parsed, prompt_ids, out)) in enumerate(zip(bases, reflections)):
            b.info["reflection"] = (parsed, prompt_ids, out)
            row = retry_ledger.reflection_row(
                b,
                parsed,
                out,
                style=self.opts.reflection_style,
                reflection=i,
                group_base_success=_base_success(groups[b.group_id]),
            )
            rows.append((b, row, []))
            if parsed is None:
                continue
            retry = self.retry_of(b, parsed, hindsight.get(id(b)))
            if retry is not None:
                row["hindsight_pivot"] = hindsight.get(id(b))
                for attempt in range(self.opts.retries_per_failure):
                    rows[-1][2].append(len(retry_specs))
                    retry_keys.append((id(b), attempt))
                    retry_specs.append(
                        EpisodeSpec(
                            seed=b.seed, group_id=b.group_id, kind=Kind.RETRY, base=b, pivot=retry[0], guidance=retry[1]
                        )
                    )
            elif parsed.ok and b.success and self._adds("reflection_sft") and out is not None:
                # A success the reflector recognises: only the reflection item (authors' code).
                self._add_reflection_item(b, groups[b.group_id])
        self._log_count("retry_trigger_rate", len(retry_specs), len(bases))
        allowed = len(retry_specs) if self._retry_allowance is None else min(len(retry_specs), self._retry_allowance)
        self.counters["retries_cut_by_budget"] += len(retry_specs) - allowed
        self.counters["episodes_started"] += allowed
        if ran is None:
            retries = self.episodes.run(retry_specs[:allowed]) if allowed else []
        else:
            if set(ran.retries) != set(retry_keys[:allowed]):  # the pipeline's budget rule is the phases' rule
                raise RuntimeError(f"pipelined retries {sorted(ran.retries)} differ from {retry_keys[:allowed]}")
            retries = [ran.retries[k] for k in retry_keys[:allowed]]
        retries += [None] * (len(retry_specs) - allowed)
        controls = self._controls([b for b, _row, idx in rows if any(j < allowed for j in idx)])
        for b, row, idx in rows:
            control = controls.get(id(b))
            if not idx:
                groups[b.group_id].ledger.append(row)
            for attempt, j in enumerate(idx):
                spec, r = retry_specs[j], retries[j]
                if j >= allowed:  # past the trajectory budget: never started
                    status = "cut"
                elif r is None:  # replay mismatch: counted by the episode runner
                    self.counters["retries_skipped"] += 1
                    status = "skipped"
                else:
                    status = self._add_retry(spec.base, r, groups[spec.group_id])
                groups[b.group_id].ledger.append(
                    retry_ledger.with_retry(row, b, spec.pivot, r, status, attempt, control)
                )

    def _controls(self, bases: List[Trajectory]) -> Dict[int, Trajectory]:
        """``retry_control`` (DIAGNOSTIC): one fresh unguided episode of each retried base's task from turn 0, at
        the training temperature; only its success is kept (the ledger, ``r3l/control_success_rate``)."""
        if not self.opts.retry_control or not bases:
            return {}
        runs = self.episodes.run([EpisodeSpec(seed=b.seed, group_id=f"{b.group_id}/control") for b in bases])
        out = {}
        for b, c in zip(bases, runs):
            if c is None or c.status in LOST:
                self.counters["control_episodes_lost"] += 1
                continue
            c.success = self.is_success(c)
            self.counters["control_episodes"] += 1
            self._log("control_success_rate", float(c.success))
            out[id(b)] = c
        return out

    def _log_count(self, key: str, num: float, den: float) -> None:
        if den > 0:
            self._log(key, num / den)

    def _add_retry(self, base: Trajectory, retry: Trajectory, group: GroupResult) -> str:
        """Join ``retry`` to its group (credit, auxiliary items); its ledger status: ok, lost or empty."""
        retry.success = self.is_success(retry)
        if retry.status in LOST:
            group.lost.append(retry)
            return "lost"
        k = int(retry.pivot or 0)
        if not any(s.role == "response" and s.turn >= k for s in retry.segments):
            # nothing generated after the pivot (e.g. the context overflowed there): no corrected
            # suffix, so no pair to credit and no sample for the baseline; counted, base untouched
            self.counters["retries_empty"] += 1
            return "empty"
        self._log("retry_success_rate", float(retry.success))
        self._log("retry_improvement_rate", float(retry.reward > base.reward))
        self._log("reward_gain", retry.reward - base.reward)
        self._log("mean_pivot_turn", k)
        self._log_pivot_action(base, retry, k)
        if self.opts.pivotal_credit and k > 0:
            retry.credit_from_turn = k
            base.credit_from_turn = k if base.credit_from_turn == 0 else min(base.credit_from_turn, k)
        group.trajectories.append(retry.strip_guidance())
        beats = retry.reward > base.reward or (retry.reward == base.reward and retry.num_turns < base.num_turns)
        if retry.success and beats:
            if self._adds("reflection_sft"):
                self._add_reflection_item(base, group)
            if self._adds("retry_sft"):
                sft = retry.guided_view()
                sft.kind, sft.fixed_advantage, sft.weight = Kind.RETRY_SFT, 1.0, self.opts.aux_weight
                sft.credit_from_turn = k if self.opts.pivotal_credit else 0
                sft.group_id = f"{retry.group_id}/retry_sft/{id(retry)}"
                self._add_aux_item(sft, group)
        return "ok"

    def _adds(self, kind: str) -> bool:
        """Whether auxiliary items of this kind (``reflection_sft``, ``retry_sft``) join the batch."""
        return kind in self.opts.aux_items

    def _log_pivot_action(self, base: Trajectory, retry: Trajectory, k: int) -> None:
        """Did the guidance change what the policy does at the pivot? ``retry_changed_pivot_action``:
        the retry's action there differs from its base's; with the oracle reflector,
        ``retry_took_oracle_action``: it is the gold action the report named (the link between a
        good reflection and a successful retry)."""
        from environments._common import normalize_action  # how the environments compare actions

        if k >= len(retry.actions):
            return
        taken = normalize_action(retry.actions[k])
        if k < len(base.actions):
            self._log("retry_changed_pivot_action", float(taken != normalize_action(base.actions[k])))
        gold = base.info.get("oracle_action")
        if gold:
            self._log("retry_took_oracle_action", float(taken == normalize_action(gold)))

    # ------------------------------------------------------------------------------------------------
    def pop_metrics(self) -> Dict[str, float]:
        """Means of the per-sample statistics since the last call, under their ``r3l/`` names."""
        out = {k: float(np.mean(v)) for k, v in self.samples.items() if v}
        self.samples = {}
        if self.reflection_stats.total:  # no reflection this round (reflect=False): no reflection metrics
            out.update(self.reflection_stats.as_metrics())
        self.reflection_stats = reflect_lib.ReflectionStats()
        return out
