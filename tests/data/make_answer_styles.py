"""Writes tests/data/answer_styles.json: GSM8K-style answers in the styles models write them,
each with grpo_edu's accuracy verdict (tests/test_rewards_mathverify.py holds the library to it
and compares it with math-verify, as TRL's accuracy_reward calls it).

    python tests/data/make_answer_styles.py > tests/data/answer_styles.json
"""

import json
from fractions import Fraction

from grpo_edu.environment.rewards import accuracy_reward

THIN, TIMES, CDOT = "\\,", " \\times ", " \\cdot "
GOLDS = ["18", "25", "7", "1000000", "1250", "-5", "2000", "0.75", "3.5", "48"]


def styles(gold: str) -> list[tuple[str, str]]:
    value = Fraction(gold)
    whole = value.denominator == 1
    n = int(value) if whole else None
    out = [("boxed", f"\\boxed{{{gold}}}"), ("boxed dollar", f"\\boxed{{\\${gold}}}"),
           ("boxed bare dollar", f"\\boxed{{${gold}}}"), ("boxed text", f"\\boxed{{\\text{{{gold}}}}}"),
           ("boxed textbf", f"\\boxed{{\\textbf{{{gold}}}}}"), ("boxed trailing period", f"\\boxed{{{gold}.}}"),
           ("boxed variable", f"\\boxed{{x = {gold}}}"), ("boxed decimal zeros", f"\\boxed{{{float(value):.2f}}}"),
           ("boxed wrong", f"\\boxed{{{value + 1}}}"), ("boxed ten times", f"\\boxed{{{value * 10}}}"),
           ("boxed unit word", f"\\boxed{{{gold} apples}}"), ("answer line", f"Answer: {gold}"),
           ("gsm8k line", f"#### {gold}"), ("unboxed sentence", f"So the answer is {gold}."),
           ("two boxes, last right", f"\\boxed{{{value + 3}}} wait, \\boxed{{{gold}}}"),
           ("two boxes, last wrong", f"\\boxed{{{gold}}} wait, \\boxed{{{value + 3}}}"),
           ("unclosed box", f"\\boxed{{{gold}"), ("empty box", "\\boxed{}")]
    if whole and n >= 0:
        out += [("boxed percent", f"\\boxed{{{gold}\\%}}"), ("boxed bare percent", f"\\boxed{{{gold}%}}")]
    if whole and abs(n) >= 1000:
        grouped = f"{n:,}"
        braced, thin = grouped.replace(",", "{,}"), grouped.replace(",", THIN)
        out += [("thousands comma", f"\\boxed{{{grouped}}}"), ("thousands braced comma", f"\\boxed{{{braced}}}"),
                ("thousands thin space", f"\\boxed{{{thin}}}"),
                ("dollar thousands", f"\\boxed{{\\${grouped}}}")]
    if whole and n > 0 and str(n).rstrip("0") in ("1", "2") and len(str(n)) > 3:
        exponent = len(str(n)) - 1
        mantissa = str(n)[0]
        times = "" if mantissa == "1" else mantissa + TIMES
        dot = "" if mantissa == "1" else mantissa + CDOT
        out += [("power of ten", f"\\boxed{{{times}10^{{{exponent}}}}}"),
                ("power of ten bare", f"\\boxed{{{dot}10^{exponent}}}")]
    if not whole:
        out += [("latex fraction", f"\\boxed{{\\frac{{{value.numerator}}}{{{value.denominator}}}}}"),
                ("dfrac", f"\\boxed{{\\dfrac{{{value.numerator}}}{{{value.denominator}}}}}"),
                ("slash fraction", f"\\boxed{{{value.numerator}/{value.denominator}}}")]
    if whole and n > 0:
        out += [("percent of a fraction", f"\\boxed{{{n / 100:g}}}")]
    return out


def math_verify_reward(completion: str, gold: str) -> float:
    """math-verify's verdict as TRL 1.16's accuracy_reward computes it."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify
    answer = parse(completion, extraction_config=[LatexExtractionConfig(
        normalization_config=NormalizationConfig(units=True), boxed_match_priority=0, try_extract_without_anchor=False)],
        extraction_mode="first_match")
    return float(verify(parse(gold), answer))


if __name__ == "__main__":
    from importlib.metadata import version
    rows = []
    for gold in GOLDS:
        for style, answer in styles(gold):
            completion = f"<think>Working it out.</think> {answer}"
            rows.append({"gold": gold, "style": style, "completion": completion,
                         "ours": accuracy_reward([completion], answer=[gold])[0],
                         "math_verify": math_verify_reward(completion, gold)})
    print(json.dumps({"made_by": "tests/data/make_answer_styles.py",
                      "math_verify_version": version("math-verify"), "rows": rows}, indent=1))
