"""A trained model a reader can use elsewhere: the folder a finished `grpo-edu train` leaves
(RUN_DIR/model, grpo_edu.training.trained) loads in vLLM's CPU build as it is, and vLLM's greedy
decoding gives the same tokens as transformers' from the same folder.

No shim: vLLM loads the folder from disk, the path every reader's `vllm.LLM(model=...)` takes
(the CPU build's repacking happens at that load, and nothing is loaded after it). Not proven on
a CPU: vLLM's GPU kernels and bf16 (a GPU's greedy tokens can differ where two logits are
within bf16's rounding).
"""

import json
import sys

from hang_guard import HANG_SECONDS
from real_vllm_support import BIN, environment, run

PROMPTS = ["47+85=", "61-19=", "12+99=", "80-45=", "33+33=", "90-11="]

COMPARE = f"""
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder = sys.argv[1]
prompts = {PROMPTS!r}
tokenizer = AutoTokenizer.from_pretrained(folder)
tokenizer.padding_side = "left"
model = AutoModelForCausalLM.from_pretrained(folder)
hf = []
for prompt in prompts:
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    hf.append(out[0, ids["input_ids"].shape[1]:].tolist())
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
llm = LLM(model=folder, dtype="float32", seed=0, enable_prefix_caching=False)
params = SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[tokenizer.eos_token_id])
outputs = llm.generate([TokensPrompt(prompt_token_ids=tokenizer(p, add_special_tokens=False)["input_ids"])
                        for p in prompts], params, use_tqdm=False)
print("TOKENS " + json.dumps({{"hf": hf, "vllm": [list(o.outputs[0].token_ids) for o in outputs]}}))
"""


def test_the_trained_model_folder_loads_in_vllm_with_transformers_greedy_tokens(tmp_path):
    out = tmp_path / "run"
    run([str(BIN / "grpo-edu"), "train", "--set=steps=3", "--set=eval_every=3", "--set=eval_size=16",
         "--set=checkpoint_every=0", "--set=progress=false", "--set=threads=1", f"--set=output_dir={out}"],
        env=environment(shim=False), cwd=tmp_path, timeout=HANG_SECONDS)
    assert (out / "model" / "config.json").is_file() and (out / "model" / "README.md").is_file()
    done = run([sys.executable, "-c", COMPARE, str(out / "model")], env=environment(shim=False), cwd=tmp_path,
               timeout=HANG_SECONDS)
    tokens = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("TOKENS "))[7:])
    # transformers keeps the EOS it stopped at; vLLM, stopping at it, includes it as well
    assert tokens["vllm"] == tokens["hf"], tokens
    assert any(len(t) > 3 for t in tokens["hf"])
