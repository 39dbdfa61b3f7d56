"""Deliberate bugs, for the failure lab (chapter 7, "When GRPO goes wrong").

Some of GRPO's classic failures have a knob in the config (a learning rate, beta, the loss
type); others are bugs that no honest config can express: a loss mask one column off, a
trainer that computes log-probs at another temperature than the sampler's, a reference that
is the policy itself. The lab injects those into a run that grpo_edu.training.trainer.set_up
built, through the seams the run already has (its models' log-prob functions, its reference,
its sampler's advantage function and roll-out stage, its optimise stage): `Faults(...).apply(run)`, or the
whole run with `Faults(...).train(config)`. Never a config key, and never an argument of the
trainer, so that no run file can switch one on by accident; every run that has one says so
in its log and its summary.json.

    field                 the bug it injects
    off_by_one            the trainer's log-prob function misaligned by one column (the
                          classic input_ids[:, :-1] / input_ids[:, 1:] slip): each completion
                          position holds the log-prob of the token after it, so the first
                          token is never trained and EOS's position trains the padding after it
    trainer_temperature   the trainer's log-probs (policy, pi_old, reference) at this
                          temperature, while the sampler keeps config.rollout.temperature
    alias_reference       the reference is the policy object itself (the start-up check
                          that refuses an aliased reference is bypassed for this run only)
    refresh_old_logprobs  pi_old recomputed at the start of every pass over the rollout
                          (num_iterations > 1), instead of fixed to the policy that sampled
    split_groups          each group's advantages computed in this many separate parts, as
                          when a careless sampler puts a prompt's G completions on several
                          ranks and each normalises its share: the 2-shard simulation
    env_tokens_in_loss    multi-turn episodes (config.rollout.environment) whose environment tokens
                          are scored as if the policy had written them: in the loss, the KL,
                          the ratio and every normaliser (a trainer that masks only padding)
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace

import torch

from grpo_edu.runtime.distributed import LogprobModel, World
from grpo_edu.training import trainer
from grpo_edu.training.batch import RolloutBatch
from grpo_edu.training.placement import Models, logprob_function
from grpo_edu.training.plan import Plan
from grpo_edu.training.update import optimise, policy_logprobs


@dataclass(frozen=True)
class Faults:
    off_by_one: bool = False
    trainer_temperature: float | None = None
    alias_reference: bool = False
    refresh_old_logprobs: bool = False
    split_groups: int = 1
    env_tokens_in_loss: bool = False

    def __post_init__(self):
        if self.trainer_temperature is not None and not (
                isinstance(self.trainer_temperature, (int, float)) and self.trainer_temperature > 0):
            raise ValueError(f"Faults.trainer_temperature: expected None or a number > 0, "
                             f"got {self.trainer_temperature!r}")
        if not (isinstance(self.split_groups, int) and self.split_groups >= 1):
            raise ValueError(f"Faults.split_groups: expected an int >= 1, got {self.split_groups!r}")

    def active(self) -> dict:
        """The injected faults: {field: value} of those that differ from a correct run."""
        return {key: value for key, value in asdict(self).items() if value != getattr(NONE, key)}

    def check(self, config) -> None:
        """Refuse a fault that the config makes meaningless (it would inject nothing)."""
        if self.split_groups > 1 and config.rollout.num_generations % self.split_groups:
            raise ValueError(f"Faults.split_groups: expected a divisor of num_generations "
                             f"({config.rollout.num_generations}), got {self.split_groups}")
        if self.alias_reference and config.loss.beta == 0.0:
            raise ValueError("Faults.alias_reference: expected a run with a reference (beta > 0), got beta = 0")
        if self.alias_reference and config.lora.lora_rank:
            raise ValueError(f"Faults.alias_reference: expected a run with a reference copy, got lora_rank = "
                             f"{config.lora.lora_rank} (the reference is the policy with its adapters off)")
        if self.env_tokens_in_loss and not config.rollout.environment:
            raise ValueError("Faults.env_tokens_in_loss: expected a multi-turn run (config key 'environment' set), "
                             "got environment = ''")
        if self.refresh_old_logprobs and config.optimisation.num_iterations == 1:
            raise ValueError("Faults.refresh_old_logprobs: expected num_iterations > 1 (one pass has nothing "
                             "to refresh), got 1")

    def logprob_fn(self, logprob_fn):
        """The trainer's log-prob function (model, input_ids, attention_mask, completion_mask,
        entropy=False) -> (n, S), with off_by_one applied."""
        if not self.off_by_one:
            return logprob_fn

        def misaligned(model, input_ids, attention_mask, completion_mask, entropy=False):
            mask = completion_mask.bool()
            wider = mask.clone()
            wider[..., 1:] |= mask[..., :-1]   # one column past each completion's end (the padding)
            attention = attention_mask.clone()   # the padding column attended too: causal, so
            attention[..., -mask.shape[-1]:] |= wider.to(attention.dtype)   # no earlier logit changes
            logp = logprob_fn(model, input_ids, attention, wider.to(completion_mask.dtype),
                              **({"entropy": True} if entropy else {}))
            shifted = torch.zeros_like(logp)
            shifted[..., :-1] = logp[..., 1:]   # position j: the log-prob of token j + 1
            return shifted.masked_fill(~mask, 0.0)
        return misaligned

    def split_advantages(self, advantage_fn, rewards: torch.Tensor) -> torch.Tensor:
        """advantage_fn applied to each group's split_groups parts separately: (B, G) -> (B, G)."""
        B, G = rewards.shape
        parts = advantage_fn(rewards.reshape(B * self.split_groups, G // self.split_groups))
        return parts.reshape(B, G)

    def apply(self, run) -> None:
        """Inject the active faults into `run` (grpo_edu.training.trainer.Run, one process, before
        its first step); refused where the config makes one meaningless. Said in the log, and
        written into summary.json."""
        self.check(run.config)
        if not self.active():
            return
        if run.world.distributed:
            raise ValueError(f"faults: the failure lab injects faults in one process, got {run.world.size} processes")
        run.say(f"FAULTS INJECTED (the failure lab): {self.active()}")
        run.notes["faults"] = self.active()
        models = run.models
        if self.alias_reference:   # the reference's log-probs are the policy's own
            models.reference = models.policy
            models.reference_logprobs = LogprobModel(models.policy, models.train_logprobs.logprob_fn)
        # policy, pi_old and reference alike (one process: plain LogprobModels; LoRA's reference
        # is the policy's own module, whose function it uses)
        scored = [module for module in (models.train_logprobs, models.reference_logprobs)
                  if isinstance(module, LogprobModel)]
        if self.trainer_temperature is not None:   # the trainer's log-probs at another temperature
            hot = logprob_function(run.config.replace(temperature=self.trainer_temperature), run.world)
            for module in scored:
                module.logprob_fn = hot
        for module in scored:
            module.logprob_fn = self.logprob_fn(module.logprob_fn)
        sampler = run.sampler
        if self.split_groups > 1:
            sampler.advantage_fn = functools.partial(self.split_advantages, sampler.advantage_fn)
        if self.refresh_old_logprobs:
            run.optimise = optimise_refreshing_old
        if self.env_tokens_in_loss:
            roll_out = sampler.roll_out
            sampler.roll_out = lambda *args, **kwargs: leak_environment(roll_out(*args, **kwargs))

    def train(self, config, *, stop_after: int | None = None, **set_up_arguments):
        """grpo_edu.training.trainer.train(config, ...) with these faults injected: set_up, apply,
        then the loop. Returns its RunResult."""
        self.check(config)   # before anything is built
        run = trainer.set_up(config, **set_up_arguments)
        self.apply(run)
        return trainer.loop(run, stop_after)


NONE = Faults()


def leak_environment(rollout):
    """env_tokens_in_loss: the episode's environment tokens marked as the policy's (scored, and
    with the sampler's log-prob 0 there: the sampler never drew them), env_mask gone."""
    return replace(rollout, completion_mask=rollout.completion_mask | rollout.env_mask, env_mask=None)


def optimise_refreshing_old(config, settings, models: Models, optimizer, scheduler, batch: RolloutBatch,
                            plan: Plan, world: World = World()) -> dict[str, float]:
    """refresh_old_logprobs in optimise's place: num_iterations passes, pi_old recomputed from the
    current policy at the start of each (one pass of optimise each), instead of fixed to the
    policy that sampled. Metrics as optimise's: the last step's, the first step's learning rate
    and sampler gap, the optimizer steps of all passes."""
    one_pass = config.replace(num_iterations=1)
    passes = []
    for _ in range(config.optimisation.num_iterations):
        old_logp = policy_logprobs(one_pass, models, batch, plan, world)
        passes.append(optimise(one_pass, settings, models, optimizer, scheduler, replace(batch, old_logp=old_logp),
                               plan, world))
    merged = dict(passes[-1])
    merged["learning_rate"] = passes[0]["learning_rate"]
    merged["optimizer_steps"] = sum(p["optimizer_steps"] for p in passes)
    merged.update({k: v for k, v in passes[0].items() if k.startswith("sampler_gap/")})
    return merged
