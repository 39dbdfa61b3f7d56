"""Rollout engines: G sampled completions per prompt, with the sampler's log-probs.

    engines.py      the engines, each registered whole: factory, settings section, own weights,
                    forward (grpo_edu.config composes their settings; no engine client imported)
    rollout.py      the engine protocol, Rollout, SamplingParams and the transformers-generate engine
    fused_llama.py  the CPU tier's fast engine: the same Llama maths fused (KV-cache sampler,
                    group-packed log-probs)
    vllm_engine.py  the GPU tier's engine: vLLM 0.31.0, colocated or a server (every line that
                    calls vLLM)
    sglang_engine.py  an SGLang 0.5.23 server over its HTTP API, started here or running (every
                    line that talks to SGLang)

Imports grpo_edu.runtime, grpo_edu.algorithm and grpo_edu.policy.
"""
