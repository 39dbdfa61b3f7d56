# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 10. Rollouts that lag
#
# Every trainer in chapters 1-9 is synchronous: it samples a rollout with the policy it has,
# updates on it, and only then samples again. The trainers a reader graduates to do not wait.
# prime-rl samples one update behind by default and allows up to 8 (`max_off_policy_steps`),
# verl has one-step-off and fully asynchronous trainers, open-instruct's `grpo_fast` has
# `async_steps`, TRL 1.16 an experimental `AsyncGRPOTrainer` with `max_staleness`: while the
# trainer updates, the engine already samples the next rollouts with the weights it last
# received. The rollout an update trains on then comes from the policy of **k updates
# earlier**. This chapter makes k a knob of our trainer (`rollout_lag`), shows on one batch
# what staleness does to the ratio and what each correction does about it, and measures
# what a lag costs the tiny reasoner, k = 0 to 16, with five corrections and three seeds.

# %%
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from grpo_edu.environment import tasks
from grpo_edu.training import placement, rollouts, trainer
from grpo_edu.training.config import TrainConfig
from grpo_edu.training.diagnose import diagnose
from grpo_edu.runtime.distributed import World
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.policy.models import load_policy
from grpo_edu.algorithm.offpolicy import Correction, correction_weights

torch.set_num_threads(2)
RESULTS = json.loads(Path("../benchmarks/results/lag.json").read_text())
runs = RESULTS["runs"]


def show_claims(claims):
    for claim, holds in claims.items():
        print(f"{'holds' if holds else 'FAILS'}: {claim}")


# %% [markdown]
# ## 1. Why trainers lag
#
# A synchronous step is three phases in a row: the **rollout** (sampling B x G completions),
# **scoring** (rewards, advantages, the reference's log-probs) and the **update** (a forward
# and a backward over the rollout, the optimizer step). On a GPU machine the rollout runs on
# the inference engine and the update on the trainer: while one works, the other waits. A
# trainer that lets the sampler run one rollout ahead overlaps them: the engine samples the
# rollout of step t + 1 (with the weights of step t) while the trainer updates on the rollout
# of step t. After the first step a step then takes the longer of the two, not their sum.
#
# The phase times below are the CPU tier's, measured (median seconds per step of the
# synchronous runs of section 3's benchmark, `time/rollout`, `time/scoring`, `time/update`
# in each run's metrics). The timeline draws four steps both ways.

# %%
synchronous = [r for r in runs if r["lag"] == 0]
phase = {name: float(np.median([r["time_split"][name] for r in synchronous]))
         for name in ("rollout", "scoring", "update")}
step_sync = sum(phase.values())
# Overlapped: the sampler's lane holds the rollouts, the trainer's lane scoring and update.
step_overlap = max(phase["rollout"], phase["scoring"] + phase["update"])
print("median seconds per step, the CPU tier's synchronous runs: "
      + ", ".join(f"{name} {seconds:.3f}" for name, seconds in phase.items()))
print(f"synchronous step {step_sync:.3f}; overlapped (after the first) {step_overlap:.3f}: "
      f"x{step_sync / step_overlap:.2f} if the two lanes ran on hardware of their own")

figure, axes = plt.subplots(2, 1, figsize=(9, 3.2), sharex=True)
colors = {"rollout": "tab:blue", "scoring": "tab:orange", "update": "tab:green"}
for step in range(4):
    start = step * step_sync
    for name in ("rollout", "scoring", "update"):
        axes[0].barh(0, phase[name], left=start, color=colors[name], edgecolor="white")
        start += phase[name]
    axes[1].barh(1, phase["rollout"], left=step * step_overlap, color=colors["rollout"], edgecolor="white")
    train = phase["rollout"] + step * step_overlap
    axes[1].barh(0, phase["scoring"], left=train, color=colors["scoring"], edgecolor="white")
    axes[1].barh(0, phase["update"], left=train + phase["scoring"], color=colors["update"], edgecolor="white")
axes[0].set_yticks([0], ["one device"])
axes[1].set_yticks([0, 1], ["trainer", "sampler"])
axes[0].set_title("synchronous: rollout, scoring, update in turn")
axes[1].set_title("overlapped (rollout_lag = 1): the sampler samples step t + 1 while the trainer updates on step t")
axes[1].set_xlabel("seconds")
for name, color in colors.items():
    axes[0].barh(0, 0, color=color, label=name)
axes[0].legend(loc="upper right", fontsize=8, ncols=3)
figure.tight_layout()

# %% [markdown]
# The gain is set by the share f of a synchronous step that sampling takes: the overlapped
# step is max(f, 1 - f) of the synchronous one, so the speed-up is 1 / max(f, 1 - f), at most
# 2x with one sampler beside one trainer (f = 1/2); the larger speed-ups reported for fully
# asynchronous trainers on many GPUs come from giving the sampler hardware the trainer would
# otherwise leave idle. The cost is what this chapter measures: the rollout an update trains
# on is stale.

# %%
for f in (0.3, 0.5, 0.6, 0.7, 0.8, 0.9):
    print(f"sampling {f:.0%} of a synchronous step: overlapped step {max(f, 1 - f):.0%} of it, x{1 / max(f, 1 - f):.2f}")
f_cpu = phase["rollout"] / step_sync
print(f"this CPU tier: sampling {f_cpu:.0%} of a step")

# %% [markdown]
# What overlap buys on this CPU is another matter: the two lanes above share the same two
# cores. The trainer has the overlap: `rollout_overlap = true` (with `rollout_lag` >= 1) samples
# the next rollout in a background thread while the main thread updates, from the sampler's own
# copy of the weights, synced from the policy between rollouts and never during one (as a vLLM
# engine's are). It is the same run bit for bit (`tests/test_overlap.py`), so whether to use it
# is a question of time only. `benchmarks/overlap.py` measured it on this book's 2-core machine
# (the machine's own kernels, k = 1, 60 steps, each setting in a fresh process, twice):

# %%
measured = json.loads(Path("../benchmarks/results/overlap.json").read_text())
print(f"{measured['machine']['cpu_count']} cores, threads = {measured['settings']['threads']}: "
      f"median seconds per step, and per phase")
for name, figures in measured["figures"].items():
    print(f"  {name:<20} step {figures['seconds_per_step']:.3f}   " + "   ".join(
        f"{p} {t:.3f}" for p, t in figures["phase_median_seconds"].items()))
alone, beside = (measured["figures"][name] for name in ("sequential", "overlap"))
print(f"overlap against sequential: x{alone['seconds_per_step'] / beside['seconds_per_step']:.2f} the speed; "
      f"the update beside a rollout takes x{beside['phase_median_seconds']['update'] / alone['phase_median_seconds']['update']:.2f} "
      f"its time alone, the rollout x{beside['phase_median_seconds']['rollout'] / alone['phase_median_seconds']['rollout']:.2f}")
print("the same final weights in every setting:", len({w for f in measured["figures"].values() for w in f["weights"]}) == 1)

# %% [markdown]
# On two cores the lanes do not add hardware, they split it: each phase runs at about half
# its speed beside the other, and the overlapped step is no faster than the sequential one
# (slower, by the two thread teams' contention). With OpenMP's threads told to sleep while
# they wait (`OMP_WAIT_POLICY=PASSIVE`) the overlap does beat the sequential run of that
# setting, but only because sleeping threads slow a run that has the cores to itself even
# more. So the book's runs keep `rollout_overlap = false`: a lag costs no time here and
# saves none. The timeline's speed-up needs a sampler on hardware of its own, a GPU's
# inference engine beside its trainer: `configs/gpu-1x-async.toml` is that run on one GPU
# (vLLM's own weights are the sampler's, synced between rollouts), `configs/h100-8x-async.toml`
# on eight under torchrun (each rank's sampler gathers its rewards in a process group of its
# own, beside the update's collectives), and `grpo-edu doctor --gpu` measures both ways there.
#
# ## 2. Staleness on a batch you can see
#
# Take the starting policy, let it sample one group of completions, then train it for four
# updates (the default config, as chapter 6 does). The rollout is now four updates old: the
# policy an update would start from, pi_now, is not the policy that sampled, pi_then. For
# every token o_t the ratio r_t = pi_now(o_t) / pi_then(o_t) measures how stale it is.

# %% tags=["platform-numerics"]
config = TrainConfig.from_toml("../configs/cpu-tiny.toml", [
    "steps=4", "eval_every=1000", "eval_size=16", "checkpoint_every=0", "progress=false",
    "output_dir='../runs/chapter-10/four-updates'"])
then, tokenizer = load_policy()
engine = placement.make_engine(config, placement.build_models(config, World(), then), tokenizer)
torch.manual_seed(0)
samples = tasks.make_dataset("arithmetic", n=2, split="train", seed=10)
rollout = rollouts.roll_out(config, samples, tokenizer, engine)
now = trainer.train(config, log=lambda line: None).policy

mask = rollout.completion_mask.bool()
input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
attention = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
with torch.no_grad():
    now_logp = completion_logprobs(now, input_ids, attention, rollout.completion_mask,
                                   temperature=config.temperature)
then_logp = rollout.sampler_logp
r = torch.exp(now_logp - then_logp).where(mask, torch.ones_like(now_logp))
print(f"{mask.shape[0]} completions ({len(samples)} prompts x G = {config.num_generations}), "
      f"{int(mask.sum())} tokens; r from {r[mask].min():.3f} to {r[mask].max():.3f}, "
      f"|log r| {(now_logp - then_logp)[mask].abs().mean():.3f} on average\n")
row = int(mask.sum(-1).argmax())
tokens = [tokenizer.decode([int(t)]) for t in rollout.completion_ids[row][mask[row]]]
print(f"completion {row}: " + "".join(tokens).replace("\n", " "))
print(" ".join(f"{t!r:>6}" for t in tokens))
print(" ".join(f"{x:>6.3f}" for x in r[row][mask[row]].tolist()))

# %% [markdown]
# What each setting does with those tokens, as the trainer's loss sees them
# (`grpo_edu.algorithm.offpolicy.correction_weights`; the README's table lists the config values):
#
# - **none** (`old_logprobs = "proximal"`, no weight): pi_old is pi_now, every ratio is 1, and
#   the update treats the stale rollout as fresh: it averages A x grad log pi_now over
#   pi_then's samples as if pi_now had drawn them, a biased estimate of pi_now's gradient.
# - **clip** (`old_logprobs = "recomputed"`, the default): pi_old is pi_then, so the clipped
#   ratio starts at r instead of 1. A token whose r is already outside [0.8, 1.2] in the
#   direction its advantage pushes gets no gradient at all: the trust region sees the
#   staleness, and spends it.
# - **tis** (`tis_cap = 2`): pi_old is pi_now (the ratio starts at 1) and each token's policy
#   term is weighed by min(r, 2): the importance weight that turns an average over pi_then's
#   samples into one over pi_now's, truncated so that no token weighs more than 2.
# - **token mask** (`is_mask = "token"`, band [0.5, 2]): weigh by r inside the band, drop the
#   token outside it (IcePop).
# - **sequence mask** (`is_mask = "sequence"`, band [0.8, 1.25]): keep or drop each response
#   whole, by the geometric mean of its tokens' r.

# %% tags=["platform-numerics"]
corrections = {
    "tis": Correction(tis_cap=2.0),
    "token mask": Correction(is_mask="token", is_mask_band=(0.5, 2.0)),
    "sequence mask": Correction(is_mask="sequence", is_mask_band=(0.8, 1.25)),
}
weights = {name: correction_weights(now_logp, then_logp, mask, c)[0] for name, c in corrections.items()}
print(f"{'completion ' + str(row):<16}" + " ".join(f"{t!r:>6}" for t in tokens))
for name, w in weights.items():
    print(f"{name:<16}" + " ".join(f"{x:>6.3f}" for x in w[row][mask[row]].tolist()))
outside_clip = ((r < 0.8) | (r > 1.2)) & mask
print(f"\nover all {int(mask.sum())} tokens: outside the clip's [0.8, 1.2] {outside_clip.sum() / mask.sum():.1%}; "
      f"truncated by tis {((r > 2.0) & mask).sum() / mask.sum():.1%}; dropped by the token mask "
      f"{((weights['token mask'] == 0) & mask).sum() / mask.sum():.1%}; by the sequence mask "
      f"{((weights['sequence mask'] == 0) & mask).sum() / mask.sum():.1%}")
geometric = torch.exp((now_logp - then_logp).where(mask, torch.zeros_like(r)).sum(-1) / mask.sum(-1))
product = torch.exp((now_logp - then_logp).where(mask, torch.zeros_like(r)).sum(-1))
print("per completion, geometric mean of r: " + " ".join(f"{x:.3f}" for x in geometric.tolist()))
print("per completion, product of r:        " + " ".join(f"{x:.3f}" for x in product.tolist()))

# %% [markdown]
# The product of a response's ratios (the sequence's likelihood ratio, what TRL 1.16's
# `sequence_mask` tests) grows with the response's length even when every token is only a
# little stale; the geometric mean is the product's per-token rate, comparable across
# lengths, which is why the sequence mask here uses it (verl's geometric mask does the same).
#
# ## 3. Measured: k = 0 to 16, five corrections, three seeds
#
# `benchmarks/lag.py` trains the grid: the default config (`configs/cpu-tiny.toml`) for
# 150 steps, its learning rate decaying over them, with `rollout_lag` = k, for each
# correction and seeds 0, 1 and 2, held-out greedy accuracy on 256 problems every 25 steps.
# At k = 0 there is nothing to correct ("none" and "clip" are the same run, bit for bit), so
# the synchronous baseline is trained once per seed. The runs take about forty minutes, so
# the script writes `benchmarks/results/lag.json`, which this chapter reads;
# `tests/test_lag_benchmark.py` re-trains one of them and checks its numbers are the
# file's, exactly.

# %%
NAMES = list(RESULTS["corrections"])
LAGS = RESULTS["lags"]   # the grid; section 4 pushes k beyond it
base = [r["final_accuracy"] for r in runs if r["lag"] == 0]


def finals(correction, lag):
    return [r["final_accuracy"] for r in runs if r["correction"] == correction and r["lag"] == lag]


def cell(values):
    return f"{np.mean(values):.3f} [{min(values):.3f}, {max(values):.3f}]" if values else "-"


print(f"final held-out accuracy after {RESULTS['steps']} steps: mean of seeds {RESULTS['seeds']} "
      f"[lowest, highest seed]; start {runs[0]['start_accuracy']:.3f}\n")
print(f"{'k':>3}  " + "".join(f"{name:<24}" for name in NAMES))
for lag in LAGS:
    if lag == 0:
        print(f"{0:>3}  {cell(base):<24}(synchronous: the same run for every correction)")
        continue
    print(f"{lag:>3}  " + "".join(f"{cell(finals(name, lag)):<24}" for name in NAMES))

# %%
figure, axes = plt.subplots(1, 2, figsize=(11, 4))
for name in NAMES:
    means = [np.mean(base)] + [np.mean(finals(name, lag)) for lag in LAGS if lag]
    lows = [min(base)] + [min(finals(name, lag)) for lag in LAGS if lag]
    highs = [max(base)] + [max(finals(name, lag)) for lag in LAGS if lag]
    line, = axes[0].plot(LAGS, means, marker="o", label=name)
    axes[0].fill_between(LAGS, lows, highs, color=line.get_color(), alpha=0.12)
axes[0].set_xscale("symlog", linthresh=1)
axes[0].set_xticks(LAGS, [str(k) for k in LAGS])
axes[0].set_xlabel("rollout_lag k")
axes[0].set_ylabel("final held-out greedy accuracy")
axes[0].set_title("mean of 3 seeds; the band spans them")
axes[0].legend(fontsize=8)
steps = [step for step, _ in runs[0]["eval"]]
for name in NAMES:
    curves = np.array([[a for _, a in r["eval"]] for r in runs if r["correction"] == name and r["lag"] == max(LAGS)])
    axes[1].plot(steps, curves.mean(axis=0), label=f"{name}, k = {max(LAGS)}")
axes[1].plot(steps, np.array([[a for _, a in r["eval"]] for r in runs if r["lag"] == 0]).mean(axis=0),
             color="black", linestyle="--", label="synchronous")
axes[1].set_xlabel("training step")
axes[1].set_title(f"held-out accuracy during training, k = {max(LAGS)}")
axes[1].legend(fontsize=8)
figure.tight_layout()

# %% [markdown]
# What the corrections saw and did, per step (medians over the steps after the lag is
# reached, and over seeds): the ratio's spread under "clip" (pi_then against the policy
# being updated, whose forward starts each update), the sampler gap under the proximal
# settings (mean |log r|), and the share of tokens each correction truncated or dropped.

# %%
def median_after(run, key):
    values = [v for v, s in zip(run["steps"][key], run["steps"]["staleness"]) if v is not None and s == run["lag"]]
    return float(np.median(values)) if values else math.nan


print(f"{'k':>3}  {'clip: ratio min..max':<22}{'clip: clipped':<15}{'none: mean|log r|':<19}"
      f"{'tis: truncated':<16}{'token: masked':<15}{'sequence: masked':<16}")
for lag in LAGS[1:]:
    def of(name, key):
        return float(np.median([median_after(r, key) for r in runs if r["correction"] == name and r["lag"] == lag]))
    print(f"{lag:>3}  {of('clip', 'ratio/min'):.3f}..{of('clip', 'ratio/max'):<16.3f}"
          f"{of('clip', 'clip_ratio/region'):<15.2%}{of('none', 'sampler_gap/mean_abs'):<19.4f}"
          f"{of('tis', 'tis/truncated'):<16.2%}{of('token_mask', 'is/masked'):<15.2%}"
          f"{of('sequence_mask', 'is/masked'):<16.2%}")

# %% [markdown]
# Read together, the three tables say where lag starts to cost and what buys it back. Without
# a correction the cost starts at once: every uncorrected seed at k = 2 ends below every
# synchronous seed, and the mean falls with every doubling of k, to about 0.2 below the
# synchronous runs at k = 16. The staleness it ignores is small per token (a sampler gap of
# a few hundredths of a nat at k = 1-2), but the error of ignoring it is systematic, made
# again at every step, not noise that averages out.
#
# The corrections that **weigh each token by r** (the clip, whose unclipped ratio starts at r;
# truncated importance sampling; the token mask, which is r inside its band) buy most of it
# back: up to k = 8 they end within about 0.05 of the synchronous runs, which is the seeds'
# own spread. At k = 16 truncated importance sampling still does, while the clip alone falls
# further. The weights are rarely truncated or masked: at k = 16 the cap truncates under 1%
# of the tokens and the token mask drops under 4% (median step), so both mostly apply r
# itself. The sequence mask keeps or drops whole responses and weighs nothing: at the band
# used here it drops up to 6% of the tokens (median step), and from k = 4 on it ends between
# the uncorrected runs and the weighted ones. It guards against a sampler that is badly off for some responses (a bf16
# engine with a bad kernel, a stale weight sync), not against a drift every token shares.
#
# ## 4. Pushing k until training breaks, and the doctor
#
# Beyond the grid, seed 0 only: k = 32 and 64 (the sampler 64 updates ahead of a 150-update
# run: the first 64 updates all train on the starting policy's rollouts), without a
# correction, with the clip, and with truncated importance sampling. Then the doctor on each
# run's metrics (as the results file kept them: what `grpo-edu doctor` reads from
# metrics.jsonl), beside the synchronous run.

# %%
BASE = TrainConfig.from_toml("../configs/cpu-tiny.toml").to_dict()


def config_of(run):
    return {**BASE, **RESULTS["settings"], "steps": RESULTS["steps"], "seed": run["seed"],
            "rollout_lag": run["lag"], **RESULTS["corrections"][run["correction"]]}


def history_of(run):
    """The run's steps as the doctor reads metrics.jsonl: the keys the results file kept."""
    return [{"step": i + 1, **{key: values[i] for key, values in run["steps"].items() if values[i] is not None}}
            for i in range(RESULTS["steps"])]


pushed = sorted((r for r in runs if r["lag"] > max(LAGS)), key=lambda r: (r["correction"], r["lag"]))
print(f"{'run':<22}{'final accuracy':<16}findings")
for run in [r for r in runs if r["lag"] == 0 and r["seed"] == 0] + pushed:
    found = diagnose(history_of(run), config_of(run))
    print(f"{run['correction'] + ', k = ' + str(run['lag']):<22}{run['final_accuracy']:<16.3f}"
          + (", ".join(f.detector for f in found) or "-"))
worst = min(pushed, key=lambda r: r["final_accuracy"])


def peak(run, key):
    """The highest median of `key` over 10 consecutive steps at the run's full lag."""
    values = [v for v, s in zip(run["steps"][key], run["steps"]["staleness"]) if v is not None and s == run["lag"]]
    return max(np.median(values[i - 10:i]) for i in range(10, len(values) + 1))


fresh = np.median([v for r in runs if r["lag"] == 0 for v in r["steps"]["sampler_gap/mean_abs"]])
print(f"\nsampler gap of the synchronous runs (fresh rollouts), median step: {fresh:.0e}")
print("highest 10-step median at the full lag, uncorrected runs' sampler gap: " + ", ".join(
    f"k = {lag} {min(g):.3f}-{max(g):.3f}" for lag in sorted({r['lag'] for r in runs if r['lag']})
    if (g := [peak(r, "sampler_gap/mean_abs") for r in runs if r["correction"] == "none" and r["lag"] == lag])))
print(f"the clip's runs, share of tokens clipped: at most {max(peak(r, 'clip_ratio/region') for r in runs if r['correction'] == 'clip' and r['lag']):.3f}")
print()
for finding in diagnose(history_of(worst), config_of(worst)):
    print(finding)

# %% [markdown]
# At k = 64 the uncorrected run learns nothing: 150 updates end where the policy started,
# and none of chapter 7's detectors fires on it (nor on any other run of the grid). The sign
# is the one the uncorrected setting leaves in the metrics: with `old_logprobs = "proximal"`
# the sampler gap (mean |log pi_now - log pi_sampler| per token, which on the CPU tier is
# ~1e-7 for fresh rollouts) *is* the staleness. The doctor's `stale_rollouts` flags it at 0.06 nats per token
# over 10 consecutive steps at the full lag, where the grid's uncorrected runs part from the
# synchronous ones (between k = 1, 0.04-0.05, and k = 2, 0.08-0.09). With a correction the
# same gap is what the weights correct, and it is not flagged; with the clip, the clipped
# share stayed at or below 0.082 up to k = 64, so no threshold there would separate anything.
# Over the whole grid, `stale_rollouts` on each run, seeds flagged of 3:

# %%
print(f"{'k':>3}  " + "".join(f"{name:<15}" for name in NAMES))
flagged = {}
for lag in LAGS[1:]:
    row = []
    for name in NAMES:
        mine = [r for r in runs if r["correction"] == name and r["lag"] == lag]
        flagged[name, lag] = sum(any(f.detector == "stale_rollouts" for f in diagnose(history_of(r), config_of(r)))
                                 for r in mine)
        row.append(f"{flagged[name, lag]} of {len(mine)}")
    print(f"{lag:>3}  " + "".join(f"{cell:<15}" for cell in row))


# %% [markdown]
# What this chapter claims, checked against the numbers above:

# %%
mean = {(name, lag): np.mean(finals(name, lag)) for name in NAMES for lag in LAGS if lag}
sync = np.mean(base)
claims = {
    "without a correction the mean final accuracy falls with every k, from below the synchronous mean at k = 1":
        all(mean["none", a] > mean["none", b] for a, b in zip(LAGS[1:], LAGS[2:])) and mean["none", 1] < sync,
    "without a correction, every seed at k = 2 ends below every synchronous seed": max(finals("none", 2)) < min(base),
    "at k = 16 the uncorrected runs end more than 0.15 below the synchronous ones": sync - mean["none", 16] > 0.15,
    "the clip, TIS and the token mask end within 0.06 of the synchronous mean up to k = 8": all(
        sync - mean[name, lag] < 0.06 for name in ("clip", "tis", "token_mask") for lag in LAGS[1:] if lag <= 8),
    "every correction ends above no correction at every k >= 2": all(
        mean[name, lag] > mean["none", lag] for name in NAMES if name != "none" for lag in LAGS if lag >= 2),
    "at k = 64 the uncorrected run learns nothing (less than 0.05 above its start)": all(
        r["final_accuracy"] - r["start_accuracy"] < 0.05 for r in pushed if (r["correction"], r["lag"]) == ("none", 64)),
    "stale_rollouts flags every uncorrected seed from k = 2, and nothing else in the grid": all(
        flagged[name, lag] == (3 if name == "none" and lag >= 2 else 0) for name in NAMES for lag in LAGS[1:]),
}
show_claims(claims)

# %% [markdown]
# ## Exercises
#
# **10.1 The sequence mask.** Write `my_sequence_mask(old_logp, sampler_logp, mask, band)`:
# the weight of every token under `is_mask = "sequence"`, (N, S) like the inputs: 1 for every
# token of a response whose geometric-mean ratio exp(mean over its real tokens of
# (old_logp - sampler_logp)) lies in [low, high], 0 for every token of one outside. `mask` is
# bool, True on a response's real tokens; the padding after them holds garbage. The checker
# compares with `grpo_edu.algorithm.offpolicy` on responses of different lengths, with small and large
# mismatches, and on long responses whose every token is a little off.
#
# <details><summary>Hint</summary>
#
# Zero the log-ratio on padding before you sum it, and divide the sum by each response's own
# number of real tokens, not by S. Compare the mean of the logs with the band's logs, or its
# exponential with the band: the same test. The product of the ratios (the sum of the logs,
# not divided) is the likelihood ratio of the whole response, and it leaves any band on a
# long response that is only slightly stale everywhere.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import torch
#
#
# def my_sequence_mask(old_logp, sampler_logp, mask, band):
#     low, high = band
#     log_r = (old_logp - sampler_logp).masked_fill(~mask, 0.0)
#     geometric = torch.exp(log_r.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True))
#     return ((geometric >= low) & (geometric <= high)).to(old_logp.dtype).expand_as(old_logp)
#
#
# ch10.check_sequence_mask(my_sequence_mask)
# ```
#
# </details>

# %%
from grpo_edu.exercises import ch10


def my_sequence_mask(old_logp, sampler_logp, mask, band):
    low, high = band
    r = torch.exp(old_logp - sampler_logp)
    return ((r >= low) & (r <= high)).to(old_logp.dtype)   # per token: fix me


ch10.check_sequence_mask(my_sequence_mask)
