"""task = "gsm8k" read from a local folder (GSM8K's own train.jsonl / test.jsonl layout, no
download), and chat_template: the prompts an instruct model reads."""

import json

import pytest

from grpo_edu.environment import tasks
from grpo_edu.training import trainer
from grpo_edu.config import TrainConfig
from grpo_edu.policy.models import STARTING_POLICY, load_policy

ROWS = {
    "train": [("Tom has 3 apples and buys 4 more. How many apples does he have?", "3 + 4 = 7\n#### 7"),
              ("A box holds 6 eggs. How many eggs are in 2 boxes?", "6 * 2 = 12\n#### 12"),
              ("Sara had 10 dollars and spent 4. How many dollars are left?", "10 - 4 = 6\n#### 6")],
    "test": [("What is 5 times 5?", "5 * 5 = 25\n#### 25"), ("What is 9 minus 2?", "9 - 2 = 7\n#### 7")],
}


@pytest.fixture
def gsm8k_folder(tmp_path):
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    for split, rows in ROWS.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows))
    return folder


def test_a_local_folder_is_read_without_a_download(gsm8k_folder):
    samples = tasks.load_gsm8k("test", str(gsm8k_folder))
    assert [s["answer"] for s in samples] == ["25", "7"]
    assert samples[0]["prompt"].startswith("What is 5 times 5?\n") and samples[0]["task"] == "gsm8k"
    (gsm8k_folder / "test.jsonl").unlink()
    with pytest.raises(ValueError, match="is a folder without test.jsonl"):
        tasks.load_gsm8k("test", str(gsm8k_folder))


def test_the_trainer_trains_on_gsm8k_from_the_folder(gsm8k_folder, tmp_path):
    config = TrainConfig(task="gsm8k", dataset=str(gsm8k_folder), steps=2, prompts_per_step=2, num_generations=4,
                         max_completion_length=8, eval_size=5, eval_every=100, checkpoint_every=0, progress=False,
                         threads=1, output_dir=str(tmp_path / "run"))
    result = trainer.train(config, log=lambda _: None)
    assert [m["step"] for m in result.history] == [1, 2]
    _, tokenizer = load_policy(STARTING_POLICY)
    pool, held_out = tasks.task_pools(config, tokenizer)
    assert len(pool) == 3 and [s["answer"] for s in held_out] == ["25", "7"]   # eval_size 5, the split has 2


def test_chat_template_wraps_each_prompt_as_a_user_message(gsm8k_folder):
    _, tokenizer = load_policy(STARTING_POLICY)
    config = TrainConfig(task="gsm8k", dataset=str(gsm8k_folder), chat_template=True)
    with pytest.raises(ValueError, match="'chat_template' is true, but the tokenizer has no chat template"):
        tasks.task_pools(config, tokenizer)
    tokenizer.chat_template = "{% for m in messages %}<user>{{ m['content'] }}</user>{% endfor %}<assistant>"
    pool, held_out = tasks.task_pools(config, tokenizer)
    plain, _ = tasks.task_pools(TrainConfig(task="gsm8k", dataset=str(gsm8k_folder)), tokenizer)
    assert [s["prompt"] for s in pool] == [f"<user>{s['prompt']}</user><assistant>" for s in plain]
    assert [s["answer"] for s in pool] == [s["answer"] for s in plain]
