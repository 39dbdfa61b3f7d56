"""The same scenarios through VLLMEngine on whichever vllm imports: the main suite's stand-in
(tests/fake_vllm first on PYTHONPATH) or vLLM's CPU build (with cpu_shim/). Prints one JSON
object of what each returned; test_real_vllm_vs_stand_in.py runs it on both and compares.

    python tests/real_vllm/scenarios.py
"""

from __future__ import annotations

import copy
import json
import random

import numpy
import torch

from grpo_edu.environment import tasks
from grpo_edu.sampling import vllm_engine
from grpo_edu.runtime.distributed import World
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.policy.models import STARTING_POLICY, load_policy
from grpo_edu.sampling.rollout import SamplingParams

G, L, T = 4, 12, 0.7
SEEDS = [99 + G * b for b in range(4)]


def rollout_record(rollout, policy) -> dict:
    full = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    attention = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)
    with torch.no_grad():
        recomputed = completion_logprobs(policy, full, attention, rollout.completion_mask, temperature=T)
    mask = rollout.completion_mask
    return {"ids": [row[m].tolist() for row, m in zip(rollout.completion_ids, mask)],
            "logprobs": [row[m].tolist() for row, m in zip(rollout.sampler_logp, mask)],
            "finished": rollout.finished.tolist(),
            "gap_to_policy": float((recomputed - rollout.sampler_logp)[mask].abs().max())}


def rng_states():
    return torch.get_rng_state(), random.getstate(), numpy.random.get_state()[1].copy()


def same_states(a, b) -> bool:
    return bool(torch.equal(a[0], b[0]) and a[1] == b[1] and (a[2] == b[2]).all())


def main() -> dict:
    import vllm
    out: dict = {"vllm": vllm.__file__}
    policy, tokenizer = load_policy(STARTING_POLICY)
    samples = tasks.make_dataset("arithmetic", n=4, split="test", seed=0)
    encoded = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = encoded["input_ids"], encoded["attention_mask"]

    torch.manual_seed(5)
    random.seed(5)
    numpy.random.seed(5)
    before = rng_states()
    engine = vllm_engine.VLLMEngine(str(STARTING_POLICY), policy, tokenizer, World(), seed=0,
                                    gpu_memory_utilization=0.3, sleep_mode=True, dtype="float32")
    out["build_keeps_rng"] = same_states(before, rng_states())

    try:   # generate before any sync: the weights sleep
        engine.generate(ids, mask, SamplingParams(G, L, T), seeds=SEEDS)
        out["generate_asleep"] = "returned"
    except RuntimeError as error:
        out["generate_asleep"] = str(error)

    engine.sync_weights()
    out["rollout"] = rollout_record(engine.generate(ids, mask, SamplingParams(G, L, T), seeds=SEEDS), policy)

    kept = {}
    for count in (4, 2):   # the engine's seeded generate, and vLLM's own, on the process's RNG
        torch.manual_seed(1)
        before = rng_states()
        engine.sync_weights()
        engine.generate(ids[:count], mask[:count], SamplingParams(G, L, T), seeds=SEEDS[:count])
        kept[str(count)] = same_states(before, rng_states())
    out["seeded_generate_keeps_rng"] = kept

    engine.sync_weights()
    engine.llm.wake_up(tags=["kv_cache"])
    prompts = [engine._tokens_prompt(prompt_token_ids=i[m.bool()].tolist()) for i, m in zip(ids, mask)]
    def params(n: int, seed: int):
        return engine._sampling_params(SamplingParams(n, L, T), seed)

    moved, next_draw = {}, {}
    for count in (4, 2):
        torch.manual_seed(1)
        before = torch.get_rng_state()
        engine.llm.generate(prompts=prompts[:count], sampling_params=[params(G, s) for s in SEEDS[:count]],
                            use_tqdm=False)
        moved[str(count)] = not torch.equal(before, torch.get_rng_state())
        next_draw[str(count)] = float(torch.rand(1))
    out["vllm_generate_moves_rng"] = moved
    out["vllm_moves_rng_by_batch"] = next_draw["4"] != next_draw["2"]

    together = engine.llm.generate(prompts=prompts[:1], sampling_params=[params(G, 7)], use_tqdm=False)[0].outputs
    apart = [engine.llm.generate(prompts=prompts[:1], sampling_params=[params(1, 7 + j)], use_tqdm=False)[0].outputs[0]
             for j in range(G)]
    out["n_children"] = [list(c.token_ids) for c in sorted(together, key=lambda c: c.index)]
    out["n_requests"] = [list(c.token_ids) for c in apart]
    out["reset_prefix_cache"] = engine.llm.reset_prefix_cache()
    engine.llm.sleep(level=2)
    engine._weights_asleep = True

    unseeded = []
    for _ in range(2):
        torch.manual_seed(11)
        engine.sync_weights()
        unseeded.append(engine.generate(ids, mask, SamplingParams(G, L, T)).completion_ids.tolist())
    out["unseeded_same_rng_same_rollout"] = unseeded[0] == unseeded[1]

    old = copy.deepcopy(policy)
    with torch.no_grad():
        for _, parameter in policy.named_parameters():
            noise = torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0))
            parameter.add_(noise * parameter.std() * 0.5)
    engine.sync_weights()
    changed = engine.generate(ids, mask, SamplingParams(G, L, T), seeds=SEEDS)
    out["after_weight_change"] = rollout_record(changed, policy)
    out["after_weight_change"]["gap_to_old_policy"] = rollout_record(changed, old)["gap_to_policy"]
    return out


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
