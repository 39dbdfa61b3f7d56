"""Real models' answers: the number inside currency, percent, \\text{}, thousands separators,
fractions and powers of ten is read as the number; unboxed sentences only when asked; the
parser stays bounded and total on anything."""

import pytest
from hypothesis import given, settings, strategies as st

from grpo_edu.training import user_functions
from grpo_edu.config import TrainConfig
from grpo_edu.environment.rewards import MAX_EXPONENT, accuracy_reward, normalise_answer, parse_number


@pytest.mark.parametrize("completion, answer", [
    # The four: math-verify gives 1 for them, and so must we.
    ("\\boxed{\\$18}", "18"), ("\\boxed{\\text{18}}", "18"), ("\\boxed{25\\%}", "25"), ("\\boxed{10^6}", "1000000"),
    ("\\boxed{1{,}000}", "1000"), ("\\boxed{1\\,000}", "1000"), ("\\boxed{2 \\times 10^{3}}", "2000"),
    ("\\boxed{2.5\\cdot 10^2}", "250"), ("\\boxed{\\dfrac{3}{4}}", "0.75"), ("\\boxed{\\tfrac{1}{2}}", "1/2"),
    ("\\boxed{x = 18}", "18"), ("\\boxed{\\textbf{\\$1,250.00}}", "1250"), ("\\boxed{-\\$5}", "-5"),
    ("\\boxed{10^{-2}}", "0.01"),
])
def test_real_models_answer_styles_are_read(completion, answer):
    assert accuracy_reward([f"<think>...</think>{completion}"], answer=[answer]) == [1.0]


@pytest.mark.parametrize("completion, answer", [
    ("\\boxed{180}", "18"), ("\\boxed{18 apples}", "18"), ("\\boxed{10^7}", "1000000"), ("\\boxed{25\\%}", "0.25"),
    ("\\boxed{\\text{eighteen}}", "18"), ("\\boxed{10^{1000}}", "1"),
])
def test_what_is_not_the_answer(completion, answer):
    assert accuracy_reward([completion], answer=[answer]) == [0.0]


def test_exponents_are_bounded():
    assert parse_number(f"10^{MAX_EXPONENT}") == 10 ** MAX_EXPONENT
    assert parse_number(f"10^{{{MAX_EXPONENT + 1}}}") is None and parse_number("10^999") is None


def test_an_unboxed_sentence_counts_only_when_asked(tmp_path):
    text = ["Adding them up, the answer is 18."]
    assert accuracy_reward(text, answer=["18"]) == [0.0]
    assert accuracy_reward(text, answer=["18"], unboxed=True) == [1.0]
    # The config key reaches the trainer's accuracy reward.
    for flag, expected in ((False, 0.0), (True, 1.0)):
        functions = user_functions.reward_functions_from_config({"accuracy": 1.0}, TrainConfig(unboxed_answers=flag).run.unboxed_answers)
        assert functions["accuracy"][0](text, answer=["18"]) == [expected]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_normalising_is_idempotent_and_parsing_total(text):
    once = normalise_answer(text)
    if "{" not in text:   # nested wrappers peel a few levels per call, by design (bounded work)
        assert normalise_answer(once) == once
    parse_number(text)   # never raises
    accuracy_reward([text], answer=["18"], unboxed=True)


@pytest.mark.parametrize("text", [
    "10^" + "{" * 5000, "1" * 100_000, "\\text{" * 3000 + "18" + "}" * 3000, "x = " * 20_000,
    "2 \\times " * 10_000 + "10^3", "$" * 50_000, "\\boxed{" + "9" * 150 + "}",
])
def test_adversarial_inputs_return(text):
    assert parse_number(text) is None or isinstance(parse_number(text), object)
    assert accuracy_reward([text], answer=["18"], unboxed=True) in ([0.0], [1.0])
