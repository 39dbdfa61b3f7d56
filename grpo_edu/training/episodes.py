"""Multi-turn episodes: the policy writes, an environment answers, the policy goes on.

With config.rollout.environment set, a rollout's completion is an episode. The policy samples until
it writes EOS or the environment's hand-over token (`Environment.stop`, one token: the end
of a tool call, say); at the hand-over the environment reads what the policy wrote in that
turn and answers with text, a reward contribution and whether the episode is over. Its text
goes into the context, and the policy samples its next turn from the prompt, everything
written so far, and that answer. At most config.rollout.max_turns policy turns; the episode's
tokens, both writers', count against max_completion_length.

    prompt | policy turn 1 ...[12*34] | =408 | policy turn 2 ...\\boxed{408}<eos>
           |       completion_mask    | env_mask |          completion_mask

Every token carries who wrote it. The environment's tokens are context: the forwards attend
to them (attention_mask), and nothing of the loss counts them: not the policy term, the KL,
the entropy, the ratio or its clip statistics, the sampler gap, nor any normaliser (token
and sequence counts, dapo's and dr_grpo's constants), because completion_mask marks the
policy's tokens only (grpo_edu.training.batch: env_mask beside it; tests/test_episodes.py).

An environment is a class named by import path ("module:Class" or "path/file.py:Class"), as
reward and advantage functions are; a fresh instance plays each episode:

    class Calculator:
        stop = "]"                       # the policy's turn ends here; the environment answers
        def reset(self, sample): ...     # the episode's problem (its dataset row)
        def step(self, action: str) -> Reply: ...   # the policy's text of this turn

What the trainer does with an environment that misbehaves: one that raises, or returns
something other than a Reply (text str, reward finite float, done bool), stops the run with
a one-line error naming it and what it did: no episode is dropped or trained on silently. An
answer longer than the room left in the episode is cut there, and the episode ends
truncated (like a completion that reaches max_completion_length), and it is counted
(episode/cut_answers). An episode whose last allowed turn hands over again ends there,
unanswered, as truncated (episode/turn_limit).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Protocol

import torch

from grpo_edu.sampling.rollout import Rollout, SamplingParams
from grpo_edu.environment.tasks import ExpressionError, evaluate_expression
from grpo_edu.training.user_functions import resolve


@dataclass(frozen=True)
class Reply:
    """What an environment returns for one policy turn."""

    text: str              # written into the episode's context ('' writes nothing)
    reward: float = 0.0    # added to the episode's reward (grpo_edu.training.scoring)
    done: bool = False     # the episode ends after this text


class Environment(Protocol):
    stop: str

    def reset(self, sample: dict) -> None:
        """A new episode on `sample` (the task's row: prompt, answer, ...)."""

    def step(self, action: str) -> Reply:
        """The policy's text of this turn (ending with `stop`) -> the environment's answer."""


@functools.lru_cache(maxsize=16)
def load_environment(path: str) -> type:
    """"module:Class" or "path/file.py:Class" -> the class, checked: it has a one-string `stop`,
    reset and step (imported once per process)."""
    factory = resolve(path, "environment")
    stop = getattr(factory, "stop", None)
    if not isinstance(stop, str) or not stop:
        raise ValueError(f"environment {path!r} needs a class attribute 'stop', the non-empty text that hands "
                         f"the turn to it, got {stop!r}")
    for method in ("reset", "step"):
        if not callable(getattr(factory, method, None)):
            raise ValueError(f"environment {path!r} has no method {method!r} (reset(sample), step(action) -> Reply)")
    return factory


def stop_token(path: str, factory: type, tokenizer) -> int:
    """The one token id of the environment's hand-over text."""
    ids = tokenizer(factory.stop, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"environment {path!r}: its stop text {factory.stop!r} must be one token of the "
                         f"policy's tokenizer (the sampler stops on a token), got {len(ids)} tokens {ids}")
    return ids[0]


def _checked_reply(path: str, reply, action: str) -> Reply:
    if not isinstance(reply, Reply):
        raise TypeError(f"environment {path!r} returned {type(reply).__name__} {reply!r:.80} for the action "
                        f"{action[-40:]!r}; step must return a grpo_edu.training.episodes.Reply")
    if not isinstance(reply.text, str):
        raise TypeError(f"environment {path!r} returned a Reply whose text is {type(reply.text).__name__} "
                        f"{reply.text!r:.60}, expected str")
    if (isinstance(reply.reward, bool) or not isinstance(reply.reward, (int, float))
            or not math.isfinite(reply.reward)):
        raise TypeError(f"environment {path!r} returned a Reply whose reward is {reply.reward!r}, expected a "
                        f"finite float")
    if not isinstance(reply.done, bool):
        raise TypeError(f"environment {path!r} returned a Reply whose done is {reply.done!r}, expected a bool")
    return reply


@dataclass
class _Episode:
    prompt: list[int]              # the prompt's real tokens
    environment: object
    tokens: list[int] = field(default_factory=list)     # what the episode holds so far, both writers'
    by_env: list[bool] = field(default_factory=list)    # per token: written by the environment
    logp: list[float] = field(default_factory=list)     # per token: the sampler's log-prob (0: the environment's)
    reward: float = 0.0            # the environment's contributions
    turns: int = 0                 # the policy's turns
    open: bool = True              # handed over: the environment answers, the policy writes again
    finished: bool = False         # ended by the policy's EOS or the environment's done
    cut: bool = False              # an answer did not fit in the room left
    turn_limit: bool = False       # handed over on its last allowed turn


def roll_out_episodes(generate, samples: list[dict], prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      sampling: SamplingParams, tokenizer, path: str, max_turns: int) -> Rollout:
    """B prompts -> B * G episodes, as a Rollout whose env_mask marks the environment's tokens.

    generate(turn, prompt_ids, prompt_mask, sampling, rows) samples one policy turn: `rows`
    are the episodes' indices (b * G + g) in the batch, so that the caller draws each row's
    random numbers by row and turn (an episode does not depend on the rest of the batch).
    Turn 0 samples G per prompt; later turns one per continuing episode, from the prompt and
    everything the episode holds (one request per turn, with the growing context).
    """
    factory = load_environment(path)
    stop = stop_token(path, factory, tokenizer)
    pad = tokenizer.pad_token_id
    G, L = sampling.num_generations, sampling.max_new_tokens
    episodes = []
    for b, sample in enumerate(samples):
        prompt = prompt_ids[b][prompt_mask[b].bool()].tolist()
        for _ in range(G):
            environment = factory()
            try:
                environment.reset(sample)
            except Exception as error:
                raise RuntimeError(f"environment {path!r} raised {type(error).__name__}: {error} in reset(sample) "
                                   f"for the prompt {str(sample.get('prompt', ''))[:40]!r}") from error
            episodes.append(_Episode(prompt, environment))

    rows = list(range(len(episodes)))
    first = generate(0, prompt_ids, prompt_mask, SamplingParams(G, L, sampling.temperature, (stop,)), rows)
    _append_turn(episodes, rows, first, stop, L)
    for turn in range(1, max_turns + 1):
        for episode in (e for e in episodes if e.open):
            if episode.turns >= max_turns:   # its last allowed turn handed over: left unanswered
                episode.open, episode.turn_limit = False, True
            else:
                _answer(episode, path, tokenizer, L)
        rows = [i for i, e in enumerate(episodes) if e.open]
        if not rows:
            break
        contexts = [episodes[i].prompt + episodes[i].tokens for i in rows]
        width = max(len(c) for c in contexts)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for r, context in enumerate(contexts):   # left-padded, as every engine takes prompts
            ids[r, width - len(context):] = torch.tensor(context)
            mask[r, width - len(context):] = 1
        room = max(L - len(episodes[i].tokens) for i in rows)
        rollout = generate(turn, ids.to(prompt_ids.device), mask.to(prompt_ids.device),
                           SamplingParams(1, room, sampling.temperature, (stop,)), rows)
        _append_turn(episodes, rows, rollout, stop, L)
    return _as_rollout(episodes, prompt_ids, prompt_mask, G, pad)


def _append_turn(episodes: list[_Episode], rows: list[int], rollout: Rollout, stop: int, L: int) -> None:
    """Each row's sampled turn into its episode, cut at the episode's room (then it ends there).
    It ended the episode where the engine says the turn finished on a token other than the
    hand-over (any EOS id of the model's: the engine's finished flag, not the tokenizer's one EOS)."""
    for r, i in enumerate(rows):
        episode = episodes[i]
        n = int(rollout.completion_mask[r].sum())
        kept = min(n, L - len(episode.tokens))
        tokens = rollout.completion_ids[r, :kept].tolist()
        episode.tokens += tokens
        episode.by_env += [False] * kept
        episode.logp += rollout.sampler_logp[r, :kept].tolist()
        episode.turns += 1
        last = tokens[-1] if tokens else None
        episode.finished = kept == n and bool(rollout.finished[r]) and last != stop
        episode.open = last == stop and kept == n and len(episode.tokens) < L


def _answer(episode: _Episode, path: str, tokenizer, L: int) -> None:
    """The environment's reply to the policy's last turn, written into the episode."""
    start = len(episode.tokens)
    while start > 0 and not episode.by_env[start - 1]:
        start -= 1
    action = tokenizer.decode(episode.tokens[start:], skip_special_tokens=True)
    try:
        reply = episode.environment.step(action)
    except Exception as error:
        raise RuntimeError(f"environment {path!r} raised {type(error).__name__}: {error} in step() on the "
                           f"action {action[-40:]!r}") from error
    reply = _checked_reply(path, reply, action)
    episode.reward += float(reply.reward)
    written = tokenizer(reply.text, add_special_tokens=False)["input_ids"] if reply.text else []
    room = L - len(episode.tokens)
    if len(written) > room:
        written, episode.cut = written[:room], True
    episode.tokens += written
    episode.by_env += [True] * len(written)
    episode.logp += [0.0] * len(written)
    if episode.cut or len(episode.tokens) >= L:
        episode.open = False            # no room for the policy's next turn: truncated
    elif reply.done:
        episode.open, episode.finished = False, True


def _as_rollout(episodes: list[_Episode], prompt_ids, prompt_mask, G: int, pad: int) -> Rollout:
    device = prompt_ids.device
    N, S = len(episodes), max(1, max(len(e.tokens) for e in episodes))
    ids = torch.full((N, S), pad, dtype=torch.long)
    by_env = torch.zeros(N, S, dtype=torch.bool)
    written = torch.zeros(N, S, dtype=torch.bool)
    logp = torch.zeros(N, S, dtype=torch.float32)
    for i, e in enumerate(episodes):
        n = len(e.tokens)
        ids[i, :n] = torch.tensor(e.tokens, dtype=torch.long)
        by_env[i, :n] = torch.tensor(e.by_env, dtype=torch.bool)
        written[i, :n] = True
        logp[i, :n] = torch.tensor(e.logp, dtype=torch.float32)
    policy = written & ~by_env
    episode = {"env_reward": torch.tensor([e.reward for e in episodes], dtype=torch.float64),
               "turns": torch.tensor([float(e.turns) for e in episodes], dtype=torch.float64),
               "env_tokens": by_env.sum(-1).double(),
               "cut_answers": torch.tensor([float(e.cut) for e in episodes], dtype=torch.float64),
               "turn_limit": torch.tensor([float(e.turn_limit) for e in episodes], dtype=torch.float64)}
    return Rollout(prompt_ids.repeat_interleave(G, dim=0), prompt_mask.repeat_interleave(G, dim=0),
                   ids.to(device), policy.to(device), logp.masked_fill(~policy, 0.0).to(device),
                   torch.tensor([e.finished for e in episodes], device=device), G,
                   env_mask=by_env.to(device), episode=episode)


def writers(text: str, path: str, sample: dict) -> list[tuple[str, bool]]:
    """A whole episode's text (a solution written out, say) split into who wrote each piece,
    (piece, by the environment), by playing it against the environment: after each `stop`
    the environment's reply must be the text that follows. Supervised pretraining keeps the
    environment's pieces out of its loss this way (grpo_edu.commands.pretrain). Raises ValueError
    where the text is not an episode the environment would play."""
    environment = load_environment(path)()
    environment.reset(sample)
    pieces, start, done = [], 0, False
    while start < len(text) and not done:
        end = text.find(environment.stop, start)
        if end < 0:
            break
        end += len(environment.stop)
        action = text[start:end]
        reply = _checked_reply(path, environment.step(action), action)
        if not text.startswith(reply.text, end):
            raise ValueError(f"environment {path!r} answers {action!r} with {reply.text!r}, but the text goes on "
                             f"{text[end:end + len(reply.text) + 8]!r}")
        pieces += [(action, False), (reply.text, True)]
        start, done = end + len(reply.text), reply.done
    if start < len(text):
        if done:
            raise ValueError(f"environment {path!r} ended the episode, but the text goes on {text[start:][:40]!r}")
        pieces.append((text[start:], False))
    return [(piece, by_env) for piece, by_env in pieces if piece]


# --------------------------------------------------------------------------- the calculator

_CALL = re.compile(r"\[([^\[\]]*)\]$")


class Calculator:
    """A calculator tool: the policy writes `[expression]`, the calculator answers `=value`.

    `[12*34]` -> `=408`; integers and + - * / ( ); a result that is not an integer is written
    as a fraction (`[7/2]` -> `=7/2`), an expression it cannot read as `=?` (a wrong call costs
    the turn, nothing else). Each episode may call it at most `max_calls` times (then `=!`
    answers and the episode is over). No reward of its own: the task's rewards score the
    final answer."""

    stop = "]"
    max_calls = 4

    def reset(self, sample: dict) -> None:
        self.calls = 0

    def step(self, action: str) -> Reply:
        self.calls += 1
        if self.calls > self.max_calls:
            return Reply("=!", done=True)
        call = _CALL.search(action)
        if call is None:
            return Reply("=?")
        try:
            value = evaluate_expression(call.group(1))
        except (ExpressionError, ZeroDivisionError, ValueError):
            return Reply("=?")
        return Reply(f"={value.numerator}" if value.denominator == 1 else f"={value.numerator}/{value.denominator}")
