"""A scripted stand-in for the LLM policy/reflector, for tests that need decisions fixed in advance.

It implements the real ``GenerationBackend`` interface and answers with real tokenizer ids, so
everything around it (chat rendering, environments, reflection parsing, retries, masks, advantages)
runs for real. Only the model's *choices* are scripted.
"""

from __future__ import annotations

import json
from typing import Callable, List, Optional

from rllib_r3l.generation.base import GenerationBackend, GenerationRequest, GenerationResult

GUIDE_MARK = "GO-RIGHT-INSTEAD"


def corridor_policy(prompt_text: str, choices: Optional[List[str]]) -> str:
    """Unguided: always 'move left' (else 'take coin'); guided: move right until the coin, take it."""
    last_user = prompt_text.rsplit("user\n", 1)[-1]
    guided = GUIDE_MARK in prompt_text
    if "coin here" in last_user:
        return "take coin"
    if guided:
        return "move right"
    return "move left" if "move left" in last_user else "take coin"


def is_reflection_request(prompt_text: str) -> bool:
    """A reflection prompt's last user message asks for ``retry_from_step`` (a retry's guidance may name
    it too, but in a system message before the pivot's observation)."""
    return "retry_from_step" in prompt_text.rsplit("user\n", 1)[-1]


def free_report(report: dict) -> str:
    """A report as a freely sampling policy writes it: a sentence, then the object in a fenced block."""
    return "I looked at the attempt step by step.\n```json\n" + json.dumps(report, indent=1) + "\n```"


class ScriptedBackend(GenerationBackend):
    name = "scripted"

    def __init__(self, tokenizer, policy: Callable = corridor_policy, pivot: int = 1, outcome: str = "failure") -> None:
        self.tok = tokenizer
        self.policy = policy
        self.pivot = pivot
        self.outcome = outcome
        self.calls: List[List[GenerationRequest]] = []
        self.temperatures: List[float] = []  # one per generate call

    def _result(self, text: str) -> GenerationResult:
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        return GenerationResult(token_ids=ids, logprobs=[-0.5] * len(ids), text=text, finish_reason="stop")

    def generate(self, requests, *, temperature, top_p=1.0, seed=None, on_done=None):
        self.calls.append(list(requests))
        self.temperatures.append(temperature)
        out = []
        for r in requests:
            text = self.tok.decode(r.prompt_token_ids)
            report = {
                "summary": "The agent kept moving left and took a coin where none was.",
                "root_cause": "Why did it fail? Because it moved away from the coin.",
                "outcome": self.outcome,
                "suggestion": f"{GUIDE_MARK}: move right to find the coin.",
                "retry_from_step": self.pivot,
            }
            if r.json_schema is not None:  # reflection requests are held to the report schema
                out.append(self._result(json.dumps(report)))
            elif is_reflection_request(text):  # a free reflection (the paper's style): prose around the object
                out.append(self._result(free_report(report)))
            else:
                out.append(self._result(self.policy(text, r.choices)))
        return out

    def update_weights(self, named_tensors):
        raise NotImplementedError("scripted backend has no weights")

    def score(self, prompt_token_ids, continuation_ids):
        raise NotImplementedError("scripted backend has no weights")


def walk_policy(unguided: str = "left", guided: str = "right") -> Callable:
    """A corridor policy: take the coin when it is here, else move in a fixed direction.

    ``unguided``/``guided`` are the directions without/with the retry guidance in context:
    ``"left"``, ``"right"`` or ``"detour"`` (right to the last room first, then left). When the
    move is not admissible the policy answers ``take coin`` (an invalid action, the episode goes on).
    """
    import re

    def policy(prompt_text: str, choices: Optional[List[str]]) -> str:
        last_user = prompt_text.rsplit("user\n", 1)[-1]
        if "coin here" in last_user:
            return "take coin"
        direction = guided if GUIDE_MARK in prompt_text else unguided
        if direction == "detour":
            rooms = re.findall(r"You are in room (\d+) of (\d+)", prompt_text)
            direction = "left" if any(a == b for a, b in rooms) else "right"
        move = f"move {direction}"
        return move if move in last_user else "take coin"

    return policy


def make_trajectory(
    parts,
    *,
    reward: float,
    group_id: str,
    kind=None,
    credit_from_turn: int = 0,
    weight: float = 1.0,
    fixed_advantage: Optional[float] = None,
    first_id: int = 10,
):
    """A hand-made trajectory: ``parts`` is a list of ``(role, num_tokens, turn)``.

    Token ids count up from ``first_id`` (distinct, inside any vocabulary used here); response
    segments get sampler log-probs of -1.0. Returns the trajectory; its credited positions are
    what a test states by hand.
    """
    from rllib_r3l.trajectory import Kind, Segment, Trajectory

    segs, nxt = [], first_id
    for role, n, turn in parts:
        ids = list(range(nxt, nxt + n))
        nxt += n
        segs.append(Segment(role, ids, turn=turn, logprobs=[-1.0] * n if role == "response" else None))
    return Trajectory(
        segments=segs,
        reward=reward,
        group_id=group_id,
        kind=kind or Kind.BASE,
        credit_from_turn=credit_from_turn,
        weight=weight,
        fixed_advantage=fixed_advantage,
        num_turns=1 + max(t for _, _, t in parts),
    )


# A hand-made batch for the credit and loss tests: (name, parts, options, credited positions).
# Positions are counted by hand from the parts: prompt/response runs laid end to end.
HANDMADE = [
    # a base whose retry restarted at turn 1: its turn-0 response (positions 3-4) carries no credit
    (
        "A",
        [("prompt", 3, 0), ("response", 2, 0), ("prompt", 2, 1), ("response", 3, 1)],
        dict(reward=0.0, group_id="g", credit_from_turn=1),
        [7, 8, 9],
    ),
    # a base without pivot, ending on an observation it never answered (positions 10-11)
    (
        "B",
        [("prompt", 4, 0), ("response", 2, 0), ("prompt", 3, 1), ("response", 1, 1), ("prompt", 2, 2)],
        dict(reward=0.7, group_id="g"),
        [4, 5, 9],
    ),
    # the retry from turn 1: its replayed turn-0 response (3-4) carries no credit
    (
        "R",
        [
            ("prompt", 3, 0),
            ("response", 2, 0),
            ("prompt", 2, 1),
            ("response", 2, 1),
            ("prompt", 1, 2),
            ("response", 2, 2),
        ],
        dict(reward=1.0, group_id="g", kind="retry", credit_from_turn=1),
        [7, 8, 10, 11],
    ),
    # auxiliary items: fixed advantage 1.0, alone in their group, weight aux_weight (0.5 here)
    (
        "X",
        [("prompt", 5, 0), ("response", 3, 0)],
        dict(reward=1.0, group_id="g/reflection/1", kind="reflection_sft", fixed_advantage=1.0, weight=0.5),
        [5, 6, 7],
    ),
    (
        "Y",
        [("prompt", 2, 0), ("response", 1, 0), ("prompt", 3, 1), ("response", 2, 1)],
        dict(
            reward=1.0, group_id="g/retry_sft/1", kind="retry_sft", fixed_advantage=1.0, weight=0.5, credit_from_turn=1
        ),
        [6, 7],
    ),
    # a group whose rewards are all equal: advantage 0, left out of the batch
    ("Z1", [("prompt", 2, 0), ("response", 2, 0)], dict(reward=0.5, group_id="h"), [2, 3]),
    ("Z2", [("prompt", 2, 0), ("response", 2, 0)], dict(reward=0.5, group_id="h"), [2, 3]),
    # a success (advantage 1.0) and a member with no credited token (pivot past its last turn): left out
    ("V1", [("prompt", 2, 0), ("response", 2, 0)], dict(reward=1.0, group_id="v"), [2, 3]),
    (
        "V2",
        [("prompt", 2, 0), ("response", 2, 0), ("prompt", 1, 1), ("response", 1, 1)],
        dict(reward=0.0, group_id="v", kind="retry", credit_from_turn=3),
        [],
    ),
]
# Advantages by hand: group g rewards (0, 0.7, 1.0), mean 0.5667: A -0.5667 (negative: unchanged),
# B (0.7 - 0.5667) x 3 = 0.4 (amplified), R 1.0 (success); X, Y fixed 1.0; h: 0, 0; v: V1 1.0, V2 -0.5.
HANDMADE_ADVANTAGES = {
    "A": -1.7 / 3,
    "B": 0.4,
    "R": 1.0,
    "X": 1.0,
    "Y": 1.0,
    "Z1": 0.0,
    "Z2": 0.0,
    "V1": 1.0,
    "V2": -0.5,
}
HANDMADE_KEPT = ["A", "B", "R", "X", "Y", "V1"]  # rows of the learner batch, in this order


def handmade_trajectories(**overrides):
    """The ``HANDMADE`` trajectories (token ids distinct per trajectory); ``overrides[name]`` updates options."""
    from rllib_r3l.trajectory import Kind

    out = []
    for i, (name, parts, opts, _pos) in enumerate(HANDMADE):
        o = dict(opts, **overrides.get(name, {}))
        if isinstance(o.get("kind"), str):
            o["kind"] = Kind(o["kind"])
        t = make_trajectory(parts, first_id=100 + 20 * i, **o)
        t.task = name
        out.append(t)
    return out


# The exploration the mechanism tests script against: every base episode reflected on (the authors'
# code), both auxiliary items, the numbered-log reflection context, no context cap on auxiliary items.
# R3LConfig's defaults differ (rllib_r3l.options); tests of those build ExploreOptions.from_config.
SCRIPTED_EXPLORE = dict(
    reflect_on="all",
    aux_items=("reflection_sft", "retry_sft"),
    reflection_context="log",
    max_reflection_tokens=512,
    max_context_tokens=None,
)


def explore_options(**overrides):
    """``ExploreOptions`` for a scripted explorer: ``SCRIPTED_EXPLORE`` with ``overrides``."""
    from rllib_r3l.runner.explore import ExploreOptions

    return ExploreOptions(**{**SCRIPTED_EXPLORE, **overrides})


SEED = 11  # ToyCorridor(4 rooms): start in room 2, coin in room 4


def make_explorer(tokenizer, pivot=1, group_size=4, **kw):
    """A real ``Explorer`` on ToyCorridor (4 rooms) whose policy and reflector are a ``ScriptedBackend``."""
    import environments
    from rllib_r3l.runner.chat import ChatFormat
    from rllib_r3l.runner.explore import Explorer
    from rllib_r3l.runner.rollout import EpisodeRunner, RolloutOptions

    chat = ChatFormat(tokenizer)
    backend = ScriptedBackend(tokenizer, pivot=pivot)
    opts = RolloutOptions(max_turns=6, max_response_tokens=16, max_context_tokens=4096, temperature=1.0)
    runner = EpisodeRunner(backend, chat, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), opts)
    eo = explore_options(group_size=group_size, **kw)
    return Explorer(runner, chat, eo), backend
