"""N processes train what one process trains: torchrun (gloo) on the CPU, ddp and fsdp2.

The equality tests launch real process groups: tests/distributed_sweep.py trains every
config of a list in one launch (torchrun's start-up is paid once per launch), and the
CLI test runs the documented command itself.
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_edu.algorithm.loss import LossSettings
from grpo_edu.commands import cli
from grpo_edu.policy import lora
from grpo_edu.runtime import distributed
from grpo_edu.training import placement, rollouts, scoring, trainer, update, user_functions
from grpo_edu.training.batch import RolloutBatch
from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import World
from grpo_edu.algorithm.aggregation import LOSS_TYPES
from hang_guard import HANG_SECONDS

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "tests" / "distributed_sweep.py"
TOLERANCE = 1e-5
COMMON = ["steps=5", "eval_size=32", "eval_every=1000", "checkpoint_every=0", "progress=false", "threads=1"]
# Each loss type with settings that make the ranks' shares differ: pi_old recomputed over two
# passes, two mini-batches, the zero-std filter (uneven groups per rank: padding micro-batches),
# micro-batches smaller than a rank's share; and the reference re-synced with rollouts that lag
# (each rank's in-flight share, its pi_old taken at sampling), pi_old the sampler's.
BY_LOSS = {
    # a Polyak reference, on shards under fsdp2; dynamic sampling: groups chosen from every rank's rounds
    "grpo": ["ref_sync_steps=2", "ref_mixup_alpha=0.5", "rollout_lag=2", "dynamic_sampling_rounds=2"],
    # LoRA: adapters trained on both ranks (under fsdp2 sharded with the frozen base), the reference
    # the policy's own forward with the adapters off
    "bnpo": ["num_iterations=2", f"environment={json.dumps(str(ROOT / 'tests' / 'episode_envs.py') + ':Echo')}",
             "lora_rank=4", "lora_alpha=16.0", "learning_rate=3e-3"],
    # entropy masking: one threshold over a mini-batch's micro-batches on both ranks
    "dr_grpo": ["num_mini_batches=2", "filter_zero_std_groups=true", "micro_batch_size=24", "top_entropy_quantile=0.5"],
    # process supervision on the chain task (per-token advantages, each rank's from its own whole groups and
    # its own padded width), with overlong filtering and punishment at a limit that cuts the longer chains:
    # the ranks' token counts without their truncated completions
    "dapo": ["num_mini_batches=2", "micro_batch_size=16", "beta=0.0", "old_logprobs=sampler", "model=chain-start",
             "task=chain", "supervision=process", "max_completion_length=24", "mask_truncated_completions=true",
             "overlong_cache=4"],
}
# bnpo's runs are multi-turn episodes (grpo_edu.training.episodes): its normaliser, the batch's tokens,
# counts the policy's only, each rank's share differing from the other's. (Not with pi_old the
# sampler's: a rank's later turns sample contexts padded to its own longest, whose float32
# log-probs differ from one process's in the last bits: dapo's runs moved 1.8e-5 apart so.)


def environment() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def launch(arguments: list[str], processes: int, timeout: int = HANG_SECONDS) -> subprocess.CompletedProcess:
    prefix = [sys.executable] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    done = subprocess.run(prefix + arguments, env=environment(), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def sweep(tmp_path: Path, runs: list[dict], processes: int) -> None:
    path = tmp_path / f"runs-{processes}-{len(list(tmp_path.glob('runs-*')))}.json"
    path.write_text(json.dumps(runs))
    launch([str(SWEEP), str(path)], processes)


def final_policy(run_dir: Path) -> dict[str, torch.Tensor]:
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    return load_file(run_dir / "checkpoints" / latest / "policy.safetensors")


def largest_difference(a: Path, b: Path) -> float:
    one, two = final_policy(a), final_policy(b)
    assert one.keys() == two.keys()
    return max(float((one[name] - two[name]).abs().max()) for name in one)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The 1-process run of each loss type's config."""
    folder = tmp_path_factory.mktemp("one")
    runs = [{"output_dir": str(folder / loss), "overrides": COMMON + [f"loss_type={loss}"] + BY_LOSS[loss]}
            for loss in LOSS_TYPES]
    sweep(folder, runs, 1)
    return folder


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp2"])
def test_two_processes_train_the_one_process_policy_for_every_loss_type(tmp_path, one_process, parallelism):
    runs = [{"output_dir": str(tmp_path / loss),
             "overrides": COMMON + [f"loss_type={loss}", f"parallelism={parallelism}"] + BY_LOSS[loss]}
            for loss in LOSS_TYPES]
    sweep(tmp_path, runs, 2)
    for loss in LOSS_TYPES:
        summary = json.loads((tmp_path / loss / "summary.json").read_text())
        assert summary["world_size"] == 2 and summary["parallelism"] == parallelism and summary["steps"] == 5
        difference = largest_difference(one_process / loss, tmp_path / loss)
        assert difference < TOLERANCE, (loss, difference)
        # The weights did move: equality is not two untrained copies.
        start = final_policy(one_process / loss)
        assert difference < 1e-2 * max(float(v.abs().max()) for v in start.values())
    # bnpo's checkpoints hold LoRA adapters only, and they trained (B starts at 0)
    adapters = final_policy(tmp_path / "bnpo")
    assert adapters and all(lora.is_adapter(name) for name in adapters)
    assert min(float(v.abs().max()) for name, v in adapters.items() if ".lora_B." in name) > 1e-4
    # The logged metrics are the 1-process ones (reduced over ranks: weighted means, max of maxima).
    for loss in LOSS_TYPES:
        one = [json.loads(line) for line in (one_process / loss / "metrics.jsonl").read_text().splitlines()]
        two = [json.loads(line) for line in (tmp_path / loss / "metrics.jsonl").read_text().splitlines()]
        for a, b in zip(one, two, strict=True):
            for key in a:
                if not key.startswith("time/"):
                    assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (loss, a["step"], key)
        if loss == "grpo":   # dynamic sampling did sample more rounds, and dr_grpo's entropy mask did mask
            assert any(step["dynamic_sampling/rounds"] > 1 for step in two)
        if loss == "dr_grpo":
            kept = [step["entropy/kept"] for step in two if "entropy/kept" in step]
            assert kept and all(0.4 < share < 0.6 for share in kept)
        if loss == "dapo":   # process supervision trained (no tie spread: per-token advantages), the limit cut
            assert all("process/step_accuracy" in step and "advantage/tie_spread" not in step for step in two)
            assert any(step["truncated"] > 0 for step in two)


def test_a_per_rank_normaliser_breaks_the_equality(tmp_path, one_process):
    """Each rank dividing by its own token counts (and the ranks' gradients averaged, as DDP
    does): the mistake the global LossTotals prevent. bnpo's and dapo's ranks hold different
    token counts, so their 2-process policies leave the 1-process ones by 20 times the
    tolerance; the same launch with the global counts stays within it."""
    runs = [{"output_dir": str(tmp_path / loss), "per_rank_normaliser": True,
             "overrides": COMMON + [f"loss_type={loss}"] + BY_LOSS[loss]} for loss in ("bnpo", "dapo")]
    sweep(tmp_path, runs, 2)
    for loss in ("bnpo", "dapo"):
        assert largest_difference(one_process / loss, tmp_path / loss) > 20 * TOLERANCE, loss


def test_the_documented_command_on_two_processes_equals_one(tmp_path):
    """`torchrun --standalone --nproc-per-node 2 -m grpo_edu train --set steps=5 ...` and
    `python -m grpo_edu train ...`: the final policies (checkpoints/latest) agree to 1e-5."""
    settings = [f"--set={s}" for s in COMMON]
    for processes in (1, 2):
        done = launch(["-m", "grpo_edu", "train", *settings, f"--set=output_dir={tmp_path / str(processes)}"],
                      processes)
        assert done.stdout.count("held-out greedy accuracy") == 1   # rank 0 alone reports
    assert largest_difference(tmp_path / "1", tmp_path / "2") < TOLERANCE


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp2"])
def test_resume_on_the_same_number_of_processes_is_bitwise_and_on_one_is_close(tmp_path, parallelism):
    """A 2-process run stopped at step 2 and resumed gives bitwise the uninterrupted run's
    policy. Resumed on 1 process instead (checkpoints hold whole weights and optimizer state,
    and every rank's RNG states are rank 0's), it continues the same trajectory to 1e-5."""
    overrides = COMMON + ["steps=4", "checkpoint_every=2", f"parallelism={parallelism}"]
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    sweep(tmp_path, [{"output_dir": str(whole), "overrides": overrides},
                     {"output_dir": str(stopped), "overrides": overrides, "stop_after": 2}], 2)
    on_one = tmp_path / "on-one"
    import shutil
    shutil.copytree(stopped, on_one)
    sweep(tmp_path, [{"output_dir": str(stopped), "overrides": overrides, "resume": str(stopped)}], 2)
    sweep(tmp_path, [{"output_dir": str(on_one), "overrides": overrides, "resume": str(on_one)}], 1)
    a, b = final_policy(whole), final_policy(stopped)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert largest_difference(whole, on_one) < TOLERANCE


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp2"])
def test_sampling_in_the_background_on_two_processes_trains_the_lagged_run_bit_for_bit(tmp_path, parallelism):
    """rollout_overlap under torchrun: each rank's sampler thread gathers the rollout's rewards
    in a process group of its own while the update all-reduces (DDP) or all-gathers and
    reduce-scatters (FSDP2) in the default one; pi_old (recomputed by the sampler's whole copy)
    and every update are the in-turn run's, bit for bit, and the run resumes bitwise."""
    overrides = COMMON + ["rollout_lag=2", "checkpoint_every=2", f"parallelism={parallelism}"]
    names = ("in-turn", "beside", "stopped") if parallelism == "fsdp2" else ("in-turn", "beside")  # one resume
    runs = {name: tmp_path / name for name in names}
    first = [{"output_dir": str(runs["in-turn"]), "overrides": overrides},
             {"output_dir": str(runs["beside"]), "overrides": overrides + ["rollout_overlap=true"]}]
    if "stopped" in runs:
        first.append({"output_dir": str(runs["stopped"]), "overrides": overrides + ["rollout_overlap=true"],
                      "stop_after": 3})
    sweep(tmp_path, first, 2)
    if "stopped" in runs:
        sweep(tmp_path, [{"output_dir": str(runs["stopped"]), "overrides": overrides + ["rollout_overlap=true"],
                          "resume": str(runs["stopped"])}], 2)
    in_turn = final_policy(runs["in-turn"])
    for name in names[1:]:
        policy = final_policy(runs[name])
        assert all(torch.equal(in_turn[key], policy[key]) for key in in_turn), name
    logged = {name: [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
                     for line in (path / "metrics.jsonl").read_text().splitlines()] for name, path in runs.items()}
    for name in names[1:]:
        for a, b in zip(logged["in-turn"], logged[name], strict=True):
            assert a == b, (name, {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)})
    assert [m["staleness"] for m in logged["beside"]] == [0.0, 1.0, 2.0, 2.0, 2.0]
    time_logged = [json.loads(line) for line in (runs["beside"] / "metrics.jsonl").read_text().splitlines()]
    assert all("time/step" in m for m in time_logged)   # it did sample in the background


def test_fsdp2_holds_half_of_the_parameters_gradients_and_optimizer_state_per_rank(tmp_path):
    runs = [{"output_dir": str(tmp_path / p), "overrides": COMMON + ["steps=1", f"parallelism={p}"]}
            for p in ("ddp", "fsdp2")]
    sweep(tmp_path, runs, 2)
    ddp, fsdp2 = (json.loads((tmp_path / p / "summary.json").read_text())["memory_bytes_per_rank"]
                  for p in ("ddp", "fsdp2"))
    for kind in ("parameters", "gradients", "optimizer"):
        replica = ddp[0][kind]
        assert replica > 0 and ddp[1][kind] == replica               # DDP: a whole copy on each rank
        assert fsdp2[0][kind] + fsdp2[1][kind] == replica              # FSDP2: the shards partition it
        assert max(fsdp2[0][kind], fsdp2[1][kind]) <= 0.51 * replica   # about 1/2 each


# ----------------------------------------------------------------------------- in one process

def test_prompts_must_split_into_whole_prompts_per_process(monkeypatch, capsys):
    with pytest.raises(ValueError, match=r"config key 'prompts_per_step' \(15\) must be divisible by the "
                                         r"number of processes \(2\)"):
        World(rank=1, size=2).shard(15)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["train", "--set", "prompts_per_step=15", "--set", "progress=false"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == ("grpo-edu train: prompts_per_step: expected a multiple of the number of processes (2; each "
                     "owns whole prompts, all G completions of each), got 15")


def test_each_rank_owns_whole_contiguous_prompts():
    shares = [World(rank=r, size=4).shard(16) for r in range(4)]
    assert [(s.start, s.stop) for s in shares] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    assert [World(rank=r, size=3).split(10) for r in range(3)] == [slice(0, 3), slice(3, 6), slice(6, 10)]


def test_every_tensor_handed_to_the_loss_is_on_the_trainers_device(tmp_path, monkeypatch):
    """The rollout is made on the CPU here; the trainer's device is `meta` (a device any test
    can create: tensors with shapes and no values). score() must place the batch on the
    trainer's device, so every tensor grpo_loss receives, advantages included, is there: a
    CPU tensor meeting meta log-probs fails this test."""
    from grpo_edu.policy.models import char_tokenizer, tiny_llama
    from grpo_edu.sampling.rollout import HFEngine
    tokenizer = char_tokenizer()
    policy = tiny_llama(tokenizer, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    config = TrainConfig(prompts_per_step=4, num_generations=4, max_completion_length=6, beta=0.04,
                         num_iterations=2, progress=False, threads=1, output_dir=str(tmp_path))
    from grpo_edu.environment import tasks
    samples = rollouts.sample_prompts(config.rollout.prompts_per_step, random.Random(0), tasks.make_dataset(n=20))
    rollout = rollouts.roll_out(config, samples, tokenizer, HFEngine(policy, tokenizer))
    meta = World(device=torch.device("meta"))
    batch, plan = scoring.score(config, samples, rollout, tokenizer,
                                user_functions.reward_functions_from_config({"format": 1.0}),
                                lambda r: r - r.mean(-1, keepdim=True), meta)
    assert all(getattr(batch, name).device.type == "meta" for name in
               ("input_ids", "attention_mask", "completion_mask", "rewards", "advantages", "sampler_logp"))

    class MetaLogprobs(torch.nn.Module):   # stands in for the wrapped policy / reference on `meta`
        def forward(self, input_ids, attention_mask, completion_mask):
            assert input_ids.device.type == attention_mask.device.type == completion_mask.device.type == "meta"
            return torch.zeros(completion_mask.shape, device="meta", requires_grad=True)
    models = placement.Models(policy, None, policy, MetaLogprobs(), MetaLogprobs())
    batch = update.add_logprobs(config, models, batch, plan, meta)
    assert batch.old_logp.device.type == batch.ref_logp.device.type == "meta"
    received = []

    class Seen(Exception):
        pass

    def spy(*args, **kwargs):
        received.extend(value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor))
        raise Seen
    monkeypatch.setattr(update, "grpo_loss", spy)
    part = update.micro_batches(plan, batch, 0, config.optimisation.micro_batch_size, meta)[0]
    with pytest.raises(Seen):
        update.micro_batch_loss(LossSettings.of(config), models.train_logprobs, part,
                                plan.totals(0, config.loss.loss_type))
    assert len(received) >= 5 and {t.device.type for t in received} == {"meta"}


def test_fused_path_is_refused_off_the_cpu_and_with_bf16():
    config = TrainConfig(progress=False)
    with pytest.raises(ValueError, match="engine = 'hf' .*or 'vllm' on cuda"):
        placement.check_engine_settings(config, torch.device("cuda", 0))
    with pytest.raises(ValueError, match="precision = 'bf16'"):
        placement.check_engine_settings(TrainConfig(precision="bf16", progress=False), torch.device("cpu"))
    placement.check_engine_settings(TrainConfig(precision="bf16", engine="hf", progress=False), torch.device("cpu"))


def test_device_auto_is_the_cpu_without_a_gpu_and_cuda_without_one_is_an_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: 'auto' is cuda here")
    assert distributed.resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="config key 'device' is 'cuda', but torch sees no GPU"):
        distributed.resolve_device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CUDA path's own test)")
def test_one_gpu_trains_in_bf16(tmp_path):
    config = TrainConfig(device="cuda", engine="hf", precision="bf16", steps=3, eval_size=32,
                         progress=False, output_dir=str(tmp_path))
    result = trainer.train(config, log=lambda _: None)
    assert result.summary["steps"] == 3
    assert next(result.policy.parameters()).dtype == torch.float32   # master weights stay float32


def test_bf16_autocast_changes_the_forward_and_keeps_float32_master_weights(tmp_path):
    """precision = 'bf16' is autocast (on the CPU here, as it would be on CUDA): the trainer's
    log-probs differ from float32's by bf16 rounding, while the parameters, their gradients
    and AdamW's state stay float32 (the master weights)."""
    from grpo_edu.policy.models import char_tokenizer, tiny_llama
    tokenizer = char_tokenizer()
    policy = tiny_llama(tokenizer, hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128)
    ids = tokenizer(["12+34=<think>46</think>", "7-5=<think>2</think>"], return_tensors="pt", padding=True,
                    add_special_tokens=False)
    completion_mask = ids["attention_mask"][:, -6:].bool()
    logp = {}
    for precision in ("fp32", "bf16"):
        config = TrainConfig(engine="hf", precision=precision, beta=0.0, progress=False)
        models = placement.build_models(config, World(), policy)
        logp[precision] = models.train_logprobs(ids["input_ids"], ids["attention_mask"], completion_mask)
        logp[precision].sum().backward()
        assert all(p.grad.dtype == torch.float32 for p in policy.parameters() if p.grad is not None)
        policy.zero_grad()
    assert logp["fp32"].dtype == logp["bf16"].dtype == torch.float32   # log-softmax is upcast
    difference = (logp["fp32"] - logp["bf16"]).abs().max().item()
    assert 1e-4 < difference < 0.5
    config = TrainConfig(prompts_per_step=4, num_generations=4, max_completion_length=6, steps=2, eval_size=8,
                         engine="hf", precision="bf16", progress=False, threads=1, output_dir=str(tmp_path))
    result = trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None)
    assert all(p.dtype == torch.float32 for p in result.policy.parameters())
    state = torch.load(tmp_path / "checkpoints" / "step-000002" / "trainer_state.pt", weights_only=True)
    assert all(v.dtype == torch.float32 for s in state["optimizer"]["state"].values()
               for k, v in s.items() if k != "step")
