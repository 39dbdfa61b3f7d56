"""Process supervision (DeepSeekMath, section 4.1.3): a reward at the end of every reasoning
step, not one per completion.

Outcome supervision gives every token of completion i the same advantage, its reward's
place in the group. Process supervision scores the steps: completion i's step j, ending at
token index(j), gets a reward r_i^index(j); every step reward of the group is normalised by
the mean and standard deviation of all the group's step rewards R,

    r~_i^index(j) = (r_i^index(j) - mean(R)) / std(R),

and token t's advantage is the sum of the normalised rewards of the steps ending at or after t:

    A_i,t = sum over j with index(j) >= t of r~_i^index(j)

(grpo_edu.algorithm.advantages.process_advantages; grpo_edu.algorithm.reference.process_advantages is the
plain-loop version it is tested against). A wrong step lowers the advantage of every token
before it, a right one raises them; the tokens after a completion's last step get 0.

The task here is `chain`: three numbers summed one written step at a time,

    prompt "12+7+30="   solution "<think>12+7=19,19+30=49</think>\\boxed{49}"

Each step `a+b=c` is checked by a rule, on its own (`chain_steps`): right when it adds the next
number of the prompt to the running total the completion itself wrote last (the first number,
for the first step), and c = a + b. A step after a wrong one can be right: it is judged
against what was written, as a step-level verifier would. The completion's last step is its
final answer: its reward is the completion's outcome reward (the run's reward functions,
weighted), at its last token (`completion_steps`). So the two kinds of supervision see the same
outcome; process supervision also sees the steps.
"""

from __future__ import annotations

import random
import re
from typing import NamedTuple, Sequence

import torch

from grpo_edu.algorithm.advantages import process_advantages
from grpo_edu.environment.registry import TASKS, Pretraining, Task, register_task, step_verified_tasks
from grpo_edu.environment.tasks import make_dataset, numbers_match
from grpo_edu.policy.models import THINK_CLOSE, THINK_OPEN, completion_text

CHAIN_NUMBERS = 3                 # numbers per problem: two written steps
CHAIN_NUMBER_RANGE = (10, 59)     # two-digit numbers: 50 ** 3 = 125,000 problems
_STEP = re.compile(r"(\d{1,6})\+(\d{1,6})=(\d{1,7})", re.ASCII)


def chain_sample(numbers: Sequence[int]) -> dict:
    """The sample that sums `numbers` left to right: prompt "12+7+30=", answer "49", and the
    solution that writes every partial sum, "<think>12+7=19,19+30=49</think>\\boxed{49}"."""
    numbers = list(numbers)
    if len(numbers) < 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
        raise ValueError(f"numbers must be two or more non-negative integers, got {numbers!r}")
    total, steps = numbers[0], []
    for number in numbers[1:]:
        steps.append(f"{total}+{number}={total + number}")
        total += number
    return {"prompt": "+".join(map(str, numbers)) + "=", "answer": str(total), "task": "chain",
            "numbers": numbers, "solution": completion_text(",".join(steps), str(total))}


def draw_chain(rng: random.Random) -> dict:
    """A chain problem with CHAIN_NUMBERS numbers drawn uniformly from CHAIN_NUMBER_RANGE."""
    low, high = CHAIN_NUMBER_RANGE
    return chain_sample([rng.randint(low, high) for _ in range(CHAIN_NUMBERS)])


def chain_steps(text: str, numbers: Sequence[int]) -> list[tuple[int, float]]:
    """The written steps of a chain completion, each (end, reward): `end` the index just past
    the step's last character in `text`, reward 1.0 when the step is right on its own (it adds
    the next number to the total the completion wrote last, and its sum is right) else 0.0.

    Steps are the `a+b=c` of the reasoning (between <think> and </think>, or to the end of the
    text when </think> never comes); anything else there is not a step. A step beyond the
    last number is wrong (there is nothing left to add)."""
    start = text.find(THINK_OPEN)
    if start < 0:
        return []
    start += len(THINK_OPEN)
    stop = text.find(THINK_CLOSE, start)
    stop = len(text) if stop < 0 else stop
    steps, running = [], int(numbers[0])
    for k, match in enumerate(_STEP.finditer(text, start, stop)):
        a, b, c = (int(g) for g in match.groups())
        right = k + 1 < len(numbers) and a == running and b == int(numbers[k + 1]) and c == a + b
        steps.append((match.end(), 1.0 if right else 0.0))
        running = c
    return steps


register_task(Task(
    "chain", "three numbers summed step by step, '12+7+30=': every written step a rule checks (process supervision)",
    instruction=("Add the numbers left to right, writing each partial sum as a+b=c inside <think> and </think> "
                 "(separated by commas), then give the total as \\boxed{number}."),
    check=numbers_match, draw=draw_chain, step_verifier=chain_steps,
    pretraining=Pretraining(
        card="""# {name}: a starting policy that sums three numbers step by step

A {layers}-layer, {width}-wide Llama ({parameters:,} parameters, float32)
with a character-level tokenizer (`grpo_edu.policy.models.char_tokenizer`), trained by
supervised fine-tuning on chain sums (`grpo_edu.environment.process`, task "chain": `12+7+30=` ->
`<think>12+7=19,19+30=49</think>\\boxed{{49}}`, every partial sum written) and stopped while
it is still often wrong: the policy the book's process-supervision runs start from
(chapter 5; configs/cpu-chain.toml), whose every step a rule can check.""",
        report=('`grpo_edu.environment.tasks.make_dataset("chain", 1000, "test", seed=0)`', lambda: make_dataset("chain", 1000, "test", seed=0)),
        use=("from grpo_edu.policy.models import CHAIN_POLICY, load_policy\nmodel, tokenizer = load_policy(CHAIN_POLICY)  "
             "# this directory; in a run's config: model = \"chain-start\" (configs/cpu-chain.toml)"))))


SUPERVISIONS = ("outcome", "process")   # config key supervision: a reward per completion, or per step


def prefix_lengths(tokenizer, completion_ids: Sequence[int], pieces: dict | None = None,
                   text: str | None = None) -> list[int]:
    """len(decode(completion_ids[:k + 1])) for every k (special tokens skipped, as the rewards read
    the text). Each token decoded alone and the lengths summed where that is exact (the tiny tier's
    characters; `pieces` caches them across completions), else every prefix decoded (a byte-level
    BPE token can be half a character). `text`: the whole decoded text, when the caller has it."""
    ids = list(completion_ids)
    pieces = {} if pieces is None else pieces
    text = tokenizer.decode(ids, skip_special_tokens=True) if text is None else text
    for token in set(ids) - pieces.keys():
        pieces[token] = tokenizer.decode([token], skip_special_tokens=True)
    lengths, total = [], 0
    for token in ids:
        total += len(pieces[token])
        lengths.append(total)
    if "".join(pieces[token] for token in ids) == text:
        return lengths
    # A prefix that ends inside a character decodes it as U+FFFD: that character is not there yet.
    return [len(prefix) - prefix.endswith("\ufffd") for prefix in
            tokenizer.batch_decode([ids[:k] for k in range(1, len(ids) + 1)], skip_special_tokens=True)]


def token_ends(tokenizer, completion_ids: Sequence[int], char_ends: Sequence[int],
               pieces: dict | None = None, text: str | None = None) -> list[int]:
    """The token index at which each character position ends: the first token whose decoded
    prefix (`prefix_lengths`) reaches `char_ends[j]` characters. `completion_ids` are the
    completion's real tokens; `text` their decoded text, when the caller has it."""
    if not char_ends:
        return []
    prefixes = prefix_lengths(tokenizer, completion_ids, pieces, text)
    ends = []
    for end in char_ends:
        index = next((k for k, length in enumerate(prefixes) if length >= end), None)
        if index is None:
            raise ValueError(f"a step ends at character {end}, past the completion's decoded text "
                             f"({prefixes[-1] if prefixes else 0} characters)")
        ends.append(index)
    return ends


class Steps(NamedTuple):
    """Every completion's steps as padded (N, K) tensors (K: the most steps of any completion)."""

    rewards: torch.Tensor   # (N, K) float64
    ends: torch.Tensor      # (N, K) long: the index of each step's last token
    mask: torch.Tensor      # (N, K) bool: a step is there
    written: torch.Tensor   # (N,) the written steps (the final answer not counted)
    right: torch.Tensor     # (N,) the written steps that are right


def completion_steps(texts: Sequence[str], columns: dict, tokenizer, completion_ids: torch.Tensor,
                     completion_mask: torch.Tensor, outcome: torch.Tensor) -> Steps:
    """Every completion's steps, for grpo_edu.algorithm.advantages.process_advantages: its written steps
    (its task's registered step_verifier, each 1.0 right or 0.0 wrong), then its final answer at its last
    real token with its outcome reward.

    texts: N decoded completions; columns: the dataset columns per completion (`task`,
    `numbers`); completion_ids, completion_mask: (N, S); outcome: (N,) the outcome reward."""
    N = len(texts)
    tasks, numbers = columns.get("task", [None] * N), columns.get("numbers", [None] * N)
    lengths = completion_mask.sum(-1).tolist()
    rows, right, pieces = [], [], {}
    for i in range(N):
        verifier = TASKS[tasks[i]].step_verifier if tasks[i] in TASKS else None
        if verifier is None:
            raise ValueError(f"supervision = 'process' needs a task whose steps a rule checks "
                             f"{step_verified_tasks()}, got completion {i} of task {tasks[i]!r}")
        steps = verifier(texts[i], numbers[i])
        ends = token_ends(tokenizer, completion_ids[i, :lengths[i]].tolist(), [end for end, _ in steps], pieces,
                          texts[i])   # the rewards' text: not decoded again
        rows.append([(end, reward) for end, (_, reward) in zip(ends, steps)]
                    + [(lengths[i] - 1, float(outcome[i]))])
        right.append(sum(reward for _, reward in steps))
    K = max(len(row) for row in rows)
    rewards = torch.zeros(N, K, dtype=torch.float64)
    ends = torch.zeros(N, K, dtype=torch.long)
    mask = torch.zeros(N, K, dtype=torch.bool)
    for i, row in enumerate(rows):
        for j, (end, reward) in enumerate(row):
            rewards[i, j], ends[i, j], mask[i, j] = reward, end, True
    return Steps(rewards, ends, mask, mask.sum(-1).double() - 1, torch.tensor(right, dtype=torch.float64))

def step_rewards(config, texts: Sequence[str], columns: dict, tokenizer, rollout, outcome: torch.Tensor
                 ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """A rollout's steps, for grpo_edu.training.scoring.score: (per-token advantages (b, G, S) or None, per-
    completion rows (N,) to gather). For a task whose steps a rule checks (single-turn): the written
    steps and the right ones of every completion (logged as process/steps, process/step_accuracy,
    whatever the supervision); with supervision = "process" also every token's advantage and, as
    the row "advantage", each completion's first (the sum of its normalised step rewards).
    outcome: (N,) the completions' outcome rewards, their last step's."""
    if TASKS[config.run.task].step_verifier is None or config.rollout.environment:
        return None, {}
    steps = completion_steps(texts, columns, tokenizer, rollout.completion_ids.cpu(), rollout.completion_mask.cpu(),
                             outcome)
    counts = {"steps": steps.written, "steps_right": steps.right}
    advantages = config.advantages
    if advantages.supervision != "process":
        return None, counts
    G = config.rollout.num_generations
    token_advantages = process_advantages(*(t.view(-1, G, t.shape[-1]) for t in steps[:3]),
                                          rollout.completion_ids.shape[1], scale=advantages.advantage_scale,
                                          std=advantages.advantage_std)
    return token_advantages, {**counts, "advantage": token_advantages[..., 0].reshape(-1)}
