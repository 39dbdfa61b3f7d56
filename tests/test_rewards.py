"""The rule-based rewards: exact cases, TRL's calling convention, and robustness
(any string gives a defined reward, quickly, without raising)."""

import math
import time

import pytest
from hypothesis import given, settings, strategies as st

from grpo_edu.environment import rewards
from grpo_edu.environment.rewards import (accuracy_reward, combined_reward, extract_answer, format_reward,
                              language_consistency_reward, parse_number)

GOOD = "<think>7+5=12</think>\\boxed{132}"


@pytest.mark.parametrize("text, expected", [
    ("<think>12</think>\\boxed{132}", "132"),
    ("\\boxed{1} then \\boxed{2}", "2"),                       # the last box wins
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),                 # nested braces
    ("\\boxed{ 7 }", "7"),
    ("so\nAnswer: 42\n", "42"),
    ("Final answer: -3", "-3"),
    ("answer：5", "5"),                                        # full-width colon
    ("reasoning\n#### 1,000", "1,000"),                        # GSM8K style
    ("\\boxed{12", None),                                      # unclosed
    ("Answer is 42", None),                                    # not an answer line
    ("", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, value", [
    ("3", 3), ("03", 3), ("3.0", 3), ("+3", 3), ("-3", -3), ("\u22123", -3), ("3.", 3),
    ("$18", 18), ("1,000", 1000), ("1,234.5", 1234.5), ("3/4", 0.75), ("\\frac{3}{4}", 0.75),
    ("-\\dfrac{1}{2}", -0.5), (".5", 0.5),
])
def test_parse_number_accepts(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("text", [
    "", "abc", "1,00", "3/0", "\\frac{1}{0}", "1e5", "3 4", "١٢", "１２", "²", "--3", ".", "1" * 65,
])
def test_parse_number_rejects(text):
    assert parse_number(text) is None


def test_parse_number_remembers_short_answers_only():
    """A repeated answer is parsed once (the cache), to the same value; an over-long text is refused
    before the cache, so it never holds one."""
    from grpo_edu.environment import rewards
    rewards._parse_number.cache_clear()
    assert parse_number("\\text{1,234}") == parse_number("\\text{1,234}") == 1234
    assert rewards._parse_number.cache_info().hits == 1 and rewards._parse_number.cache_info().currsize == 1
    assert parse_number("1" * (2 * rewards.MAX_ANSWER_CHARS + 1)) is None
    assert rewards._parse_number.cache_info().currsize == 1


def test_accuracy_normalises_numbers_and_rejects_wrong_answers():
    completions = ["<think>x</think>\\boxed{132}", "<think>x</think>\\boxed{0132}",
                   "<think>x</think>\\boxed{132.0}", "<think>x</think>\\boxed{133}",
                   "<think>x</think>Answer: 132", "no answer at all", "<think>x</think>\\boxed{١٣٢}"]
    assert accuracy_reward(completions, answer=["132"] * 7) == [1, 1, 1, 0, 1, 0, 0]


def test_accuracy_scalar_answer_is_broadcast_and_int_columns_work():
    assert accuracy_reward(["\\boxed{7}", "\\boxed{8}"], answer=7) == [1.0, 0.0]


def test_accuracy_non_numeric_answers_compare_as_text():
    assert accuracy_reward(["\\boxed{ yes  please }"], answer="yes please") == [1.0]
    assert accuracy_reward(["\\boxed{}"], answer="") == [0.0]


def test_accuracy_countdown_checks_the_expression():
    numbers, target = [3, 5, 7], 22
    completions = ["\\boxed{3*5+7}", "\\boxed{7+3*5}", "\\boxed{(3+5)*7}", "\\boxed{3*5+7+0}",
                   "\\boxed{5*5-3}", "\\boxed{22}", "\\boxed{__import__('os')}", "\\boxed{3*5+7)}"]
    got = accuracy_reward(completions, answer=[str(target)] * 8, task=["countdown"] * 8,
                          numbers=[numbers] * 8)
    assert got == [1, 1, 0, 0, 0, 0, 0, 0]


def test_accuracy_reads_chat_completions_like_trl_passes_them():
    chat = [[{"role": "assistant", "content": GOOD}], [{"role": "assistant", "content": "\\boxed{1}"}]]
    assert accuracy_reward(chat, answer=["132", "132"]) == [1.0, 0.0]
    assert format_reward(chat) == [1.0, 0.0]


def test_accuracy_accepts_trl_keyword_arguments():
    got = accuracy_reward(prompts=["47+85="], completions=[GOOD], completion_ids=[[1, 2]],
                          answer=["132"], task=["arithmetic"], trainer_state=None)
    assert got == [1.0]


def test_accuracy_rejects_missing_or_misaligned_columns_with_a_clear_error():
    with pytest.raises(ValueError, match="answer must have one entry per completion"):
        accuracy_reward([GOOD, GOOD], answer=["132"])
    with pytest.raises(ValueError, match="accuracy_reward needs `answer`"):
        accuracy_reward([GOOD])
    with pytest.raises(ValueError, match="completion 1: a countdown problem has no `numbers` column"):
        accuracy_reward([GOOD, GOOD], answer=["1", "2"], task=["arithmetic", "countdown"])


@pytest.mark.parametrize("text, expected", [
    (GOOD, 1.0),
    ("  <think>a</think>\n\\boxed{1}\n", 1.0),                 # surrounding whitespace is fine
    ("<think>a</think> Answer: 12", 1.0),
    ("<think>a</think>\\boxed{\\frac{1}{2}}", 1.0),
    ("<think></think>\\boxed{1}", 0.0),                        # empty reasoning
    ("<think>  </think>\\boxed{1}", 0.0),
    ("<think>a</think>\\boxed{1} extra", 0.0),                  # something after the answer
    ("<think>a</think>\\boxed{1}\\boxed{2}", 0.0),
    ("<think>a</think>\\boxed{}", 0.0),                        # empty answer
    ("<think>a</think>\\boxed{1", 0.0),                        # unclosed
    ("<think>a</think>\\boxed{{1}", 0.0),
    ("\\boxed{1}", 0.0),                                       # no reasoning
    ("x<think>a</think>\\boxed{1}", 0.0),                      # text before <think>
    ("<think>a<think>b</think>\\boxed{1}", 0.0),                # nested tags
    ("<think>a</think></think>\\boxed{1}", 0.0),
    ("<think>a</think>", 0.0),                                 # no answer
    ("<think>a</think>Answer: 1\nmore", 0.0),
    ("<think>a\\boxed{1}", 0.0),                               # unclosed reasoning
    ("", 0.0),
])
def test_format_reward(text, expected):
    assert format_reward([text]) == [expected]


@pytest.mark.parametrize("text, language, expected", [
    ("<think>add the units then carry</think>\\boxed{1}", "en", 1.0),
    ("<think>add 个位 then carry</think>\\boxed{1}", "en", 3 / 5),     # 2 ideographs = 2 words
    ("<think>add 个位 then carry</think>\\boxed{1}", "zh", 2 / 5),
    ("<think>7+5=12</think>\\boxed{132}", "en", 1.0),                  # no words: nothing mixed
    ("<think>café au lait</think>", "en", 2 / 3),                      # non-ASCII letters
    ("<think>one two", "en", 1.0),                                     # unclosed: to the end
    ("\\boxed{1}", "en", 0.0),                                         # no reasoning at all
    ("<think>x</think> 中文 after the reasoning does not count", "en", 1.0),
])
def test_language_consistency(text, language, expected):
    assert language_consistency_reward([text], language=language) == [pytest.approx(expected)]


def _naive_language_consistency(reasoning: str, language: str) -> float:
    """The definition, character by character: words are runs of letters, each
    ideograph a word of its own."""
    def ideograph(c):
        return "\u3400" <= c <= "\u4dbf" or "\u4e00" <= c <= "\u9fff" or "\uf900" <= c <= "\ufaff"
    words, current = [], ""
    for c in reasoning:
        if c.isalpha() and not ideograph(c) and not c.isdigit() and c != "_":
            current += c
            continue
        if current:
            words.append(current)
            current = ""
        if ideograph(c):
            words.append(c)
    if current:
        words.append(current)
    if not words:
        return 1.0
    target = [w for w in words if (ideograph(w) if language == "zh" else w.isascii())]
    return len(target) / len(words)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["abc", "Zeta", "é", "个", "位", " ", "7", "_", "+", "ß", "ж", "\n",
                                 "ǅ", "ª"]), max_size=20).map("".join), st.sampled_from(["en", "zh"]))
def test_language_consistency_matches_its_definition(reasoning, language):
    got = language_consistency_reward([f"<think>{reasoning}</think>"], language=language)[0]
    assert got == pytest.approx(_naive_language_consistency(reasoning, language))


def test_language_consistency_per_completion_column_and_bad_language():
    texts = ["<think>中文</think>", "<think>english</think>"]
    assert language_consistency_reward(texts, language=["zh", "en"]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="language must be one of"):
        language_consistency_reward(texts, language="fr")


def test_combined_reward_sums_weighted_components():
    reward = combined_reward({"accuracy": 1.0, "format": 0.5})
    texts = [GOOD, "\\boxed{132}", "<think>x</think>\\boxed{1}", "junk"]
    parts = reward.components(texts, answer=["132"] * 4)
    assert parts["accuracy"] == [1, 1, 0, 0]
    assert parts["format"] == [1, 0, 1, 0]
    assert parts["reward"] == [1.5, 1.0, 0.5, 0.0]
    assert reward(texts, answer=["132"] * 4) == parts["reward"]
    assert reward.__name__ == "combined_reward"
    assert combined_reward().weights == {"accuracy": 1.0, "format": 1.0}  # R1 eq. 4


@pytest.mark.parametrize("weights, message", [
    ({"accuracy": 1.0, "fluency": 1.0}, "unknown reward 'fluency'"),
    ({"accuracy": float("nan")}, "weights\\['accuracy'\\] must be a finite number"),
    ({}, "at least one reward"),
])
def test_combined_reward_rejects_bad_weights(weights, message):
    with pytest.raises(ValueError, match=message):
        combined_reward(weights)


def test_combined_reward_rejects_a_nan_from_a_component():
    reward = rewards.CombinedReward({"bad": 1.0}, functions={"bad": lambda c, **k: [float("nan")] * len(c)})
    with pytest.raises(ValueError, match="reward 'bad' returned a non-finite value"):
        reward(["x"])


# --------------------------------------------------------------------------- robustness

def _all_rewards(text: str) -> list[float]:
    values = []
    values += accuracy_reward([text], answer=["132"])
    values += accuracy_reward([text], answer=["22"], task=["countdown"], numbers=[[3, 5, 7]])
    values += format_reward([text])
    values += language_consistency_reward([text])
    values += language_consistency_reward([text], language="zh")
    return values


def _assert_defined(values):
    assert all(isinstance(v, float) and math.isfinite(v) and 0.0 <= v <= 1.0 for v in values), values


MARKUP = st.sampled_from(["<think>", "</think>", "\\boxed{", "{", "}", "Answer:", "####", "\n",
                          " ", "132", "-", "/", "(", ")", "*", "\\frac{1}{2}", "١٢", "中", "é"])


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_any_unicode_text_gives_a_defined_reward(text):
    _assert_defined(_all_rewards(text))


@settings(max_examples=400, deadline=None)
@given(st.lists(MARKUP, max_size=40).map("".join))
def test_any_mix_of_markup_gives_a_defined_reward(text):
    _assert_defined(_all_rewards(text))


@settings(max_examples=200, deadline=None)
@given(st.lists(MARKUP, max_size=12).map("".join), st.lists(MARKUP, max_size=12).map("".join))
def test_format_reward_agrees_with_its_definition(reasoning, answer):
    text = f"<think>{reasoning}</think>\\boxed{{{answer}}}"
    reasoning_ok = reasoning.strip() != "" and "<think>" not in reasoning and "</think>" not in reasoning
    # The answer must close exactly at the end: balanced braces, no tags, non-empty.
    depth, closes_early = 1, False
    for index, character in enumerate(answer + "}"):
        depth += {"{": 1, "}": -1}.get(character, 0)
        if depth == 0 and index < len(answer):
            closes_early = True
            break
    answer_ok = (answer.strip() != "" and not closes_early and depth == 0
                 and "<think>" not in answer and "</think>" not in answer)
    assert format_reward([text]) == [1.0 if reasoning_ok and answer_ok else 0.0]


MEGABYTE = 1 << 20
ADVERSARIAL = {
    "empty": "",
    "1 MB of letters": "a" * MEGABYTE,
    "1 MB of digits": "1" * MEGABYTE,
    "1 MB of newlines": "\n" * MEGABYTE,
    "1 MB of spaces then an answer line": " " * MEGABYTE + "Answer: 1",
    "open braces": "\\boxed{" + "{" * MEGABYTE,
    "close braces": "}" * MEGABYTE,
    "many boxes": "\\boxed{" * (MEGABYTE // 7),
    "many think tags": "<think>" * (MEGABYTE // 7),
    "many answer lines": "Answer:\n" * (MEGABYTE // 8),
    "huge reasoning, good answer": "<think>" + "x " * (MEGABYTE // 2) + "</think>\\boxed{132}",
    "huge boxed number": "<think>a</think>\\boxed{" + "9" * MEGABYTE + "}",
    "deep parentheses": "\\boxed{" + "(" * 150 + "1" + ")" * 150 + "}",
    "unicode digits": "<think>١+٢</think>\\boxed{١٣٢}",
    "ideographs": "<think>" + "中" * MEGABYTE + "</think>",
    "lone surrogate-free emoji": "<think>🙂🙂</think>\\boxed{🙂}",
    "null bytes": "\x00" * 1000 + "\\boxed{\x00}",
}


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_adversarial_completions_are_scored_quickly(name):
    text = ADVERSARIAL[name]
    start = time.perf_counter()
    values = _all_rewards(text)
    seconds = time.perf_counter() - start
    _assert_defined(values)
    # Linear time: a megabyte takes a few tenths of a second on an idle core;
    # quadratic regex backtracking on a megabyte would take hours. The limit is a
    # guard against that, far above any busy machine's linear time, not a deadline.
    assert seconds < 60.0, f"{name}: {seconds:.2f} s for all five rewards"


def test_huge_reasoning_with_a_good_answer_still_scores():
    text = ADVERSARIAL["huge reasoning, good answer"]
    assert accuracy_reward([text], answer=["132"]) == [1.0]
    assert format_reward([text]) == [1.0]


def test_non_string_completions_score_zero():
    assert accuracy_reward([None, 132, []], answer=["132"] * 3) == [0.0, 0.0, 0.0]
    assert format_reward([None]) == [0.0]
