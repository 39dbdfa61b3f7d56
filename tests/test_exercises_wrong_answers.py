"""Every exercise's checker rejects a plausible wrong answer (the mistakes a learner makes:
dividing by G instead of G - 1, forgetting a factor N, comparing ties across groups, ...),
and its report says what is wrong without printing the right value.

Each test feeds one wrong answer, collects the right values the checker compared against
(checker_support.expected_values spies on checking.compare), and asserts that the report
prints none of them; label and quiz exercises assert the same of their right labels and
numbers. test_every_exercise_has_a_wrong_answer_test keeps the list complete."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from checker_support import all_values, assert_rejected_without_answer, expected_values
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.training.episodes import Reply
from grpo_edu.exercises import ch00, ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10, ch11, ch12, ch13, ch14
from grpo_edu.algorithm.loss import grpo_loss

COVERED: set[str] = set()


def covers(number: str):
    """Mark a test as the wrong-answer test of exercise `number`."""
    COVERED.add(number)
    return lambda test: test


def rejected(check, answer, *args, words=()):
    """Run `check(answer, *args)`; it must fail and print none of the values it compared with."""
    with expected_values() as seen:
        result = check(answer, *args)
    return assert_rejected_without_answer(result, all_values(seen), words)


# --------------------------------------------------------------------------- chapter 0

@covers("0.1")
def test_rloo_dividing_by_G_instead_of_G_minus_1():
    def by_G(rewards):
        G = rewards.shape[1]
        return rewards - (rewards.sum(dim=1, keepdim=True) - rewards) / G
    report = rejected(ch00.check_rloo, by_G)
    assert "an all-equal group" in report and "element" in report


@covers("0.2")
def test_exact_mean_forgetting_the_groups_probabilities():
    import itertools

    def unweighted(probs, rewards, G, advantage_fn):
        K = len(probs)
        actions = np.array(list(itertools.product(range(K), repeat=G)))
        r = rewards[actions]
        A = r if advantage_fn is None else advantage_fn(torch.from_numpy(r)).numpy()
        return (A[..., None] * (np.eye(K)[actions] - probs)).mean(axis=1).mean(axis=0)   # every group alike
    rejected(ch00.check_exact_mean, unweighted)


# --------------------------------------------------------------------------- chapter 1

@covers("1.1")
def test_group_advantages_population_std_for_both():
    report = rejected(ch01.check_group_advantages, lambda r, std: (r - r.mean()) / (r.std() + 1e-8))
    assert "std='sample'" in report and "std='population'" not in report
    assert "all off by the same factor" in report          # sqrt(G / (G - 1)): the std's divisor


@covers("1.2")
def test_clip_predictions_ignoring_the_advantages_sign():
    predictions = [not 0.8 <= rho <= 1.2 for rho, _ in ch01.CLIP_QUIZ]   # "outside the range clips"
    result = ch01.check_clip_predictions(predictions)
    report = assert_rejected_without_answer(result)
    assert "ratio=" not in report and "True" not in report and "False" not in report   # no pair named


@covers("1.3")
def test_k3_with_the_log_ratio_the_wrong_way_round():
    def swapped(log_ref, log_new):
        d = np.asarray(log_new) - np.asarray(log_ref)
        return np.exp(d) - d - 1
    report = rejected(ch01.check_k3, swapped)
    assert "identical policies" not in report


# --------------------------------------------------------------------------- chapter 2

@covers("2.1")
def test_batch_advantages_subtracting_the_batch_mean():
    def batch_mean(rewards, scale):
        if scale == "batch":
            return (rewards - rewards.mean()) / (rewards.std() + 1e-8)
        return group_advantages(rewards, scale=scale)
    report = rejected(ch02.check_batch_advantages, batch_mean)
    assert "scale='batch'" in report and "scale='group'" not in report


@covers("2.2")
def test_clip_gradient_zero_outside_the_range_whatever_the_sign():
    rejected(ch02.check_clip_gradient,
             lambda ratio, a, low, high: np.where((ratio >= 1 - low) & (ratio <= 1 + high), a, 0.0))


@covers("2.3")
def test_expected_estimates_forgetting_k2s_half():
    def no_half(logits, ref_logits):
        p, q = np.exp(logits) / np.exp(logits).sum(), np.exp(ref_logits) / np.exp(ref_logits).sum()
        d = np.log(q) - np.log(p)
        return [np.sum(p * -d), np.sum(p * d * d), np.sum(p * (np.exp(d) - 1 - d))]
    report = rejected(ch02.check_expected_estimates, no_half)
    assert "element 1 is too large" in report


@covers("2.4")
def test_response_weights_forgetting_dr_grpos_G():
    def forgot_G(lengths, loss_type, max_length):
        lengths = np.asarray(lengths, dtype=np.float64)
        G = len(lengths)
        return {"grpo": np.full(G, 1 / G), "dr_grpo": lengths / max_length,
                "dapo": lengths / lengths.sum()}[loss_type]
    report = rejected(ch02.check_response_weights, forgot_G)
    assert "loss_type='dr_grpo'" in report and "all off by the same factor" in report


# --------------------------------------------------------------------------- chapter 3

@covers("3.1")
def test_completion_logprobs_off_by_one_column():
    def unshifted(logits, ids, S):
        return torch.log_softmax(logits[:, -S:], -1).gather(-1, ids[:, -S:, None]).squeeze(-1)
    report = rejected(ch03.check_completion_logprobs, unshifted)
    assert "off by one column" in report and "-S - 1" not in report   # the fix is the reader's


@covers("3.2")
def test_masked_loss_averaging_over_all_tokens():
    def batch_mean(logp, old_logp, advantages, mask, epsilon):   # bnpo's token mean, not grpo's
        ratio = torch.exp(torch.where(mask, logp - old_logp, torch.zeros_like(logp)))
        objective = torch.minimum(ratio * advantages[:, None],
                                  ratio.clamp(1 - epsilon, 1 + epsilon) * advantages[:, None])
        return -(objective * mask).sum() / mask.sum()
    report = rejected(ch03.check_masked_grpo_loss, batch_mean)
    assert "padding holding ordinary numbers" in report


@covers("3.3")
def test_first_step_gradient_forgetting_the_1_over_N():
    def no_N(advantages, mask):
        lengths = mask.sum(-1, keepdim=True).to(advantages.dtype)
        return torch.where(mask, -advantages[:, None] / lengths, torch.zeros_like(mask, dtype=advantages.dtype))
    report = rejected(ch03.check_first_step_gradient, no_N)
    assert "all off by the same factor" in report


# --------------------------------------------------------------------------- chapter 4

@covers("4.1")
def test_token_weights_forgetting_dr_grpos_N():
    def forgot_N(lengths, loss_type, max_length):
        lengths = torch.as_tensor(lengths, dtype=torch.float64)
        if loss_type == "grpo":
            return 1 / (len(lengths) * lengths)
        if loss_type == "bnpo":
            return torch.full_like(lengths, 1 / lengths.sum().item())
        return torch.full_like(lengths, 1 / max_length)
    report = rejected(ch04.check_token_weights, forgot_N)
    assert all(line.strip().startswith("- dr_grpo") for line in report.splitlines()[1:])


@covers("4.2")
def test_informative_groups_with_a_std_threshold():
    report = rejected(ch04.check_informative_groups, lambda r: r.std(dim=1) > 1e-3)
    assert "partial-credit" in report and "wrong at element 0" in report


@covers("4.3")
def test_sequence_ratio_averaging_over_the_padding():
    rejected(ch04.check_sequence_ratio, lambda logp, old, mask: torch.exp((logp - old).mean(-1)))


# --------------------------------------------------------------------------- chapter 5

@covers("5.1")
def test_strict_format_with_match_instead_of_fullmatch():
    from grpo_edu.environment import rewards
    pattern = re.compile(r"<think>-?\d+</think>\\boxed\{-?\d+\}")
    report = rejected(ch05.check_strict_format,
                      lambda completions, **kw: [1.0 if pattern.match(rewards.completion_text(c)) else 0.0
                                                 for c in completions])
    assert "a leading zero" in report and "accepted (1.0) a completion the rule rejects" in report


@covers("5.2")
def test_reward_model_hack_that_is_right_after_all():
    from grpo_edu.policy.models import char_tokenizer
    weights = np.zeros(len(ch05.FEATURES) + 1)
    weights[ch05.FEATURES.index("9")] = 0.1
    model = ch05.CharacterRewardModel(weights=weights, bias=0.0)
    problem = {"prompt": "90+9=", "answer": "99"}
    result = ch05.check_reward_model_hack("<think>9</think>\\boxed{99}", model, problem, 0.1, char_tokenizer())
    report = assert_rejected_without_answer(result)
    assert "it is wrong for 90+9= (answer 99): does not hold" in report


@covers("5.3")
def test_countdown_verifier_ignoring_the_numbers():
    from grpo_edu.environment import rewards
    from grpo_edu.environment.tasks import ExpressionError, evaluate_expression

    def value_only(completions, numbers, target, **kw):
        scores = []
        for completion, goal in zip(completions, target):
            expression = rewards.last_boxed(rewards.completion_text(completion))
            try:
                scores.append(float(expression is not None and evaluate_expression(expression) == goal))
            except ExpressionError:
                scores.append(0.0)
        return scores
    report = rejected(ch05.check_countdown_reward, value_only)
    assert "a number used twice" in report and "accepted (1.0)" in report


# --------------------------------------------------------------------------- chapter 6

@covers("6.1")
def test_advantage_function_with_the_batch_mean():
    report = assert_rejected_without_answer(ch06.check_advantage_function(lambda r: r - r.mean()))
    assert "group means should be 0" in report


@covers("6.2")
def test_diagnoses_all_healthy():
    wrong = {run: "healthy" for run in ch06.RUNS}
    report = assert_rejected_without_answer(ch06.check_diagnoses(wrong),
                                            words=[d for d in ch06.DIAGNOSES.values() if d != "healthy"])
    assert report.count("not healthy") == 3


# --------------------------------------------------------------------------- chapter 7

@covers("7.1")
def test_mystery_runs_all_healthy_reveals_no_key():
    wrong = {run: "healthy" for run in ch07.mystery_runs()}
    broken = [ch07.MYSTERY_RUNS[name][0] for name in ch07._answer_key().values() if name != "healthy"]
    report = assert_rejected_without_answer(ch07.check_mystery_runs(wrong), words=broken)
    assert report.count("not healthy") == 3


@covers("7.2")
def test_tie_spread_comparing_ties_across_groups():
    def across_groups(rewards, advantages):
        r, a = rewards.reshape(-1), advantages.reshape(-1)
        return max(float(a[r == v].max() - a[r == v].min()) for v in r.unique())
    report = rejected(ch07.check_tie_spread, across_groups)
    assert "6 random groups of 8, whole" in report and "too large" in report


# --------------------------------------------------------------------------- chapter 8

@covers("8.1")
def test_overlong_punishment_not_bounded_past_the_limit():
    def unbounded(lengths, L, c):
        return (-(lengths.to(torch.float64) - (L - c)) / c).clamp(max=0.0)
    report = rejected(ch08.check_overlong_punishment, unbounded)
    assert "past the limit" in report and "element 2 is too small" in report


@covers("8.2")
def test_entropy_mask_with_the_quantile_over_the_padding():
    def over_padding(entropies, mask, q):
        tau = torch.quantile(entropies.flatten(), 1 - q).item()
        return tau, (entropies >= tau) & mask
    report = rejected(ch08.check_entropy_mask, over_padding)
    assert "padding holding 9.0: tau: is too large" in report


def test_entropy_mask_with_a_strict_comparison_fails_the_ties():
    def strict(entropies, mask, q):
        tau = torch.quantile(entropies[mask], 1 - q).item()
        return tau, (entropies > tau) & mask
    report = rejected(ch08.check_entropy_mask, strict)
    assert "ties at the threshold, q = 0.5: keep" in report


# --------------------------------------------------------------------------- chapter 9

@covers("9.1")
def test_read_format_that_counts_any_bang_as_a_check():
    """The chapter's first attempt: a '!' anywhere is a check, and the tail is never read."""
    import re

    def any_bang(completion):
        if "!" in completion:
            return "check"
        if not completion.startswith("<think>") or "</think>" not in completion:
            return "other"
        reasoning, _, rest = completion[len("<think>"):].partition("</think>")
        if reasoning == "":
            return "direct"
        return "worked" if re.fullmatch(r"(?:[a-z]\d\d)+", reasoning) else "other"
    report = rejected(ch09.check_read_format, any_bang)
    assert "a '!' in the answer, not in the reasoning" in report and "got 'check'" in report
    assert "no boxed answer" in report


@covers("9.2")
def test_expected_length_without_the_check_tokens():
    report = rejected(ch09.check_expected_length, lambda d, w, c, depths: 6 + 3 * (depths[0] + depths[1]) / 2 * (w + c))
    assert "only checks, depth 5 alone" in report


# --------------------------------------------------------------------------- chapter 10

@covers("10.1")
def test_rank_rows_split_evenly():
    def even_rows(B, G, world_size, rank):
        n = B * G // world_size
        return list(range(rank * n, (rank + 1) * n))
    report = assert_rejected_without_answer(ch10.check_rank_rows(even_rows))
    assert "split prompt 1's 4 completions across ranks [0, 1]" in report


@covers("10.2")
def test_rank_loss_without_the_world_size_factor():
    def without_factor(logp, old_logp, advantages, mask, token_counts, completion_counts, loss_type, L):
        return grpo_loss(logp, old_logp, advantages, mask, loss_type=loss_type, max_completion_length=L,
                         num_items=sum(token_counts), num_completions=sum(completion_counts)).loss
    report = assert_rejected_without_answer(ch10.check_rank_loss(without_factor))
    assert "1/2 of the 1-process gradient" in report and "1/3 of the 1-process gradient" in report


@covers("10.3")
def test_step_numbers_typed_in_for_one_quiz():
    typed = dict(ch10.scale_answers())      # right for SCALE_QUIZ, typed in

    result = ch10.check_scale_answers(lambda quiz: dict(typed), seed=5)
    right = [v for k in (1, 2) for v in ch10.scale_answers(ch10.random_quiz(10 + k)).values()]
    report = assert_rejected_without_answer(result)
    assert result.passed == 1 and "ch10.random_quiz(11)" in report
    for value in right:
        if value >= 100:
            assert f"{value:,}" not in report and str(value) not in report

    def ddp_bytes(quiz):                      # a whole replica per rank: DDP's, not FSDP2's shard
        answers = ch10.scale_answers(quiz)
        answers["fsdp2_bytes_per_rank"] *= quiz["world_size"]
        return answers
    report = assert_rejected_without_answer(ch10.check_scale_answers(ddp_bytes, seed=0))
    assert "a whole copy on every rank (DDP's)" in report and "3,000,000,000" not in report


def test_scale_quizzes_change_at_every_call_and_repeat_from_a_seed():
    def names(result):
        return re.findall(r"ch10\.random_quiz\(\d+\)", str(result))
    first, second = (ch10.check_scale_answers(lambda quiz: {}) for _ in range(2))
    assert names(first) and set(names(first)).isdisjoint(names(second))
    assert str(ch10.check_scale_answers(lambda quiz: {}, seed=3)) == str(ch10.check_scale_answers(
        lambda quiz: {}, seed=3))
    assert ch10.check_scale_answers(ch10.scale_answers)


# --------------------------------------------------------------------------- chapter 11

@covers("11.1")
def test_state_bytes_with_a_reference_copy_under_lora():
    """Full fine-tuning's reference kept for LoRA: 4 bytes a base parameter too many."""
    def with_reference(model, config, gpus):
        P = sum(p.numel() for p in model.parameters())
        reference = 4 * P if config.loss.beta > 0 else 0
        if not config.lora.lora_rank:
            return (16 * P + reference) / gpus
        A = sum(config.lora.lora_rank * (m.in_features + m.out_features) for name, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in config.lora.lora_target_modules)
        return (4 * P + 16 * A + reference) / gpus
    with expected_values() as seen:
        result = ch11.check_state_bytes(with_reference)
    report = assert_rejected_without_answer(result, all_values(seen))
    assert result.passed == 4 and "the reference is the base with its adapters off" in report
    for value in all_values(seen):   # the right byte counts, however printed
        for text in (f"{value:,.0f}", f"{value:.0f}", f"{value / 1e9:.1f} GB", f"{value / 1e9:.2f}"):
            assert text not in report


@covers("11.2")
def test_merged_weight_without_the_scale():
    report = rejected(ch11.check_merged_weight, lambda W, A, B, alpha, r: W + B @ A)
    assert report.count("no scale: the adapter adds (alpha / r) B A") == 4


# --------------------------------------------------------------------------- chapter 12

def _log_ratio(old_logp, sampler_logp, mask):
    return (old_logp - sampler_logp).masked_fill(~mask, 0.0)


def _weights(geometric, product, band, by=None):
    by = geometric if by is None else by
    return geometric, product, (by >= band[0]) & (by <= band[1])


@covers("12.1")
def test_sequence_weights_keeping_by_the_product():
    """TRL's sequence_mask takes the product: a long response whose every token is a little off
    leaves any band, though each token (and the geometric mean) is close to 1."""
    def by_product(old_logp, sampler_logp, mask, band):
        total = _log_ratio(old_logp, sampler_logp, mask).sum(-1)
        geometric, product = torch.exp(total / mask.sum(-1)), torch.exp(total)
        return _weights(geometric, product, band, by=product)
    report = rejected(ch12.check_sequence_weights, by_product)
    assert "4 responses of 24 tokens" in report and "keep decides by the product's place in the band" in report
    assert "geometric" not in report.replace("the geometric mean's", "")


def test_sequence_weights_averaging_over_the_padding_too():
    def over_padding(old_logp, sampler_logp, mask, band):
        log_r = _log_ratio(old_logp, sampler_logp, mask)
        return _weights(torch.exp(log_r.mean(-1)), torch.exp(log_r.sum(-1)), band)
    report = rejected(ch12.check_sequence_weights, over_padding)
    assert "with padding: geometric" in report and "200 tokens" not in report   # no padding there: right


def test_sequence_weights_with_the_paddings_garbage_in_the_product():
    def garbage(old_logp, sampler_logp, mask, band):
        log_r = _log_ratio(old_logp, sampler_logp, mask)
        geometric = torch.exp(log_r.sum(-1) / mask.sum(-1))
        return _weights(geometric, torch.exp(old_logp - sampler_logp).prod(-1), band)
    report = rejected(ch12.check_sequence_weights, garbage)
    assert "with padding: product" in report and "geometric" not in report


def test_sequence_weights_whose_geometric_mean_is_the_product():
    def undivided(old_logp, sampler_logp, mask, band):
        product = torch.exp(_log_ratio(old_logp, sampler_logp, mask).sum(-1))
        return _weights(product, product, band)
    report = rejected(ch12.check_sequence_weights, undivided)
    assert "geometric is each response's product (the sum of the log-ratios, not divided by its length)" in report


def test_sequence_weights_keeping_with_weights():
    def weighed(old_logp, sampler_logp, mask, band):
        geometric, product, keep = ch12.sequence_weights(old_logp, sampler_logp, mask, band)
        return geometric, product, geometric * keep
    report = rejected(ch12.check_sequence_weights, weighed)
    assert "keep holds weights, not True/False" in report


@covers("12.2")
def test_run_seconds_with_every_step_overlapped():
    """Section 1's step, times the steps: the first k rollouts and the last k updates run alone."""
    def every_step(phase, steps, lag, overlap):
        sample = phase["rollout"] + phase["scoring"]
        return steps * (max(sample, phase["update"]) if overlap else sample + phase["update"])
    report = rejected(ch12.check_run_seconds, every_step)
    assert "every step counted as overlapped" in report and "not overlapped" not in report


def test_run_seconds_scoring_in_the_trainers_lane():
    def trainer_scores(phase, steps, lag, overlap):
        r, s, u = phase["rollout"], phase["scoring"], phase["update"]
        if not overlap:
            return steps * (r + s + u)
        alone = min(lag, steps)
        return alone * (r + s) + (steps - alone) * max(r, s + u) + alone * u
    report = rejected(ch12.check_run_seconds, trainer_scores)
    assert "scoring counted in the trainer's lane" in report and "rollout < update < rollout + scoring" in report


def test_run_seconds_with_one_rollout_ahead_whatever_the_lag():
    def one_ahead(phase, steps, lag, overlap):
        return ch12.run_seconds(phase, steps, 1, overlap)
    report = rejected(ch12.check_run_seconds, one_ahead)
    assert "lag 4, 50 steps, overlapped: one rollout sampled alone" in report
    assert "lag 1" not in report


def test_run_seconds_forgetting_a_run_shorter_than_its_lag():
    def no_min(phase, steps, lag, overlap):
        if not overlap:
            return ch12.run_seconds(phase, steps, lag, overlap)
        sample = phase["rollout"] + phase["scoring"]
        return lag * sample + (steps - lag) * max(sample, phase["update"]) + lag * phase["update"]
    report = rejected(ch12.check_run_seconds, no_min)
    assert report.count("\n  - ") == 1 and "a run shorter than its lag" in report


# --------------------------------------------------------------------------- chapter 13

class _Strict:
    """The exercise's answer, with a mistake switched on by a subclass."""

    stop = "]"
    ordered = False      # the factors only in the prompt's order
    spaces = True        # spaces inside the call allowed
    penalty = ch13.INVALID_CALL
    limit = ch13.MAX_CALLS

    def reset(self, sample):
        self.factors = [int(x) for x in sample["prompt"].rstrip("=").split("*")]
        self.calls = 0

    def step(self, action):
        self.calls += 1
        if self.calls > self.limit:
            return Reply("=!", self.penalty, done=True)
        call = re.search(r"\[([^\[\]]*)\]$", action)
        body = call.group(1) if call else ""
        parts = (body.replace(" ", "") if self.spaces else body).split("*")
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            got = [int(p) for p in parts]
            if got == self.factors or (not self.ordered and sorted(got) == sorted(self.factors)):
                return Reply(f"={self.factors[0] * self.factors[1]}")
        return Reply("=?", self.penalty)


@covers("13.1")
def test_strict_calculator_in_the_prompts_order_only():
    report = rejected(ch13.check_strict_calculator, type("Ordered", (_Strict,), {"ordered": True}))
    assert "its factors the other way round" in report and "its text is not the product" in report


def test_strict_calculator_without_the_validity_reward():
    report = rejected(ch13.check_strict_calculator, type("NoPenalty", (_Strict,), {"penalty": 0.0}))
    assert "a sum of the factors" in report and "the reward" in report


def test_strict_calculator_that_allows_a_third_call():
    report = rejected(ch13.check_strict_calculator, type("ThreeCalls", (_Strict,), {"limit": 3}))
    assert "one call too many" in report and "the episode must end here" in report


def test_strict_calculator_whose_state_survives_reset():
    class Sticky(_Strict):
        def reset(self, sample):
            self.factors = [int(x) for x in sample["prompt"].rstrip("=").split("*")]
            self.calls = getattr(self, "calls", 0)
    report = rejected(ch13.check_strict_calculator, Sticky)
    assert "(the instance reset from another episode)" in report
    assert "spaces inside the call:" not in report   # fresh instances pass


def test_strict_calculator_with_another_stop():
    report = rejected(ch13.check_strict_calculator, type("Stop", (_Strict,), {"stop": "]="}))
    assert "its stop is ']='" in report


def test_strict_calculator_that_returns_a_string():
    class Text(_Strict):
        def step(self, action):
            return super().step(action).text
    report = rejected(ch13.check_strict_calculator, Text)
    assert "raised TypeError" in report and "step must return a grpo_edu.training.episodes.Reply" in report


def test_strict_calculator_stub_reports_a_case_once():
    """A case that fails in a fresh instance is not played again in a reset one: one line each."""
    class NoLimit(_Strict):
        limit = 99
    result = ch13.check_strict_calculator(NoLimit)
    assert len(result.failures) == 2 and result.passed == len(ch13.strict_cases()) - 2
    assert "(the instance reset from another episode)" not in str(result)


def _masks(pieces, tokenizer, length, count=None, cut=True):
    count = count or (lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    policy, env = [], []
    for text, by_env in pieces:
        policy += [not by_env] * count(text)
        env += [by_env] * count(text)
    if cut:
        policy, env = policy[:length], env[:length]
    padding = [False] * max(0, length - len(policy))
    return torch.tensor(policy + padding), torch.tensor(env + padding)


@covers("13.2")
def test_loss_masks_counting_characters():
    """'<think>' and '\\boxed{' are one token each: counting characters shifts every later writer."""
    report = rejected(ch13.check_loss_masks, lambda pieces, tokenizer, length: _masks(pieces, tokenizer, length,
                                                                                      count=len))
    assert "one call: a mask marks padding after the episode's last token" in report
    assert "answered in the head" in report


def test_loss_masks_of_every_written_token():
    def written(pieces, tokenizer, length):
        policy, env = _masks(pieces, tokenizer, length)
        return policy | env, env
    report = rejected(ch13.check_loss_masks, written)
    assert "the loss mask marks the environment's tokens too" in report and "answered in the head" not in report


def test_loss_masks_swapped():
    report = rejected(ch13.check_loss_masks, lambda pieces, tokenizer, length: _masks(pieces, tokenizer,
                                                                                      length)[::-1])
    assert "two calls: the calculator writes two spans: the two masks are swapped" in report


def test_loss_masks_not_cut_at_the_length():
    report = rejected(ch13.check_loss_masks, lambda pieces, tokenizer, length: _masks(pieces, tokenizer, length,
                                                                                      cut=False))
    assert "inside the calculator's answer: loss_mask has shape (20,); the case needs 10 values" in report
    assert report.count("\n  - ") == 2


def test_loss_masks_with_the_first_span_only():
    """An environment that writes several spans: marking only the first is caught there."""
    def first_span(pieces, tokenizer, length):
        seen = False
        marked = []
        for text, by_env in pieces:
            marked.append((text, by_env and not seen))
            seen = seen or by_env
        return _masks(pieces, tokenizer, length)[0], _masks(marked, tokenizer, length)[1]
    report = rejected(ch13.check_loss_masks, first_span)
    assert "two calls: the calculator writes two spans: env_mask: wrong at" in report
    assert "one call" not in report


# --------------------------------------------------------------------------- chapter 14

@covers("14.1")
def test_run_disk_with_every_checkpoint_of_a_run_whole():
    """A checkpoint counted as the whole training state (9.1's 16 bytes and the reference), and
    KEEP of them whatever the run writes."""
    from grpo_edu.training.checkpoint import KEEP

    def whole_state(model, config):
        P = sum(p.numel() for p in model.parameters())
        return {"sampler_init": 4 * P if config.run.engine == "vllm" else 0, "checkpoints": KEEP * 20 * P,
                "model": 4 * P}
    with expected_values() as seen:
        result = ch14.check_run_disk(whole_state)
    report = assert_rejected_without_answer(result, all_values(seen))
    assert result.passed == 0 and "checkpoints: is too large" in report
    assert "config.run.model is a folder on disk" in report and "a vLLM server loads its model itself" in report
    for value in all_values(seen):   # the right byte counts, however printed
        for text in (f"{value:,.0f}", f"{value:.0f}", f"{value / 1e9:.1f} GB", f"{value / 1e9:.2f}"):
            assert value == 0 or text not in report


@covers("14.2")
def test_rollout_numbers_with_the_whole_mini_batch_on_every_gpu():
    def whole_mini_batch(config, gpus):
        prompts = config.rollout.prompts_per_step // gpus
        completions = prompts * config.rollout.num_generations
        return {"prompts_per_engine": prompts, "completions_per_engine": completions,
                "completion_tokens_per_engine": completions * config.rollout.max_completion_length,
                "optimizer_steps_per_rollout": config.optimisation.num_iterations * config.optimisation.num_mini_batches,
                "micro_batches_per_optimizer_step": -(-config.rollout.prompts_per_step * config.rollout.num_generations
                                                      // config.optimisation.num_mini_batches // config.optimisation.micro_batch_size)}
    with expected_values() as seen:
        result = ch14.check_rollout_numbers(whole_mini_batch)
    report = assert_rejected_without_answer(result, all_values(seen))
    assert report.count("each GPU holds its share of the mini-batch") == 4
    for value in all_values(seen):
        assert f"micro_batches_per_optimizer_step: {value:.0f}" not in report


# --------------------------------------------------------------------------- the list is complete

def test_every_exercise_has_a_wrong_answer_test():
    from test_solutions import SOLUTIONS
    assert {number for _, number, _ in SOLUTIONS} == COVERED


@pytest.mark.parametrize("expected, got, words", [
    (np.array([1.0147, -0.3382, -1.0147, 0.3382]), 0.866 * np.array([1.0147, -0.3382, -1.0147, 0.3382]),
     "all off by the same factor"),
    (np.array([1.0147, -0.3382]), np.array([-1.0147, 0.3382]), "wrong sign"),
    (np.array([1.0147, -0.3382]), np.array([1.3147, -0.0382]), "off by the same amount"),
    (np.array([1.0147, -0.3382, 0.25]), np.array([1.0147, 0.3382, 0.0]), "element 1 has the wrong sign"),
    (np.array([1.0147, -0.3382]), np.array([np.nan, -0.3382]), "NaN at element 0"),
    (np.array([1.0147, -0.3382]), np.array([1.0147, -0.3382, 0.0]), "returned shape (3,)"),
    (0.123456, 0.246912, "about 2 times the right value"),
    (0.123456, -0.1, "wrong sign"),
])
def test_compare_says_how_an_answer_is_wrong_never_the_right_value(expected, got, words):
    from grpo_edu.exercises.checking import compare
    sentence = compare(expected, got, 1e-6)
    assert words in sentence
    for value in np.ravel(expected):
        assert f"{abs(value):.4f}" not in sentence and f"{abs(value):.4g}" not in sentence


def test_the_leak_check_is_not_vacuous():
    """A report that prints a right value (as the old 'expected X, got Y' did) is caught."""
    from grpo_edu.exercises.checking import CheckResult
    for failure in ("case: expected [ 1.0147, -0.3382], got [ 0.8787, -0.2929]", "case: should be 1.015"):
        with pytest.raises(AssertionError):
            assert_rejected_without_answer(CheckResult("x", failures=[failure]), [1.0147, -0.33818])
    with pytest.raises(AssertionError, match="names the right answer"):
        assert_rejected_without_answer(CheckResult("x", failures=["run B: 'aliased reference'"]),
                                       words=["aliased reference"])
