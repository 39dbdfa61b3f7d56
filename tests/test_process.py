"""Process supervision (grpo_edu.environment.process, grpo_edu.algorithm.advantages.process_advantages): the chain task and
its step verifier, the per-token advantages against the plain-loop reference and by hand, the loss
with per-token advantages, the config key, and the trainer's plumbing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from grpo_edu.algorithm import reference
from grpo_edu.environment import process, tasks
from grpo_edu.algorithm.advantages import group_advantages, process_advantages
from grpo_edu.training.batch import RolloutBatch
from grpo_edu.config import TrainConfig
from grpo_edu.config.files import read_file
from grpo_edu.algorithm.loss import grpo_loss
from grpo_edu.policy.models import CHAIN_POLICY, char_tokenizer, policy_source

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- the chain task

def test_a_chain_sample_writes_every_partial_sum():
    sample = process.chain_sample([12, 7, 30])
    assert sample == {"prompt": "12+7+30=", "answer": "49", "task": "chain", "numbers": [12, 7, 30],
                      "solution": "<think>12+7=19,19+30=49</think>\\boxed{49}"}
    assert process.chain_steps(sample["solution"], sample["numbers"]) == [(14, 1.0), (23, 1.0)]
    for bad in ([12], [12, -1], [1.5, 2], [True, 2]):
        with pytest.raises(ValueError, match="numbers must be two or more non-negative integers"):
            process.chain_sample(bad)


def test_the_chain_task_is_a_generated_task_with_disjoint_splits():
    train = tasks.make_dataset("chain", 300, "train", seed=0)
    test = tasks.make_dataset("chain", 300, "test", seed=0)
    assert not {s["prompt"] for s in train} & {s["prompt"] for s in test}
    assert all(tasks.split_of(s["prompt"]) == "test" for s in test)
    low, high = process.CHAIN_NUMBER_RANGE
    for sample in train + test:
        assert len(sample["numbers"]) == process.CHAIN_NUMBERS and all(low <= n <= high for n in sample["numbers"])
        assert int(sample["answer"]) == sum(sample["numbers"])
        steps = process.chain_steps(sample["solution"], sample["numbers"])
        assert [reward for _, reward in steps] == [1.0, 1.0]
    assert tasks.make_dataset("chain", 50, "train", seed=1) != tasks.make_dataset("chain", 50, "train", seed=0)
    assert tasks.with_instruction(train[0])["prompt"].startswith(train[0]["prompt"] + "\n")


@pytest.mark.parametrize("text, expected", [
    ("<think>12+7=19,19+30=49</think>\\boxed{49}", [(14, 1.0), (23, 1.0)]),
    ("<think>12+7=20,20+30=50</think>\\boxed{50}", [(14, 0.0), (23, 1.0)]),    # right on its own after a wrong one
    ("<think>12+7=19,19+31=50</think>\\boxed{50}", [(14, 1.0), (23, 0.0)]),    # the wrong number added
    ("<think>12+7=19,18+30=48</think>\\boxed{48}", [(14, 1.0), (23, 0.0)]),    # not the total it wrote
    ("<think>7+12=19,19+30=49</think>\\boxed{49}", [(14, 0.0), (23, 1.0)]),    # the first out of order
    ("<think>12+7=19,19+30=49,49+1=50</think>\\boxed{50}", [(14, 1.0), (23, 1.0), (31, 0.0)]),  # nothing left to add
    ("<think>12+7=19 and then 19+30=49</think>\\boxed{49}", [(14, 1.0), (32, 1.0)]),
    ("<think>49</think>\\boxed{49}", []),                                       # no step
    ("\\boxed{49}", []),                                                        # no reasoning
    ("<think>12+7=19,19+30=4", [(14, 1.0), (22, 0.0)]),                         # cut: reasoning to the end
    ("<think>12+7=19</think>\\boxed{19+30=49}", [(14, 1.0)]),                   # after </think>: not a step
])
def test_each_step_is_judged_on_its_own(text, expected):
    assert process.chain_steps(text, [12, 7, 30]) == expected


def test_a_step_ends_at_the_token_of_its_last_character():
    tokenizer = char_tokenizer()
    text = "<think>12+7=19,19+30=49</think>\\boxed{49}"
    ids = tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
    # "<think>" is one token; "12+7=19" the next 7, its "9" token 7; the second step's last "9" token 16.
    assert process.token_ends(tokenizer, ids, [14, 23]) == [7, 16]
    assert tokenizer.decode(ids[:8]) == "<think>12+7=19" and tokenizer.decode(ids[:17]).endswith("19+30=49")
    assert process.token_ends(tokenizer, ids, []) == []
    with pytest.raises(ValueError, match="past the completion's decoded text"):
        process.token_ends(tokenizer, ids[:5], [14])


def test_completion_steps_put_the_outcome_at_the_last_token():
    tokenizer = char_tokenizer()
    texts = ["<think>12+7=19,19+30=48</think>\\boxed{48}", "<think>49</think>\\boxed{49}"]
    encoded = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    S = max(map(len, encoded)) + 2
    ids = torch.tensor([row + [tokenizer.pad_token_id] * (S - len(row)) for row in encoded])
    mask = torch.tensor([[1] * len(row) + [0] * (S - len(row)) for row in encoded])
    columns = {"task": ["chain", "chain"], "numbers": [[12, 7, 30]] * 2}
    steps = process.completion_steps(texts, columns, tokenizer, ids, mask, torch.tensor([0.5, 1.5]))
    assert steps.mask.tolist() == [[True, True, True], [True, False, False]]
    assert steps.rewards.tolist() == [[1.0, 0.0, 0.5], [1.5, 0.0, 0.0]]
    assert steps.ends[0].tolist() == [7, 16, len(encoded[0]) - 1] and steps.ends[1, 0] == len(encoded[1]) - 1
    assert steps.written.tolist() == [2.0, 0.0] and steps.right.tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="needs a task whose steps a rule checks"):
        process.completion_steps(texts, {"task": ["arithmetic"] * 2}, tokenizer, ids, mask, torch.zeros(2))


# --------------------------------------------------------------------------- the advantages

def _padded(groups: list[list[list[tuple[int, float]]]]):
    """Ragged groups of (end, reward) steps -> (B, G, K) rewards, ends, mask."""
    B, G = len(groups), len(groups[0])
    K = max(1, max(len(c) for g in groups for c in g))
    rewards, ends = torch.zeros(B, G, K, dtype=torch.float64), torch.zeros(B, G, K, dtype=torch.long)
    mask = torch.zeros(B, G, K, dtype=torch.bool)
    for b, group in enumerate(groups):
        for g, completion in enumerate(group):
            for k, (end, reward) in enumerate(completion):
                rewards[b, g, k], ends[b, g, k], mask[b, g, k] = reward, end, True
    return rewards, ends, mask


def test_the_advantages_by_hand():
    """Completion 0: a right step ending at token 1, a wrong one at token 3; completion 1: a right
    one at token 2. R = (1, 0, 1): mean 2/3, population std sqrt(2) / 3, so a right step is
    normalised to +1/sqrt(2), a wrong one to -sqrt(2); each token sums the steps at or after it."""
    groups = [[[(1, 1.0), (3, 0.0)], [(2, 1.0)]]]
    got = process_advantages(*_padded(groups), 5, eps=0.0)
    h = 1 / math.sqrt(2)
    expected = [[h - 2 * h, h - 2 * h, -2 * h, -2 * h, 0.0], [h, h, h, 0.0, 0.0]]
    torch.testing.assert_close(got[0], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-15)
    # Centred only (scale "none"): 1/3 and -2/3.
    got = process_advantages(*_padded(groups), 5, scale="none")
    torch.testing.assert_close(got[0, 1, :3], torch.full((3,), 1 / 3, dtype=torch.float64), rtol=0, atol=1e-15)
    assert got[0, 0, 0].item() == pytest.approx(1 / 3 - 2 / 3, abs=1e-15)


def test_one_step_per_completion_at_its_end_is_outcome_supervision():
    """With its reward at its last token and no other step, every token of a completion gets the
    group advantage of its reward: outcome supervision is the one-step case."""
    rewards = torch.tensor([[1.0, 0.0, 0.5, 1.0], [0.0, 2.0, 1.0, 1.0]], dtype=torch.float64)
    lengths = torch.tensor([[3, 5, 2, 4], [1, 5, 5, 2]])
    got = process_advantages(rewards[..., None], (lengths - 1)[..., None], torch.ones(2, 4, 1, dtype=torch.bool), 5)
    outcome = group_advantages(rewards)
    inside = torch.arange(5) < lengths[..., None]
    torch.testing.assert_close(got[inside], outcome[..., None].expand(-1, -1, 5)[inside], rtol=0, atol=1e-12)
    assert (got[~inside] == 0).all()


HAND_MADE = {
    "different step counts": [[(0, 1.0), (2, 1.0), (4, 0.0)], [(1, 0.0)], [(3, 1.0), (5, 1.0)], [(2, 0.5)]],
    "a completion with no step": [[(1, 1.0), (3, 0.0)], [], [(2, 1.0)], [(4, 0.0), (5, 1.0)]],
    "two steps ending at one token": [[(2, 1.0), (2, 0.0), (4, 1.0)], [(3, 0.0)], [(1, 1.0)], [(5, 0.0)]],
    "equal rewards everywhere": [[(1, 1.0), (3, 1.0)], [(2, 1.0)], [(0, 1.0)], [(5, 1.0)]],
    "one step in the whole group": [[(3, 1.0)], [], [], []],
    "no step at all": [[], [], [], []],
    "tied rewards, not all equal": [[(1, 1.0), (2, 1.0)], [(1, 0.0)], [(2, 0.0)], [(3, 1.0)]],
}


@pytest.mark.parametrize("std", ["population", "sample"])
@pytest.mark.parametrize("name", list(HAND_MADE))
def test_the_advantages_equal_the_plain_loop_on_hand_made_groups(name, std):
    group = HAND_MADE[name]
    lengths = [6, 4, 6, 6]
    expected = reference.process_advantages(group, lengths, std=std)
    got = process_advantages(*_padded([group, group[::-1]]), 6, std=std)
    for g, length in enumerate(lengths):
        np.testing.assert_allclose(got[0, g, :length].numpy(), expected[g], rtol=0, atol=1e-12)
    for g, length in enumerate(lengths[::-1]):   # the second prompt: the same group reversed, on its own
        np.testing.assert_allclose(got[1, g, :length].numpy(), expected[3 - g], rtol=0, atol=1e-12)
    if name in ("equal rewards everywhere", "one step in the whole group", "no step at all"):
        assert (got == 0).all()   # no signal: exactly 0, as group_advantages' all-equal groups


@st.composite
def step_groups(draw):
    G, S = draw(st.integers(2, 5)), draw(st.integers(1, 8))
    values = st.sampled_from([0.0, 0.5, 1.0, 1.5]) | st.floats(-3, 3, allow_nan=False)
    group = [draw(st.lists(st.tuples(st.integers(0, S - 1), values), max_size=4)) for _ in range(G)]
    return group, S


@settings(max_examples=150, deadline=None)
@given(step_groups(), st.sampled_from(["population", "sample"]), st.sampled_from(["group", "none"]))
def test_the_advantages_equal_the_plain_loop_on_any_group(case, std, scale):
    group, S = case
    expected = reference.process_advantages(group, [S] * len(group), std=std, scale_by_std=scale == "group")
    got = process_advantages(*_padded([group]), S, std=std, scale=scale)
    np.testing.assert_allclose(got[0].numpy(), np.stack(expected), rtol=1e-9, atol=1e-9)
    # After a completion's last step its tokens get nothing; a group's normalised rewards sum to 0
    # (centred), so the first tokens' advantages (each completion's whole sum) do too.
    for g, completion in enumerate(group):
        last = max((end for end, _ in completion), default=-1)
        assert (got[0, g, last + 1:] == 0).all()
    assert abs(float(got[0, :, 0].sum())) <= 1e-6 * max(1.0, float(got.abs().max()))


def test_bad_steps_are_refused_in_one_line():
    rewards, ends, mask = _padded([HAND_MADE["different step counts"]])
    with pytest.raises(ValueError, match=r"step_ends must lie in \[0, length = 5\).*got 5"):
        process_advantages(rewards, ends, mask, 5)
    with pytest.raises(ValueError, match="must have one shape"):
        process_advantages(rewards, ends[..., :1], mask, 6)
    with pytest.raises(ValueError, match="G >= 2"):
        process_advantages(rewards[:, :1], ends[:, :1], mask[:, :1], 6)
    with pytest.raises(ValueError, match="finite"):
        process_advantages(rewards.masked_fill(mask, math.nan), ends, mask, 6)
    with pytest.raises(ValueError, match="scale must be one of"):
        process_advantages(rewards, ends, mask, 6, scale="batch")
    with pytest.raises(TypeError, match="step_mask must be bool"):
        process_advantages(rewards, ends, mask.long(), 6)
    with pytest.raises(ValueError, match="length"):
        process_advantages(rewards, ends, mask, 0)
    # A masked-out slot's reward and end are never read (NaN and out of range there are fine).
    loose = process_advantages(rewards.masked_fill(~mask, math.nan), ends.masked_fill(~mask, 99), mask, 6)
    assert torch.equal(loose, process_advantages(rewards, ends, mask, 6))


def test_token_ends_hold_for_a_tokenizer_whose_tokens_are_not_characters():
    """A byte-level BPE splits a character into several tokens: the prefix lengths are then every
    prefix decoded, and a step still ends at the token that completes its last character."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab={chr(c): i for i, c in enumerate(range(33, 127))} | {"Ã": 94, "©": 95},
                                   merges=[], unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    text = "é1+2=3"   # é is two byte-level tokens, Ã then ©
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == 7 and tokenizer.decode(ids) == text
    assert process.prefix_lengths(tokenizer, ids) == [0, 1, 2, 3, 4, 5, 6]   # no é until its second token
    assert process.token_ends(tokenizer, ids, [6, 1]) == [6, 1]


# --------------------------------------------------------------------------- the loss

def _loss_batch(seed: int, B: int = 2, G: int = 4, S: int = 7):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, S + 1, (B, G), generator=gen)
    mask = torch.arange(S) < lengths[..., None]
    logp = -3 * torch.rand(B, G, S, generator=gen)
    old = (logp + 0.25 * torch.randn(B, G, S, generator=gen)).clamp(max=0)
    ref = (logp + 0.25 * torch.randn(B, G, S, generator=gen)).clamp(max=0)
    return logp, old, ref, mask


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_per_token_advantages_equal_to_a_completion_are_the_completions_loss(loss_type):
    """A (B, G, S) advantage that is the same at every token of a completion gives bitwise the
    (B, G) loss and gradient: per-token advantages generalise, they do not change the loss."""
    logp, old, ref, mask = _loss_batch(0)
    advantages = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    losses, grads = [], []
    for A in (advantages, advantages[..., None].expand(-1, -1, 7).contiguous()):
        x = logp.clone().requires_grad_()
        out = grpo_loss(x, old, A, mask, ref_logp=ref, beta=0.04, loss_type=loss_type, max_completion_length=9)
        losses.append(out)
        grads.append(torch.autograd.grad(out.loss, x)[0])
    assert torch.equal(losses[0].loss, losses[1].loss) and torch.equal(grads[0], grads[1])
    assert losses[0].metrics["clip_ratio/region"] == losses[1].metrics["clip_ratio/region"]


def test_per_token_advantages_weigh_each_token_by_its_own():
    """The policy gradient at token t is -A_t d(ratio)/d logp (inside the clip): zeroing the advantage of
    one token zeroes its gradient and no other's."""
    logp, old, ref, mask = _loss_batch(2)
    old = logp.detach().clone()   # ratio 1: nothing clipped
    A = torch.randn(2, 4, 7, generator=torch.Generator().manual_seed(3))
    x = logp.clone().requires_grad_()
    grad = torch.autograd.grad(grpo_loss(x, old, A, mask).loss, x)[0]
    lengths = mask.sum(-1)
    expected = torch.where(mask, -A / (8 * lengths[..., None]), torch.zeros(()))   # grpo: 1 / (n |o_i|)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-7)


def test_per_token_advantages_are_refused_at_the_sequence_level_and_in_the_wrong_shape():
    logp, old, _, mask = _loss_batch(0)
    with pytest.raises(ValueError, match="need importance_sampling_level = 'token'"):
        grpo_loss(logp, old, torch.zeros(2, 4, 7), mask, importance_sampling_level="sequence")
    with pytest.raises(ValueError, match=r"advantages must have shape \(B, G\) = \(2, 4\) \(one per completion\) or "
                                         r"logp's shape \(2, 4, 7\)"):
        grpo_loss(logp, old, torch.zeros(2, 4, 6), mask)


def test_zero_std_groups_counts_the_groups_whose_token_advantages_are_all_zero():
    logp, old, _, mask = _loss_batch(0)
    A = torch.randn(2, 4, 7)
    A[1] = 0.0
    A[0, :, 0] = torch.where(mask[0, :, 0], A[0, :, 0], 0.0)
    out = grpo_loss(logp, old, A, mask)
    assert out.metrics["zero_std_groups"] == 0.5
    assert out.metrics["advantage/std"] == pytest.approx(float(A[mask].std(correction=0)), abs=1e-7)


def test_a_rollout_batch_holds_per_token_advantages():
    B, G, P, S = 1, 2, 2, 3
    ids = torch.ones(B, G, P + S, dtype=torch.long)
    mask = torch.ones(B, G, S, dtype=torch.long)
    fields = dict(input_ids=ids, attention_mask=torch.ones_like(ids), completion_mask=mask, old_logp=None,
                  rewards=torch.zeros(B, G))
    batch = RolloutBatch(**fields, advantages=torch.zeros(B, G, S))
    assert batch.rows(slice(0, 2)).advantages.shape == (2, S)
    with pytest.raises(ValueError, match=r"advantages must have shape \(B, G\) = \(1, 2\) or, one per token"):
        RolloutBatch(**fields, advantages=torch.zeros(B, G, S + 1))
    with pytest.raises(ValueError, match="advantages must be finite"):
        RolloutBatch(**fields, advantages=torch.full((B, G, S), math.inf))


# --------------------------------------------------------------------------- the config key

def test_the_chain_config_is_the_cpu_tier_but_for_its_chain_keys():
    tiny, chain = (TrainConfig.from_toml(ROOT / "configs" / name).to_dict() for name in ("cpu-tiny.toml", "cpu-chain.toml"))
    differ = {key for key in tiny if tiny[key] != chain[key]}
    own, base = read_file(ROOT / "configs" / "cpu-chain.toml")   # what the file says it changes
    assert base == "cpu-tiny.toml" and differ == set(own) == {"model", "task", "rewards", "max_completion_length", "supervision", "steps",
                                "eval_every", "output_dir"}
    assert chain["rewards"] == {"accuracy": 1.0}
    longest = process.chain_sample([process.CHAIN_NUMBER_RANGE[1]] * process.CHAIN_NUMBERS)
    assert len(char_tokenizer()(longest["solution"])["input_ids"]) + 1 <= chain["max_completion_length"]
    assert policy_source("chain-start") == CHAIN_POLICY


@pytest.mark.parametrize("override, message", [
    (["task=arithmetic"], r"'supervision' = 'process' needs a task whose steps a rule checks \('chain',\), got "
                          r"task = 'arithmetic'"),
    (["advantage_fn=mod:fn"], r"keys 'supervision' \('process'\) and 'advantage_fn' \('mod:fn'\) do not combine"),
    (["advantage_scale=batch"], r"and 'advantage_scale' \('batch'\) do not combine"),
    (["importance_sampling_level=sequence"], r"and 'importance_sampling_level' \('sequence'\) do not combine"),
    (["filter_zero_std_groups=true"], r"and 'filter_zero_std_groups' \(True\) do not combine"),
    (["dynamic_sampling_rounds=2"], r"and 'dynamic_sampling_rounds' \(2\) do not combine"),
    (["environment=grpo_edu.training.episodes:Calculator"], r"and 'environment' \('grpo_edu.training.episodes:Calculator'\) do not"),
    (["supervision=steps"], r"config key 'supervision' must be one of \('outcome', 'process'\), got 'steps'"),
])
def test_process_supervision_refuses_what_it_cannot_combine_with(override, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_toml(ROOT / "configs" / "cpu-chain.toml", override)
    assert TrainConfig.from_toml(ROOT / "configs" / "cpu-chain.toml", ["supervision=outcome", *override[:0]])


# --------------------------------------------------------------------------- the trainer

def _captured_run(tmp_path, supervision: str, steps: int = 2, extra: tuple = ()):
    """A short cpu-chain run; every batch and plan the update received."""
    from grpo_edu.training import trainer

    seen = []
    original = trainer.optimise

    def spy(config, settings, models, optimizer, scheduler, batch, plan, world):
        seen.append((batch, plan))
        return original(config, settings, models, optimizer, scheduler, batch, plan, world)

    config = TrainConfig.from_toml(ROOT / "configs" / "cpu-chain.toml", [
        f"supervision={supervision}", f"steps={steps}", "prompts_per_step=4", "eval_size=16", "eval_every=1000",
        "checkpoint_every=0", f"output_dir={json.dumps(str(tmp_path / supervision))}", "progress=false", *extra])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer, "optimise", spy)
        result = trainer.train(config, log=lambda line: None)
    return config, result, seen


def test_the_trainer_trains_on_every_tokens_process_advantage(tmp_path):
    """The batch the update gets holds, per token, the advantages the plain loop computes from the
    completions' steps (each step's text ending at its token), and the plan each completion's
    first-token advantage and step counts; the logged step metrics are theirs."""
    from grpo_edu.policy.models import load_policy

    config, result, seen = _captured_run(tmp_path, "process")
    _, tokenizer = load_policy(CHAIN_POLICY)
    batch, plan = seen[0]
    B, G, S = batch.completion_mask.shape
    assert batch.advantages.shape == (B, G, S) and batch.advantages.dtype == torch.float32
    lengths = batch.completion_mask.sum(-1)
    for b in range(B):
        steps = []
        for g in range(G):
            ids = batch.completion_ids[b, g, :lengths[b, g]].tolist()
            text = tokenizer.decode(ids, skip_special_tokens=True)
            numbers = [int(n) for n in tokenizer.decode(batch.input_ids[b, g, :batch.prompt_length],
                                                         skip_special_tokens=True).rstrip("=").split("+")]
            found = process.chain_steps(text, numbers)
            ends = process.token_ends(tokenizer, ids, [end for end, _ in found])
            for (char_end, _), end in zip(found, ends):   # the step's text ends at its token
                assert tokenizer.decode(ids[:end + 1], skip_special_tokens=True) == text[:char_end]
            steps.append([*zip(ends, (r for _, r in found)), (int(lengths[b, g]) - 1, float(batch.rewards[b, g]))])
        expected = reference.process_advantages(steps, [S] * G)
        np.testing.assert_allclose(batch.advantages[b].double().numpy(), np.stack(expected), rtol=0, atol=1e-6)
        assert plan.process["steps"][b].tolist() == [len(s) - 1 for s in steps]
        assert plan.process["steps_right"][b].tolist() == [sum(r for _, r in s[:-1]) for s in steps]
    torch.testing.assert_close(plan.advantages, batch.advantages[..., 0])
    first = result.history[0]
    written = float(plan.process["steps"].sum())
    assert first["process/steps"] == pytest.approx(float(plan.process["steps"].mean()))
    assert first["process/step_accuracy"] == pytest.approx(float(plan.process["steps_right"].sum()) / written)
    assert "advantage/tie_spread" not in first and 0 < first["process/step_accuracy"] < 1


def test_the_supervision_key_changes_what_trains(tmp_path):
    """The same run, seed and rollouts: outcome supervision trains on (B, G) advantages (each
    completion's reward in its group), process supervision on per-token ones, and the first
    update differs; their rewards (the same completions) do not."""
    _, outcome, seen_outcome = _captured_run(tmp_path, "outcome", steps=1)
    _, process_run, seen_process = _captured_run(tmp_path, "process", steps=1)
    (batch_o, plan_o), (batch_p, plan_p) = seen_outcome[0], seen_process[0]
    assert torch.equal(batch_o.input_ids, batch_p.input_ids) and torch.equal(plan_o.rewards, plan_p.rewards)
    torch.testing.assert_close(batch_o.advantages, group_advantages(plan_o.rewards).float())
    assert batch_p.advantages.ndim == 3
    # The steps are counted (and logged) either way: the same completions, the same counts.
    assert plan_o.process.keys() == plan_p.process.keys() == {"steps", "steps_right"}
    assert all(torch.equal(plan_o.process[k], plan_p.process[k]) for k in plan_o.process)
    assert outcome.history[0]["process/step_accuracy"] == process_run.history[0]["process/step_accuracy"]
    assert "advantage/tie_spread" in outcome.history[0] and "advantage/tie_spread" not in process_run.history[0]
    assert outcome.history[0]["loss"] != process_run.history[0]["loss"]
    weights = [dict(r.policy.named_parameters()) for r in (outcome, process_run)]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_a_lagged_process_rollout_keeps_its_token_advantages_through_a_checkpoint(tmp_path):
    """rollout_lag: the rollout in flight (its per-token advantages, its plan's step counts) is
    checkpointed and resumed bitwise."""
    from grpo_edu.training import trainer

    config = TrainConfig.from_toml(ROOT / "configs" / "cpu-chain.toml", [
        "steps=3", "prompts_per_step=4", "eval_size=16", "eval_every=1000", "rollout_lag=1", "checkpoint_every=0",
        f"output_dir={json.dumps(str(tmp_path / 'whole'))}", "progress=false"])
    whole = trainer.train(config, log=lambda line: None)
    config.logging.output_dir = str(tmp_path / "stopped")
    trainer.train(config, stop_after=2, log=lambda line: None)
    resumed = trainer.train(config, resume=config.logging.output_dir, log=lambda line: None)
    for name, value in whole.policy.named_parameters():
        assert torch.equal(value, dict(resumed.policy.named_parameters())[name]), name
    assert [m["loss"] for m in whole.history] == [m["loss"] for m in resumed.history]
    record = json.loads((tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()[1])
    assert "process/step_accuracy" in record


# --------------------------------------------------------------------------- benchmarks/process.py

import sys  # noqa: E402

import grid_checks  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "process.json"
sys.path.insert(0, str(ROOT / "benchmarks"))
import process as benchmark  # noqa: E402  (benchmarks/process.py)


def test_the_results_file_holds_every_variant_and_seed_and_every_run_learned():
    stored = grid_checks.results(RESULTS)
    assert stored["config"] == "cpu-chain.toml"
    for run in grid_checks.every_variant_and_seed(RESULTS, benchmark, eval_every=25):
        assert run["final_accuracy"] > run["start_accuracy"] + 0.05, (run["variant"], run["seed"])
        steps_right = run["steps"]["process/step_accuracy"]
        assert len(steps_right) == stored["steps"] and all(0 <= v <= 1 for v in steps_right)


@grid_checks.PINNED
def test_the_results_file_is_what_the_trainer_computes():
    """Re-train process, seed 0, for 2 steps under the pin."""
    grid_checks.reproduces("process.py", RESULTS, "process:0", 2)


def test_a_changed_step_accuracy_is_caught():
    grid_checks.catches_a_change(RESULTS, benchmark, "process", 0, 2, "process/step_accuracy",
                                 lambda value: value + 1e-9)


def test_the_training_doc_quotes_the_results_file():
    grid_checks.training_doc_quotes_final_accuracies(RESULTS, benchmark)


def test_the_training_doc_says_what_the_paired_comparison_shows():
    """docs/training.md's verdicts are paired_seeds' on the results file: the final accuracies are
    not separated at this size, the share of right steps is."""
    from grpo_edu.algorithm.statistics import paired_seeds

    runs = sorted(grid_checks.results(RESULTS)["runs"], key=lambda r: r["seed"])
    by = {v: [r for r in runs if r["variant"] == v] for v in ("process", "outcome")}
    final = paired_seeds(*([r["final_accuracy"] for r in by[v]] for v in ("process", "outcome")))
    steps = paired_seeds(*([float(np.mean(r["steps"]["process/step_accuracy"][-25:])) for r in by[v]]
                           for v in ("process", "outcome")))
    readme = " ".join(grid_checks.TRAINING_DOC.read_text().split())
    assert not final.separated and steps.separated and steps.low > 0
    assert (f"not separated at this size (paired by seed, process - outcome = {final.difference:+.3f} "
            f"[{final.low:+.3f}, {final.high:+.3f}]") in readme
    assert f"right steps more often ({steps.difference:+.3f} [{steps.low:+.3f}, {steps.high:+.3f}]" in readme
    assert "ahead in every seed" not in readme


# --------------------------------------------------------------------------- the committed chain policy and TRL

def test_the_committed_chain_policy_is_packaged_and_matches_its_model_card():
    """The card's greedy figures, recomputed from the weights on its 1,000 held-out problems; a policy
    often wrong, whose samples disagree: room for GRPO."""
    import tomllib

    from grpo_edu.training.evaluation import evaluate
    from grpo_edu.policy.models import load_policy

    files = {p.name: p.stat().st_size for p in CHAIN_POLICY.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "pretrain.json"} <= set(files)
    assert sum(files.values()) <= 2 * 2 ** 20
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "assets/tiny-chain-start/*" in package_data["grpo_edu"]
    log = json.loads((CHAIN_POLICY / "pretrain.json").read_text())
    card = (CHAIN_POLICY / "README.md").read_text()
    model, tokenizer = load_policy(CHAIN_POLICY)
    got = evaluate(model, tokenizer, tasks.make_dataset("chain", 1000, "test", seed=0), max_new_tokens=32)
    for key in ("greedy_accuracy", "greedy_format"):
        # Equal up to an argmax flipped by float rounding on another CPU (1 of 1,000).
        assert got[key] == pytest.approx(log["held_out"][key], abs=1.5 / 1000), key
    assert f"| greedy accuracy | {log['held_out']['greedy_accuracy']:.4f} |" in card
    assert f"training stopped at step {log['steps']}" in card and log["config"]["task"] == "chain"
    assert 0.2 <= log["held_out"]["greedy_accuracy"] <= 0.5 and log["held_out"]["mixed_groups"] >= 0.5


def test_the_trl_bridge_refuses_process_supervision():
    from grpo_edu.commands import trl_bridge

    config = TrainConfig.from_toml(ROOT / "configs" / "cpu-chain.toml", ["advantage_std=sample"])
    with pytest.raises(ValueError, match="supervision = 'process': TRL 1.16's GRPOTrainer computes one advantage per "
                                         "completion"):
        trl_bridge.grpo_config(config)
