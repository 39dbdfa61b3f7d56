"""One process against two: step time and the bytes the ranks exchange, on the CPU tier.

    python benchmarks/distributed.py [--steps 30] [--warmup 5] [--rounds 3] [--set KEY=VALUE ...]

Step time. The default CPU-tier run (configs/cpu-tiny.toml, with --steps steps, no
evaluation but the first and the last on 32 problems, no progress bar) is trained four
ways, each launched as a reader would launch it:

    1 process, 2 threads         grpo-edu train (python -m grpo_edu train)
    1 process, 1 thread          the same with threads = 1: the per-core baseline
    2 processes, ddp, 1 thread   torchrun --standalone --nproc-per-node 2 -m grpo_edu train
    2 processes, fsdp2, 1 thread   ... --set parallelism=fsdp2

A step's time is the trainer's own: time/rollout + time/scoring + time/update of each
line of rank 0's metrics.jsonl (what summary.json's median_steps_per_second is made
of). The first --warmup steps of every run are dropped (first calls, allocator, FSDP's
lazy set-up); the table prints the median over the remaining steps of all rounds, and
the range of the rounds' own medians. The four runs take turns, and which goes first
rotates from round to round, so that a shared machine's drift falls on all of them.

What to expect on a 2-core machine: no speed-up worth the name. Two processes of one
thread hold the same two cores as one process of 2 threads (the default run), and each
step adds the communication (gloo, over local TCP) and the work every rank does alike
(the whole batch's prompts and sampling random numbers are drawn on every rank, and the
gathered rewards, advantages and plan computed on every rank). Where one process
leaves its second thread idle (the sampler's token-by-token loop, small kernels that do
not split across threads), two processes can gain a little; where communication weighs
(fsdp2 gathers the parameters for every forward, and the sampler's weights after every
update), they lose. The 1-thread row is the per-core baseline: two processes hold two
cores, so at best they halve its time. More ranks pay off where each has cores, or a
GPU, of its own.

Bytes. Two more 2-process runs (ddp, fsdp2; --bytes-steps steps each) count every
collective the training loop launches, by patching the launch points under the
trainer: a DDP communication hook sees each gradient bucket; torch.distributed's
all_gather_single / reduce_scatter_single (FSDP2's parameter gathers and gradient
reduce-scatters), the DTensor collectives (the sampler's whole weights after each
update, the gradient norm) and the trainer's own all_gather / all_reduce (rewards,
lengths, metrics) are wrapped. Each collective's payload is the size of the whole
tensor it reduces or assembles (an all-gather's output, a reduce-scatter's input). The
counts are per training step, between the starts of consecutive steps (the first
step, which also sets FSDP2 up, and the last, which holds the final evaluation and
checkpoint, are not counted). Beside them the
script prints the figures computed from the model's parameter count P: DDP all-reduces
P x 4 bytes (float32 gradients) once per optimizer step; FSDP2 all-gathers the
parameters for every forward of a sharded module and reduce-scatters the gradients once
per optimizer step. What a rank sends for a payload of X bytes, with ring algorithms,
is computed too, not measured: about 2 (N - 1) / N x X for an all-reduce, (N - 1) / N
x X for an all-gather or a reduce-scatter.

`--set KEY=VALUE` (repeatable) is passed to every run (e.g. --set engine=hf).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROCESSES = 2
PARTS = ("rollout", "scoring", "update")   # a step's wall-clock, as the trainer logs it
# Every run: no evaluation but the first and the last, on few problems; no bar; one checkpoint at the end.
COMMON = ["eval_every=1000", "eval_size=32", "progress=false", "checkpoint_every=0"]
RUNS = [  # (label, processes, threads per process, parallelism)
    ("1 process, 2 threads", 1, 2, "ddp"),
    ("1 process, 1 thread", 1, 1, "ddp"),
    ("2 processes, ddp, 1 thread each", PROCESSES, 1, "ddp"),
    ("2 processes, fsdp2, 1 thread each", PROCESSES, 1, "fsdp2"),
]
# What each counted collective is, in the order the table prints them.
CATEGORIES = {
    "ddp_allreduce": "DDP gradient all-reduce (its buckets)",
    "fsdp_allgather": "FSDP2 parameter all-gather",
    "fsdp_reducescatter": "FSDP2 gradient reduce-scatter",
    "dtensor_allgather": "DTensor gathers (the sampler's whole weights)",
    "dtensor_allreduce": "DTensor all-reduces (the gradient norm)",
    "trainer": "the trainer's all_gather / all_reduce (rewards, lengths, metrics)",
}


def environment(threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def launch(arguments: list[str], processes: int, threads: int) -> None:
    prefix = [sys.executable] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    done = subprocess.run(prefix + arguments, env=environment(threads), cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(prefix + arguments)} failed:\n{done.stderr[-4000:]}")


def settings(overrides: list[str]) -> list[str]:
    return [item for override in overrides for item in ("--set", override)]


def train_and_time(run_dir: Path, processes: int, threads: int, parallelism: str, steps: int,
                   extra: list[str]) -> tuple[list[dict[str, float]], dict]:
    """Launch one training run: each step's time/rollout, time/scoring and time/update, from
    rank 0's log, and its summary.json."""
    overrides = COMMON + [f"steps={steps}", f"threads={threads}", f"parallelism={parallelism}",
                          f"output_dir={run_dir}"] + extra
    launch(["-m", "grpo_edu", "train"] + settings(overrides), processes, threads)
    summary = json.loads((run_dir / "summary.json").read_text())
    expected = parallelism if processes > 1 else "none"
    if summary["world_size"] != processes or summary["parallelism"] != expected:
        raise RuntimeError(f"{run_dir}: summary.json says world_size {summary['world_size']}, parallelism "
                           f"{summary['parallelism']!r}; expected {processes}, {expected!r}")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{part: line[f"time/{part}"] for part in PARTS} for line in lines], summary


def time_runs(args) -> None:
    load_before = os.getloadavg()[0]
    times: dict[str, list[float]] = {label: [] for label, *_ in RUNS}
    parts: dict[str, dict[str, list[float]]] = {label: {part: [] for part in PARTS} for label, *_ in RUNS}
    round_medians: dict[str, list[float]] = {label: [] for label, *_ in RUNS}
    memory: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as folder:
        for round_index in range(args.rounds):
            order = RUNS[round_index % len(RUNS):] + RUNS[:round_index % len(RUNS)]
            for label, processes, threads, parallelism in order:
                run_dir = Path(folder) / f"round{round_index}-{processes}-{threads}-{parallelism}"
                step_times, summary = train_and_time(run_dir, processes, threads, parallelism, args.steps, args.set)
                kept = [sum(step.values()) for step in step_times[args.warmup:]]
                for part in PARTS:
                    parts[label][part] += [step[part] for step in step_times[args.warmup:]]
                memory[label] = summary["memory_bytes_per_rank"][0]
                times[label] += kept
                round_medians[label].append(statistics.median(kept))
                print(f"  round {round_index + 1}/{args.rounds}: {label}: {1000 * round_medians[label][-1]:.1f} ms/step",
                      file=sys.stderr, flush=True)
    print(f"step time: {args.steps} steps per run, the first {args.warmup} dropped, {args.rounds} rounds "
          f"(order rotating); median over the {args.rounds * (args.steps - args.warmup)} kept steps of each\n")
    print(f"{'run':<36}{'s/step':>8}{'steps/s':>9}{'round medians, s/step':>24}{'vs 1 process, 1 thread':>25}"
          f"{'ms: rollout / scoring / update':>33}")
    baseline = statistics.median(times["1 process, 1 thread"])
    for label, *_ in RUNS:
        median = statistics.median(times[label])
        low, high = min(round_medians[label]), max(round_medians[label])
        print(f"{label:<36}{median:>8.4f}{1 / median:>9.2f}{f'{low:.4f} - {high:.4f}':>24}"
              f"{baseline / median:>24.2f}x"
              f"{' / '.join(f'{1000 * statistics.median(parts[label][part]):.0f}' for part in PARTS):>33}")
    cores = os.cpu_count()
    print(f"\n(machine: {cores} cores visible, 1-minute load average {load_before:.2f} before the runs and "
          f"{os.getloadavg()[0]:.2f} after them" + ("; two processes of 1 thread hold the same cores as one of 2 "
          "threads: no speed-up worth the name is expected here, and at best half the 1-thread time)\n"
          if cores <= PROCESSES else ")\n"))
    print("bytes rank 0 holds of the policy (summary.json's memory_bytes_per_rank; the 1-thread run holds "
          "what the 2-thread one does)")
    print(f"{'run':<36}{'parameters':>12}{'gradients':>12}{'AdamW state':>13}")
    for label, *_ in RUNS:
        if label != "1 process, 1 thread":
            held = memory[label]
            print(f"{label:<36}{held['parameters']:>12,}{held['gradients']:>12,}{held['optimizer']:>13,}")
    print()


# ---------------------------------------------------------------------- bytes

def count_bytes_worker(output: Path, steps: int, parallelism: str, extra: list[str]) -> None:
    """Run under torchrun: train with every collective counted; rank 0 writes the counts per step."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from grpo_edu.runtime import distributed
    from grpo_edu.training import rollouts, trainer
    from grpo_edu.config import TrainConfig

    payload, calls = Counter(), Counter()

    def count(category: str, tensor, times: int = 1) -> None:
        payload[category] += tensor.numel() * tensor.element_size() * times
        calls[category] += 1

    all_reduce, all_gather = dist.all_reduce, dist.all_gather

    def ddp_hook(state, bucket):
        gradients = bucket.buffer()
        count("ddp_allreduce", gradients)
        gradients.div_(dist.get_world_size())      # DDP averages gradients over ranks
        work = all_reduce(gradients, async_op=True)   # the unwrapped one: not counted twice
        return work.get_future().then(lambda future: future.value()[0])

    wrap = distributed.wrap

    def counted_wrap(*arguments, **keywords):
        module = wrap(*arguments, **keywords)
        if isinstance(module, torch.nn.parallel.DistributedDataParallel):
            module.register_comm_hook(None, ddp_hook)
        return module
    distributed.wrap = counted_wrap

    def wrapped(original, category, which, size_factor=False):
        def call(*arguments, **keywords):
            tensor = keywords[which] if isinstance(which, str) else arguments[which]
            count(category, tensor, dist.get_world_size() if size_factor else 1)
            return original(*arguments, **keywords)
        return call

    dist.all_gather_single = wrapped(dist.all_gather_single, "fsdp_allgather", 0)   # output tensor
    dist.reduce_scatter_single = wrapped(dist.reduce_scatter_single, "fsdp_reducescatter", "input")
    funcol.all_gather_single = wrapped(funcol.all_gather_single, "dtensor_allgather", 0, size_factor=True)
    funcol.all_reduce = wrapped(funcol.all_reduce, "dtensor_allreduce", 0)
    dist.all_reduce = wrapped(all_reduce, "trainer", 0)
    dist.all_gather = wrapped(all_gather, "trainer", 1, size_factor=True)

    snapshots = []
    sample_prompts = rollouts.sample_prompts

    def marked(*arguments, **keywords):   # called once per step, first thing in the step
        snapshots.append((Counter(payload), Counter(calls)))
        return sample_prompts(*arguments, **keywords)
    rollouts.sample_prompts = marked

    overrides = COMMON + [f"steps={steps}", "threads=1", f"parallelism={parallelism}",
                          f"output_dir={output.parent / parallelism}"] + extra
    config = TrainConfig.from_toml(None, overrides)
    trainer.train(config, log=lambda message: None)
    world = distributed.init_world(config.run.device)
    if world.is_main:
        per_step = [{"payload": dict(later[0] - earlier[0]), "calls": dict(later[1] - earlier[1])}
                    for earlier, later in zip(snapshots, snapshots[1:])]
        output.write_text(json.dumps({"per_step": per_step, "config": config.to_dict()}))
    world.barrier()
    distributed.close_world(world)


def forwards_per_step(config, world_size: int) -> dict[str, int]:
    """Forwards of the sharded modules in one training step, on every rank (padding ones
    included), with no groups filtered: the reference's, pi_old's and the update's."""
    import torch

    from grpo_edu.training.plan import plan_mini_batches

    B, G = config.rollout.prompts_per_step, config.rollout.num_generations
    per_rank = B // world_size
    # Every rank runs as many micro-batches of a mini-batch as the rank that holds most of it.
    mini_batches = plan_mini_batches(config.replace(filter_zero_std_groups=False), torch.zeros(B, G))
    pass_forwards = sum(
        math.ceil(G * max(int(((prompts >= r * per_rank) & (prompts < (r + 1) * per_rank)).sum())
                          for r in range(world_size)) / config.optimisation.micro_batch_size)
        for prompts in mini_batches)
    K = config.optimisation.num_iterations * config.optimisation.num_mini_batches
    return {
        "reference": math.ceil(per_rank * G / config.optimisation.micro_batch_size) if config.loss.beta else 0,
        "pi_old": pass_forwards if K > 1 and config.off_policy.old_logprobs == "recomputed" else 0,
        "update": config.optimisation.num_iterations * pass_forwards,
        "optimizer_steps": K,
    }


def count_bytes(args) -> None:
    from grpo_edu.config import TrainConfig
    from grpo_edu.runtime.distributed import decoder_layers
    from grpo_edu.policy.models import STARTING_POLICY, load_policy

    config = TrainConfig.from_toml(None, COMMON + args.set)
    policy, _ = load_policy(STARTING_POLICY if config.run.model == "start" else config.run.model)
    P = sum(parameter.numel() for parameter in policy.parameters())
    full = 4 * P
    N = PROCESSES
    measured = {}
    with tempfile.TemporaryDirectory() as folder:
        for parallelism in ("ddp", "fsdp2"):
            output = Path(folder) / f"{parallelism}.json"
            launch([__file__, "--count-bytes-worker", str(output), "--bytes-steps", str(args.bytes_steps),
                    "--parallelism", parallelism] + settings(args.set), N, 1)
            measured[parallelism] = json.loads(output.read_text())["per_step"]
    forwards = forwards_per_step(config, N)
    print(f"bytes per training step, 2 processes: the policy has P = {P:,} parameters, "
          f"{full:,} bytes in float32")
    print(f"one step here: {forwards['optimizer_steps']} optimizer step(s); forwards of a sharded module on each "
          f"rank: {forwards['reference']} reference, {forwards['pi_old']} pi_old, {forwards['update']} update "
          f"(engine = {config.run.engine!r}: "
          f"{'FSDP2 shards the whole model as one unit' if config.run.engine == 'fused' else 'FSDP2 shards each decoder layer'})\n")
    # The first step also sets FSDP2 up: left out.
    measured = {parallelism: steps[1:] for parallelism, steps in measured.items()}
    steps = len(measured["ddp"])
    same = all(step == runs[0] for runs in measured.values() for step in runs)
    print(f"measured: payload of the collectives launched in a step (the whole tensor each one reduces or "
          f"assembles), bytes (calls); steps 2 to {steps + 1} of each run, "
          + ("the same in each" if same else "their median"))
    print(f"{'collective':<68}{'ddp':>22}{'fsdp2':>22}")
    for category, label in CATEGORIES.items():
        cells = []
        for parallelism in ("ddp", "fsdp2"):
            sizes = [step["payload"].get(category, 0) for step in measured[parallelism]]
            counts = [step["calls"].get(category, 0) for step in measured[parallelism]]
            size, number = int(statistics.median(sizes)), int(statistics.median(counts))
            cells.append(f"{size:,} ({number})" if number else "-")
        print(f"{label:<68}{cells[0]:>22}{cells[1]:>22}")

    ddp_payload = forwards["optimizer_steps"] * full
    print("\ncomputed from P (not measured), per training step:")
    print(f"  ddp    the gradients, all-reduced once per optimizer step (no_sync on every micro-batch but the "
          f"last):\n         {forwards['optimizer_steps']} x {full:,} = {ddp_payload:,} bytes; "
          f"a rank sends about 2 (N-1)/N x that = {2 * (N - 1) * ddp_payload // N:,} bytes")
    # FSDP2's rule: a unit's parameters are gathered for its forward; a decoder layer (not a root)
    # is resharded after its forward and gathered again for its backward; a root unit stays
    # gathered from its forward until a backward reshards it. The frozen reference never runs
    # a backward, so the trainer reshards it after its forwards (add_logprobs): each step
    # gathers it whole again.
    layers = 0 if config.run.engine == "fused" else 4 * sum(
        parameter.numel() for layer in decoder_layers(policy) for parameter in layer.parameters())
    root = full - layers
    update, reference = forwards["update"], forwards["reference"]
    policy_gathers = update * full + (forwards["pi_old"] + update) * layers
    reference_gathers = root + reference * layers if reference else 0   # root once a step, layers per forward
    scatter_payload = forwards["optimizer_steps"] * full
    unit = ("the whole model is one unit (the fused path runs no layer's own forward)" if config.run.engine == "fused"
            else f"each decoder layer is a unit ({layers:,} bytes in all), the root holds the rest ({root:,})")
    print(f"  fsdp2  {unit}:")
    print(f"         the policy's parameters, all-gathered for each update forward"
          + ("" if config.run.engine == "fused" else ", the layers' again for its backward and for each pi_old forward")
          + f": {policy_gathers:,} bytes")
    print(f"         the reference's, all-gathered for its forwards (the trainer reshards it after them: "
          f"it has no backward to do so): {reference_gathers:,} bytes")
    print(f"         the gradients, reduce-scattered once per optimizer step: "
          f"{forwards['optimizer_steps']} x {full:,} = {scatter_payload:,} bytes")
    print(f"         the sampler's whole weights, gathered after the update: {full:,} bytes")
    total = policy_gathers + reference_gathers + scatter_payload + full
    print(f"         in all {total:,} bytes; a rank sends about (N-1)/N x that = {(N - 1) * total // N:,} bytes")
    print("(FSDP2 pads each parameter's shards to equal sizes: its measured payloads can exceed these a little)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="training steps per timed run")
    parser.add_argument("--warmup", type=int, default=5, help="first steps of each run not timed")
    parser.add_argument("--rounds", type=int, default=3, help="times each of the four runs is repeated")
    parser.add_argument("--bytes-steps", type=int, default=5, help="steps of each byte-counting run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every run (repeatable)")
    parser.add_argument("--skip-timing", action="store_true", help="only count the bytes")
    parser.add_argument("--count-bytes-worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--parallelism", default="ddp", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.count_bytes_worker is not None:
        count_bytes_worker(args.count_bytes_worker, args.bytes_steps, args.parallelism, args.set)
        return 0
    if args.warmup >= args.steps:
        parser.error(f"--warmup ({args.warmup}) must be less than --steps ({args.steps})")
    if args.bytes_steps < 3:
        parser.error(f"--bytes-steps must be >= 3 (the first and the last step are not counted), "
                     f"got {args.bytes_steps}")
    if not args.skip_timing:
        time_runs(args)
    count_bytes(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
