"""The policy network: the tiny model, its tokenizer and the adapters it may train.

    models.py  the character tokenizer, the completion format, the tiny Llama, load_policy,
               generate_completions, the committed starting policies (grpo_edu/assets)
    lora.py    LoRA adapters injected in place; the merged weights a sampler loads

Imports only grpo_edu.runtime.
"""
