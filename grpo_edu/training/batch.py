"""One GRPO step's data in the (B, G, S) layout, checked once, on construction.

B prompts, G completions per prompt, T = P + S columns: P prompt columns, left-
padded (every prompt ends at column P - 1), then S completion columns,
right-padded (every completion starts at column P). With the two paddings
facing away from the seam, column P is the first completion token of every
row, and the logits at column P - 1 predict it.

    input_ids       (B, G, T)  prompt then completion token ids
    attention_mask  (B, G, T)  1 on real tokens (prompt and completion)
    completion_mask (B, G, S)  1 on real completion tokens (up to and including EOS)
    old_logp        (B, G, S)  log pi_old of the sampled tokens (the sampler's policy), or None:
                               on-policy with one optimizer step per rollout, pi_old is the
                               update's own forward, detached (ratio 1; grpo_edu.training.trainer)
    ref_logp        (B, G, S)  log pi_ref, or None when beta = 0
    rewards         (B, G)     one scalar per completion
    advantages      (B, G)     one advantage per completion, or (B, G, S) one per token
                               (process supervision, grpo_edu.environment.process)
    sampler_logp    (B, G, S)  the rollout engine's log-probs of its samples, or None
                               (the trainer compares them with its own: the sampler gap)
    env_mask        (B, G, S)  multi-turn episodes (grpo_edu.training.episodes): 1 on the tokens the
                               environment wrote, or None. They are context: attended to
                               (attention_mask), never scored (not in completion_mask, which
                               then marks the policy's tokens only and may have gaps)
    truncated       (B, G)     overlong filtering (mask_truncated_completions): True for the
                               completions cut at the length limit, whose tokens leave the
                               loss (`loss_mask`), or None

The trainer's step data is this type too (grpo_edu.training.scoring builds one per rank per
rollout): its mini-batches are `select`s of whole groups and its micro-batches
`MicroBatch`es, rows of the flat (B * G, ...) layout (`rows`).

Everything the loss and the trainer rely on is checked here, so a wrong batch
fails at the line that built it, with a message that says what and where.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from grpo_edu.algorithm.advantages import check_rewards
from grpo_edu.algorithm.logprobs import check_logprob_values

_OPTIONAL = ("old_logp", "ref_logp", "sampler_logp", "env_mask", "truncated")
_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _where(bad: torch.Tensor) -> str:
    b, g, *rest = (int(i) for i in bad.nonzero()[0])
    return f"prompt {b}, completion {g}" + (f", column {rest[0]}" if rest else "")


def _as_bool_mask(mask: torch.Tensor, name: str) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex() or not ((mask == 0) | (mask == 1)).all():
        raise ValueError(f"{name} must be bool or hold only 0 and 1, got values "
                         f"{torch.unique(mask)[:5].tolist()}")
    return mask != 0


@dataclass(frozen=True)
class StepTensors:
    """The tensors of a step's data, declared once: RolloutBatch holds them as (B, G, ...),
    MicroBatch as rows of it, (n, ...) (the module docstring says what each is)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    old_logp: torch.Tensor | None
    rewards: torch.Tensor
    advantages: torch.Tensor
    ref_logp: torch.Tensor | None = None
    sampler_logp: torch.Tensor | None = None
    env_mask: torch.Tensor | None = None
    truncated: torch.Tensor | None = None


@dataclass(frozen=True)
class RolloutBatch(StepTensors):
    """A validated (B, G, S) batch of one GRPO step (see the module docstring)."""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, torch.Tensor) or (f.name in _OPTIONAL and value is None)):
                raise TypeError(f"{f.name} must be a torch.Tensor, got {type(value).__name__}")
        self._check_shapes()
        if self.input_ids.device.type == "meta":
            return   # meta tensors have shapes and no values (a test's stand-in device)
        self._check_dtypes()
        self._check_layout()
        self._check_values()

    # ------------------------------------------------------------------ shapes
    @property
    def num_prompts(self) -> int:
        """B"""
        return self.input_ids.shape[0]

    @property
    def group_size(self) -> int:
        """G"""
        return self.input_ids.shape[1]

    @property
    def completion_length(self) -> int:
        """S, the completion columns."""
        return self.completion_mask.shape[-1]

    @property
    def prompt_length(self) -> int:
        """P, the prompt columns."""
        return self.input_ids.shape[-1] - self.completion_length

    @property
    def completion_ids(self) -> torch.Tensor:
        """(B, G, S) the completion columns of input_ids."""
        return self.input_ids[..., self.prompt_length:]

    @property
    def num_tokens(self) -> int:
        """Real completion tokens in the batch (dapo's num_items on one process)."""
        return int(self.completion_mask.sum())

    @property
    def num_completions(self) -> int:
        """B * G"""
        return self.num_prompts * self.group_size

    @property
    def lengths(self) -> torch.Tensor:
        """(B, G) real tokens of each completion."""
        return self.completion_mask.sum(-1)

    def to(self, device) -> "RolloutBatch":
        """The same batch on `device` (every tensor); itself when already there."""
        if all(getattr(self, f.name).device == torch.device(device) for f in fields(self)
               if getattr(self, f.name) is not None):
            return self
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if getattr(self, f.name) is not None})

    def flat(self) -> dict[str, torch.Tensor | None]:
        """The per-completion tensors as (N, ...) views, N = B * G, for a model forward."""
        N = self.num_prompts * self.group_size
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: None if value is None else value.reshape(N, *value.shape[2:])
                for name, value in values.items()}

    def rows(self, rows: slice) -> "MicroBatch":
        """Rows `rows` of the flat layout (completion b * G + g is row b * G + g): a micro-batch,
        which need not hold whole groups."""
        return MicroBatch(**{name: None if value is None else value[rows] for name, value in self.flat().items()})

    def select(self, keep: torch.Tensor) -> "RolloutBatch":
        """The groups where keep (B,) is True: e.g. the zero-std filter's
        `batch.select(~zero_std_groups(batch.rewards))`. Re-validated."""
        if keep.shape != (self.num_prompts,) or keep.dtype != torch.bool:
            raise ValueError(f"keep must be a bool tensor of shape (B,) = ({self.num_prompts},), "
                             f"got {keep.dtype} of shape {tuple(keep.shape)}")
        if not keep.any():
            raise ValueError("keep selects no group: a batch needs at least one prompt")
        # Gathered by index on the batch's device (works on any device, `meta` included).
        index = keep.cpu().nonzero()[:, 0].to(self.input_ids.device)
        return replace(self, **{f.name: getattr(self, f.name).index_select(0, index) for f in fields(self)
                                if getattr(self, f.name) is not None})

    # ------------------------------------------------------------------ checks
    def _check_shapes(self) -> None:
        ids = self.input_ids
        if ids.ndim != 3:
            raise ValueError(f"input_ids must have shape (B, G, T), got {tuple(ids.shape)}; flat (N, T) "
                             f"ids from a sampler reshape with .view(B, G, T)")
        B, G, T = ids.shape
        if G < 2:
            raise ValueError(f"input_ids needs G >= 2 completions per prompt to form a group, got G = {G}")
        if self.attention_mask.shape != ids.shape:
            raise ValueError(f"attention_mask must have the shape of input_ids {tuple(ids.shape)}, "
                             f"got {tuple(self.attention_mask.shape)}")
        if self.old_logp is None:
            self._check_shapes_from_completion_mask(B, G, T)
            return
        S = self.old_logp.shape[-1] if self.old_logp.ndim == 3 else None
        if self.old_logp.shape[:2] != (B, G) or self.old_logp.ndim != 3:
            raise ValueError(f"old_logp must have shape (B, G, S) = ({B}, {G}, S), got {tuple(self.old_logp.shape)}")
        if self.completion_mask.shape != self.old_logp.shape:
            width = self.completion_mask.shape[-1] if self.completion_mask.ndim == 3 else None
            if self.completion_mask.shape[:2] == (B, G) and width is not None and width > S:
                hint = (" (it spans the whole sequence)" if width == T else "")
                raise ValueError(
                    f"completion_mask has {width} columns but old_logp has S = {S}: the first {width - S} "
                    f"would cover prompt tokens{hint}; pass completion_mask[..., -{S}:]")
            raise ValueError(f"completion_mask must have the shape of old_logp {tuple(self.old_logp.shape)}, "
                             f"got {tuple(self.completion_mask.shape)}")
        if not 1 <= S < T:
            raise ValueError(f"old_logp has S = {S} completion columns but input_ids only T = {T}: "
                             f"the prompt needs at least one column (S < T)")
        for name in ("ref_logp", "sampler_logp"):
            value = getattr(self, name)
            if value is not None and value.shape != self.old_logp.shape:
                raise ValueError(f"{name} must have the shape of old_logp {tuple(self.old_logp.shape)}, "
                                 f"got {tuple(value.shape)}")
        self._check_group_shapes(B, G)

    def _check_shapes_from_completion_mask(self, B: int, G: int, T: int) -> None:
        mask = self.completion_mask
        if mask.ndim != 3 or mask.shape[:2] != (B, G):
            raise ValueError(f"completion_mask must have shape (B, G, S) = ({B}, {G}, S), got {tuple(mask.shape)}")
        S = mask.shape[-1]
        if not 1 <= S < T:
            raise ValueError(f"completion_mask has S = {S} completion columns but input_ids only T = {T}: "
                             f"the prompt needs at least one column (S < T)")
        for name in ("ref_logp", "sampler_logp"):
            value = getattr(self, name)
            if value is not None and value.shape != mask.shape:
                raise ValueError(f"{name} must have the shape of completion_mask {tuple(mask.shape)}, "
                                 f"got {tuple(value.shape)}")
        self._check_group_shapes(B, G)

    def _check_env_mask_shape(self) -> None:
        if self.env_mask is not None and self.env_mask.shape != self.completion_mask.shape:
            raise ValueError(f"env_mask must have the shape of completion_mask {tuple(self.completion_mask.shape)}, "
                             f"got {tuple(self.env_mask.shape)}")

    def _check_group_shapes(self, B: int, G: int) -> None:
        self._check_env_mask_shape()
        if self.truncated is not None and (self.truncated.shape != (B, G) or self.truncated.dtype != torch.bool):
            raise ValueError(f"truncated must be a bool tensor of shape (B, G) = ({B}, {G}), got "
                             f"{self.truncated.dtype} of shape {tuple(self.truncated.shape)}")
        if self.rewards.shape != (B, G):
            raise ValueError(f"rewards must have shape (B, G) = ({B}, {G}), got {tuple(self.rewards.shape)}")
        S = self.completion_mask.shape[-1]
        if self.advantages.shape not in ((B, G), (B, G, S)):
            raise ValueError(f"advantages must have shape (B, G) = ({B}, {G}) or, one per token (process "
                             f"supervision), (B, G, S) = ({B}, {G}, {S}), got {tuple(self.advantages.shape)}")

    def _check_dtypes(self) -> None:
        if self.input_ids.dtype not in _INTEGER_DTYPES:
            raise TypeError(f"input_ids must be an integer tensor, got dtype {self.input_ids.dtype}")
        for name in ("old_logp", "ref_logp", "sampler_logp", "rewards", "advantages"):
            value = getattr(self, name)
            if value is not None and not value.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
        for name in ("attention_mask", "completion_mask", "env_mask"):
            if getattr(self, name) is not None:
                _as_bool_mask(getattr(self, name), name)

    def _check_layout(self) -> None:
        attention = _as_bool_mask(self.attention_mask, "attention_mask")
        completion = _as_bool_mask(self.completion_mask, "completion_mask")
        P = self.prompt_length
        lengths = completion.sum(-1)
        if (lengths == 0).any():
            raise ValueError(f"every completion needs at least one token in completion_mask; "
                             f"{_where(lengths == 0)} has none")
        # An episode's columns hold the policy's tokens and the environment's, never both at once.
        written = completion
        if self.env_mask is not None:
            env = _as_bool_mask(self.env_mask, "env_mask")
            if (env & completion).any():
                raise ValueError(f"env_mask and completion_mask both mark a token (each is written by the policy "
                                 f"or by the environment): {_where(env & completion)}")
            written = completion | env
        # Right padding: the mask is 1...1 0...0, so it never increases along the row.
        restarts = written[..., 1:] & ~written[..., :-1]
        if restarts.any():
            b, g, s = (int(i) for i in restarts.nonzero()[0])
            name = "completion_mask" if self.env_mask is None else "completion_mask | env_mask"
            raise ValueError(f"{name} must be right-padded (1s then 0s); it restarts after a 0 "
                             f"at prompt {b}, completion {g}, completion column {s + 1}")
        # Left padding: the prompt mask never decreases, and its last column is real.
        prompt = attention[..., :P]
        if (~prompt[..., -1]).any():
            raise ValueError(f"every prompt must end at column P - 1 = {P - 1} (prompts are left-padded, "
                             f"completions start at column P = {P}); {_where(~prompt[..., -1])} has "
                             f"padding there")
        gaps = prompt[..., :-1] & ~prompt[..., 1:]
        if gaps.any():
            raise ValueError(f"prompts must be left-padded (0s then 1s in attention_mask[..., :P]); "
                             f"a gap follows a real token at {_where(gaps)}")
        # The completion columns hold exactly the completion's real tokens (an episode's: both writers').
        mismatch = attention[..., P:] != written
        if mismatch.any():
            b, g, s = (int(i) for i in mismatch.nonzero()[0])
            if written[b, g, s]:
                raise ValueError(f"completion_mask marks a token that attention_mask marks as padding: "
                                 f"prompt {b}, completion {g}, completion column {s}")
            raise ValueError(f"attention_mask marks a real token in the completion columns that "
                             f"completion_mask leaves out (a prompt token past column P - 1 = {P - 1}?): "
                             f"prompt {b}, completion {g}, completion column {s}")

    def _check_values(self) -> None:
        check_rewards(self.rewards, "rewards")
        completion = _as_bool_mask(self.completion_mask, "completion_mask")
        bad = ~torch.isfinite(self.advantages)
        if bad.any():
            raise ValueError(f"advantages must be finite, got {self.advantages[bad][0].item()} at {_where(bad)}")
        for name in ("old_logp", "ref_logp", "sampler_logp"):
            value = getattr(self, name)
            if value is None:
                continue
            check_logprob_values(name, value, completion, where=_where)


@dataclass(frozen=True)
class MicroBatch(StepTensors):
    """n rows of a RolloutBatch's flat layout, one completion each (`RolloutBatch.rows`): what
    one forward and backward of the trainer takes. The fields are RolloutBatch's, flattened:

        input_ids, attention_mask                  (n, T)
        completion_mask, old_logp, ref_logp,       (n, S)
        sampler_logp, env_mask
        rewards, advantages, truncated             (n,)   (per-token advantages: (n, S))

    Not re-validated: its rows come from a validated batch.
    """

    @property
    def loss_mask(self) -> torch.Tensor:
        """The tokens the loss counts: completion_mask, less the truncated completions' (overlong filtering)."""
        if self.truncated is None:
            return self.completion_mask
        return self.completion_mask * (~self.truncated[:, None]).to(self.completion_mask.dtype)

    @property
    def num_completions(self) -> int:
        """n, the rows."""
        return self.completion_mask.shape[0]

    @property
    def num_tokens(self) -> int:
        """Real completion tokens in the rows."""
        return int(self.completion_mask.sum())


def pad_rollouts(prompt_ids: list[list[int]], completion_ids: list[list[list[int]]], pad_token_id: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token lists -> (input_ids (B, G, P + S), attention_mask (B, G, P + S), completion_mask (B, G, S)).

    prompt_ids[b]: prompt b's tokens; completion_ids[b][g]: completion g of prompt b.
    Prompts are left-padded to the longest prompt P, completions right-padded to
    the longest completion S, with pad_token_id.
    """
    B = len(prompt_ids)
    if B == 0 or len(completion_ids) != B:
        raise ValueError(f"completion_ids must hold one group per prompt (B = {B}), got {len(completion_ids)}")
    G = len(completion_ids[0])
    if any(len(group) != G for group in completion_ids):
        raise ValueError(f"every prompt needs the same number of completions G, got "
                         f"{[len(group) for group in completion_ids]}")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token")
    if any(len(c) == 0 for group in completion_ids for c in group):
        raise ValueError("every completion needs at least one token (an immediate EOS counts)")
    P = max(len(p) for p in prompt_ids)
    S = max(len(c) for group in completion_ids for c in group)
    input_ids = torch.full((B, G, P + S), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(B, G, P + S, dtype=torch.long)
    completion_mask = torch.zeros(B, G, S, dtype=torch.long)
    for b, (prompt, group) in enumerate(zip(prompt_ids, completion_ids)):
        for g, completion in enumerate(group):
            input_ids[b, g, P - len(prompt):P] = torch.tensor(prompt)
            input_ids[b, g, P:P + len(completion)] = torch.tensor(completion)
            attention_mask[b, g, P - len(prompt):P + len(completion)] = 1
            completion_mask[b, g, :len(completion)] = 1
    return input_ids, attention_mask, completion_mask
