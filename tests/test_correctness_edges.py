"""Correctness at the edges (issue 14): each test failed before its fix.

Over-long auxiliary items, float-sum successes, near-zero advantages, a like-with-like importance
ratio, the loss scale, ``retries_per_failure > 1``, an end-of-turn token that is not EOS, and
episodes the runner ends itself (context overflow, empty retries).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import environments
from environments.toy import ToyCorridorEnv
from rllib_r3l import core_algos as ca
from rllib_r3l.batch import build_train_batch, drop_overlong
from rllib_r3l.models import stop_token_ids
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.explore import Explorer, GroupResult
from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions
from rllib_r3l.trajectory import Kind, Segment, Status, Trajectory, collate
from tests.scripted import ScriptedBackend, explore_options

SEED = 11  # ToyCorridor(4 rooms): start in room 2, coin in room 4


def make_trajectory(parts, *, reward, group_id, kind=Kind.BASE):
    """``parts``: ``(role, num_tokens, turn)`` runs with distinct token ids; responses log-prob -1."""
    segs, nxt = [], 10
    for role, n, turn in parts:
        segs.append(
            Segment(role, list(range(nxt, nxt + n)), turn=turn, logprobs=[-1.0] * n if role == "response" else None)
        )
        nxt += n
    return Trajectory(
        segments=segs, reward=reward, group_id=group_id, kind=kind, num_turns=1 + max(t for _, _, t in parts)
    )


def _explorer(tokenizer, *, group_size=4, max_context_tokens=4096, env_config=None, env_cls=None, **kw):
    chat = ChatFormat(tokenizer)
    backend = ScriptedBackend(tokenizer, pivot=1)
    opts = RolloutOptions(max_turns=6, max_response_tokens=16, max_context_tokens=max_context_tokens, temperature=1.0)
    factory = (
        (lambda: env_cls(**(env_config or {"num_rooms": 4})))
        if env_cls
        else (lambda: environments.make("r3l/ToyCorridor", env_config or {"num_rooms": 4}))
    )
    runner = EpisodeRunner(backend, chat, factory, opts)
    return Explorer(runner, chat, explore_options(group_size=group_size, max_context_tokens=max_context_tokens, **kw))


# -- 1. over-long auxiliary items ------------------------------------------------------------------------
def test_overlong_reflection_item_is_dropped_and_counted_not_fatal(tokenizer):
    ex = _explorer(tokenizer)
    [group] = ex.explore([SEED], ["g"])
    refl = [t for t in group.trajectories if t.kind == Kind.REFLECTION_SFT]
    episodes = [t for t in group.trajectories if t.kind in (Kind.BASE, Kind.RETRY, Kind.RETRY_SFT)]
    assert refl, "the scripted retry succeeds and adds reflection items"
    limit = max(t.num_tokens for t in episodes)
    assert min(t.num_tokens for t in refl) > limit, "the reflection prompt re-renders the episode: longer"
    ex2 = _explorer(tokenizer, max_context_tokens=limit)
    [group2] = ex2.explore([SEED], ["g"])
    kinds = [t.kind for t in group2.trajectories]
    assert Kind.REFLECTION_SFT not in kinds and Kind.RETRY in kinds and Kind.RETRY_SFT in kinds
    assert ex2.counters["reflection_sft_items_too_long"] == 2
    # everything left fits the learner: collating with the same limit does not raise
    batch, _ = build_train_batch(
        group2.trajectories,
        pad_token_id=0,
        std_normalize=False,
        positive_amplification=True,
        alpha=3.0,
        success_reward=1.0,
        pivotal_credit=True,
        max_length=limit,
    )
    assert batch["input_ids"].shape[1] <= limit


def test_drop_overlong_is_the_drivers_safety_net():
    short = make_trajectory([("prompt", 3, 0), ("response", 2, 0)], reward=1.0, group_id="a")
    long = make_trajectory([("prompt", 30, 0), ("response", 2, 0)], reward=1.0, group_id="b")
    kept, dropped = drop_overlong([short, long, short], max_length=10)
    assert kept == [short, short] and dropped == 1


# -- 2. success decided once, with a tolerance -------------------------------------------------------------
def test_float_sum_success_is_a_success_everywhere():
    increments = [0.1] * 10
    r = sum(increments)
    assert r < 1.0  # 0.9999999999999999: the float sum falls short
    assert ca.is_success(r) and ca.is_success(0.2, won=True) and not ca.is_success(0.99)
    adv = ca.compute_advantages([r, 0.0, 0.0, 0.0], ["g"] * 4, amplify=True, alpha=3.0)
    assert adv[0] == 1.0  # fixed, not 3 * (r - mean) = 2.25
    # the environment's own verdict decides where it gives one (a won episode with a partial return)
    won = make_trajectory([("prompt", 3, 0), ("response", 2, 0)], reward=0.5, group_id="g")
    won.success = True
    lost = make_trajectory([("prompt", 3, 0), ("response", 2, 0)], reward=0.0, group_id="g")
    _, adv = build_train_batch(
        [won, lost],
        pad_token_id=0,
        std_normalize=False,
        positive_amplification=True,
        alpha=3.0,
        success_reward=1.0,
        pivotal_credit=True,
        max_length=100,
    )
    np.testing.assert_allclose(adv, [1.0, -0.25])


def test_explorer_counts_a_float_sum_success_as_success(tokenizer):
    class TenthsCorridor(ToyCorridorEnv):
        """The coin pays 1.0 in ten increments of 0.1 (a ScienceWorld-like float sum)."""

        def step(self, action):
            obs, reward, term, trunc, info = super().step(action)
            return obs, (sum([0.1] * 10) if reward >= 1.0 else reward), term, trunc, {**info, "won": False}

    ex = _explorer(tokenizer, env_cls=TenthsCorridor)
    [group] = ex.explore([SEED], ["g"])
    retries = [t for t in group.trajectories if t.kind == Kind.RETRY]
    assert retries and all(t.reward < 1.0 and t.success for t in retries)
    assert Kind.RETRY_SFT in [t.kind for t in group.trajectories]  # auxiliary items follow the same verdict


# -- 3. near-zero advantages --------------------------------------------------------------------------------
def test_equal_rewards_that_floats_cannot_represent_give_exact_zeros():
    r = [0.1 + 0.2, 0.3, 0.3, 0.7 - 0.4]  # all "0.3"; the first and last are off by ~5e-17
    assert len({*r}) > 1
    for std in (False, True):
        adv = ca.group_relative_advantages(r, ["g"] * 4, std_normalize=std)
        assert np.all(adv == 0.0), adv  # before: +-1e-17, and +-0.87 with std-normalisation
    trajs = [make_trajectory([("prompt", 3, 0), ("response", 2, 0)], reward=x, group_id="g") for x in r]
    batch, adv = build_train_batch(
        trajs,
        pad_token_id=0,
        std_normalize=False,
        positive_amplification=True,
        alpha=3.0,
        success_reward=1.0,
        pivotal_credit=True,
        max_length=100,
    )
    assert len(batch["input_ids"]) == 0 and int(np.sum(adv == 0)) == 4


# -- 4. importance ratio: like with like ----------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_on_policy_importance_ratio_is_one_under_choice_decoding(tiny_model_dir, tokenizer, temperature):
    from transformers import AutoModelForCausalLM

    from rllib_r3l.generation.hf_backend import HFBackend
    from rllib_r3l.learner.rl_module import R3LCausalLMModule

    torch.manual_seed(0)
    backend = HFBackend(tiny_model_dir, dtype="float32")
    chat = ChatFormat(tokenizer)
    opts = RolloutOptions(
        max_turns=3, max_response_tokens=8, max_context_tokens=2048, temperature=temperature, action_decoding="choice"
    )
    runner = EpisodeRunner(backend, chat, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), opts)
    trajs = runner.run([EpisodeSpec(seed=SEED + i, group_id="g") for i in range(2)])
    runner.score_behaviour(trajs)
    assert runner.counters["seconds_score_behaviour"] > 0  # its prefill is timed (r3l/timers/score_behaviour_s)
    batch = {
        k: torch.as_tensor(v) for k, v in collate(trajs, [1.0, -1.0], pad_token_id=tokenizer.pad_token_id or 0).items()
    }
    assert batch["has_behaviour_logprobs"].tolist() == [1.0, 1.0]
    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = R3LCausalLMModule.token_logprobs(type("Shim", (), {"lm": lm})(), batch)
    sel = out["selection"]
    behaviour = batch["behaviour_logprobs"][:, 1:][sel]
    sampler = batch["sampler_logprobs"][:, 1:][sel]
    # the sampler's log-probs are the processed ones (constraint, temperature): not comparable
    assert (out["logprobs"] - sampler).abs().mean() > 1e-2
    torch.testing.assert_close(out["logprobs"], behaviour, atol=1e-5, rtol=0)
    adv = torch.ones_like(behaviour)
    _, stats = ca.policy_gradient_loss(
        out["logprobs"],
        adv,
        torch.ones_like(adv),
        old_logprobs=behaviour,
        ratio_mask=torch.ones_like(adv, dtype=torch.bool),
    )
    assert float(stats["mean_ratio"]) == pytest.approx(1.0, abs=1e-5) and float(stats["clip_fraction"]) == 0.0


def _learner(**training):
    from tests.scripted_rllib import build_learner as build

    return build(mixed_precision="none", **training)


def _one_item_batch(learner, tokenizer, behaviour_offset: float):
    """One on-policy item whose behaviour log-probs are the learner's own plus an offset."""
    from rllib_r3l.learner.rl_module import R3LCausalLMModule

    t = make_trajectory(
        [("prompt", 5, 0), ("response", 4, 0), ("prompt", 3, 1), ("response", 3, 1)], reward=1.0, group_id="g"
    )
    b = {k: torch.as_tensor(v) for k, v in collate([t], [1.0], pad_token_id=0).items()}
    with torch.no_grad():
        lp = R3LCausalLMModule.token_logprobs(learner.module["default_policy"], b)["logprobs"]
    sel = b["loss_mask"][:, 1:] > 0
    beh = torch.zeros_like(b["behaviour_logprobs"])
    beh[:, 1:][sel] = lp + behaviour_offset
    b["behaviour_logprobs"] = beh
    b["has_behaviour_logprobs"] = torch.ones(1)
    return b


def _learner_metrics(learner):
    return {k: float(v) for k, v in learner.metrics.reduce()["r3l"]["learner"].items()}


def test_learner_ratio_uses_behaviour_logprobs_and_logs_the_gaps(tiny_model_dir, tokenizer):
    from ray.rllib.core import DEFAULT_MODULE_ID

    learner = _learner(use_importance_ratio=True)
    batch = _one_item_batch(learner, tokenizer, behaviour_offset=0.0)
    learner._update({DEFAULT_MODULE_ID: batch})
    m = _learner_metrics(learner)
    assert m["mean_ratio"] == pytest.approx(1.0, abs=1e-5) and m["clip_fraction"] == 0.0
    assert m["behaviour_logprob_gap_base"] == pytest.approx(0.0, abs=1e-5)
    assert m["sampler_logprob_gap_base"] > 0.1  # hand-made sampler log-probs are -1.0
    far = _one_item_batch(learner, tokenizer, behaviour_offset=1.0)  # stale data: ratio exp(-1)
    learner._update({DEFAULT_MODULE_ID: far})
    m = _learner_metrics(learner)
    assert m["mean_ratio"] == pytest.approx(np.exp(-1.0), rel=1e-4) and m["clip_fraction"] == 1.0


# -- 5. loss scale ------------------------------------------------------------------------------------------
def test_loss_scale_scales_the_gradient(tiny_model_dir, tokenizer):
    from ray.rllib.core import DEFAULT_MODULE_ID

    grads = []
    for scale in (1.0, 0.5):
        learner = _learner(loss_scale=scale, grad_clip=None)
        batch = _one_item_batch(learner, tokenizer, behaviour_offset=0.0)
        learner._update({DEFAULT_MODULE_ID: batch})
        grads.append(torch.cat([p.grad.flatten() for p in learner._params.values() if p.grad is not None]))
    torch.testing.assert_close(grads[1], 0.5 * grads[0], atol=1e-7, rtol=1e-5)
    from rllib_r3l import R3LConfig

    with pytest.raises(ValueError, match="loss_scale"):
        R3LConfig().training(loss_scale=0).validate_r3l()


# -- 6. retries_per_failure > 1 ---------------------------------------------------------------------------
def test_retries_per_failure_keeps_the_group_budget_and_one_reflection_item(tokenizer):
    ex = _explorer(tokenizer, group_size=6, retries_per_failure=2)
    [group] = ex.explore([SEED], ["g"])
    kinds = [t.kind for t in group.trajectories]
    assert kinds.count(Kind.BASE) == 2 and kinds.count(Kind.RETRY) == 4
    assert kinds.count(Kind.BASE) + kinds.count(Kind.RETRY) <= 6
    assert kinds.count(Kind.REFLECTION_SFT) == 2  # one per reflection, not one per successful retry
    assert kinds.count(Kind.RETRY_SFT) == 4
    from rllib_r3l import R3LConfig

    with pytest.raises(ValueError, match="multiple of 1 \\+ retries_per_failure = 3"):
        R3LConfig().training(group_size=8, retries_per_failure=2).validate_r3l()
    R3LConfig().training(group_size=6, retries_per_failure=2).validate_r3l()


# -- 7. an end-of-turn token that is not EOS -----------------------------------------------------------------
@pytest.fixture()
def eot_tokenizer(tokenizer):
    """The SmolLM2 tokenizer with EOS moved off the template's end of turn (as in Gemma: <eos> vs
    <end_of_turn>)."""
    tok = copy.deepcopy(tokenizer)
    tok.eos_token = "<|endoftext|>"
    assert tok.eos_token_id != tok.convert_tokens_to_ids("<|im_end|>")
    return tok


def test_end_of_turn_is_the_templates_not_eos(eot_tokenizer):
    tok = eot_tokenizer
    chat = ChatFormat(tok)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    assert chat.eot_token_id == eot
    assert stop_token_ids(tok)[0] == eot  # a constrained response is closed with the end of turn
    # two turns built from segments equal the template's own rendering, token for token
    sys_text = "Be brief."
    resp = tok.encode("go north", add_special_tokens=False) + [eot]
    ctx = (
        chat.system(sys_text)
        + chat.user_turn(sys_text, "Room 1.", first=True)
        + resp
        + chat.closes_turn(resp)
        + chat.user_turn(sys_text, "Room 2.", first=False)
    )
    msgs = [
        {"role": "system", "content": sys_text},
        {"role": "user", "content": "Room 1."},
        {"role": "assistant", "content": "go north"},
        {"role": "user", "content": "Room 2."},
    ]
    want = tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), add_special_tokens=False)[
        "input_ids"
    ]
    assert ctx == want
    # a truncated response, or one that stopped on EOS, is closed with the end of turn
    assert chat.closes_turn(tok.encode("go", add_special_tokens=False)) == [eot]
    assert chat.closes_turn([5, tok.eos_token_id]) == [eot]


def test_template_without_a_special_end_of_turn_is_rejected(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ValueError, match="not with a special token"):
        ChatFormat(tok)


# -- 8. episodes the runner ends itself ------------------------------------------------------------------------
class PenalisedCorridor(ToyCorridorEnv):
    failure_reward = -0.1  # like WebShop: an unfinished episode is worth -0.1


def test_runner_ended_episodes_get_the_environments_failure_reward(tokenizer):
    chat = ChatFormat(tokenizer)
    backend = ScriptedBackend(tokenizer, pivot=1)
    for max_turns, max_ctx, status in ((2, 4096, Status.TRUNCATED), (6, 160, Status.CONTEXT_OVERFLOW)):
        opts = RolloutOptions(max_turns=max_turns, max_response_tokens=16, max_context_tokens=max_ctx, temperature=1.0)
        runner = EpisodeRunner(backend, chat, lambda: PenalisedCorridor(num_rooms=4), opts)
        [t] = runner.run([EpisodeSpec(seed=SEED, group_id="g")])
        assert t.status == status and not t.success
        assert t.reward == pytest.approx(-0.1)  # before: 0.0


def test_a_retry_with_nothing_after_its_pivot_is_not_paired(tokenizer):
    ex = _explorer(tokenizer)
    base = make_trajectory(
        [("prompt", 3, 0), ("response", 2, 0), ("prompt", 2, 1), ("response", 3, 1)], reward=0.0, group_id="g"
    )
    empty = make_trajectory([("prompt", 3, 0), ("response", 2, 0)], reward=0.0, group_id="g", kind=Kind.RETRY)
    empty.pivot, empty.status = 1, Status.CONTEXT_OVERFLOW
    group = GroupResult(group_id="g", trajectories=[base])
    ex._add_retry(base, empty, group)
    assert group.trajectories == [base] and base.credit_from_turn == 0  # base not masked, no baseline member
    assert ex.counters["retries_empty"] == 1
