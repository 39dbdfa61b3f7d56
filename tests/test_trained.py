"""The trained model a run leaves (grpo_edu.training.trained): RUN_DIR/model/ loads with transformers
as it was trained, `grpo-edu eval` recomputes the run's final evaluation exactly, and
`grpo-edu sample` samples from it; an unfinished run is read from its newest checkpoint."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_edu.commands import cli
from grpo_edu.training import trained, trainer
from grpo_edu.config import TrainConfig
from grpo_edu.policy.models import generate_completions


def run_config(tmp_path, **overrides):
    values = dict(prompts_per_step=4, num_generations=4, max_completion_length=16, steps=2, eval_every=2,
                  eval_size=24, eval_samples=4, checkpoint_every=1, progress=False, threads=1,
                  output_dir=str(tmp_path / "run"))
    values.update(overrides)
    return TrainConfig(**values)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    config = run_config(tmp_path_factory.mktemp("trained"))
    result = trainer.train(config, log=lambda _: None)
    return config, result


def cli_output(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_finished_run_leaves_a_model_transformers_loads_as_trained(finished):
    config, result = finished
    folder = f"{config.logging.output_dir}/model"
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    trained_weights = result.policy.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, trained_weights[name]), name
    prompts = ["47+85=", "61-19="]
    tokenizer.padding_side = "left"
    assert generate_completions(model, tokenizer, prompts) == generate_completions(result.policy, result.tokenizer,
                                                                                   prompts)
    card = (Path(folder) / "README.md").read_text()
    assert f"| after training | {result.summary['final_accuracy']:.4f} |" in card and "from_pretrained" in card


def test_eval_recomputes_the_runs_final_evaluation(finished, capsys):
    config, result = finished
    code, out, _ = cli_output(capsys, "eval", config.logging.output_dir, "--samples", "4", "--json")
    assert code == 0
    results = json.loads(out)
    summary = result.summary
    assert results["greedy_accuracy"] == summary["final_accuracy"]
    assert results["greedy_accuracy_interval_95"] == summary["final_accuracy_interval_95"]
    for key, value in summary["final_sampled"].items():   # pass@1, pass@4, maj@4 and their intervals
        assert results[key] == value, key
    assert results["source"] == "model/" and results["problems"] == config.logging.eval_size


def test_eval_prints_a_table_and_names_the_runs_own_number(finished, capsys):
    config, result = finished
    code, out, _ = cli_output(capsys, "eval", config.logging.output_dir, "--problems", "8")
    assert code == 0 and "8 held-out arithmetic problems" in out and "greedy accuracy" in out
    assert "the run's own final evaluation" not in out   # 8 of 24 problems: not the run's evaluation
    code, out, _ = cli_output(capsys, "eval", config.logging.output_dir)
    assert f"(the run's own final evaluation: {result.summary['final_accuracy']:.4f})" in out


def test_sample_is_seeded_and_greedy_is_the_models_greedy(finished, capsys):
    config, result = finished
    code, out, _ = cli_output(capsys, "sample", config.logging.output_dir, "47+85=", "--temperature", "0")
    assert code == 0
    greedy = generate_completions(result.policy, result.tokenizer, ["47+85="])[0][0]
    assert out.splitlines()[1] == f"  1  {greedy}"
    runs = [cli_output(capsys, "sample", config.logging.output_dir, "47+85=", "-n", "3", "--seed", seed)[1]
            for seed in ("5", "5", "6")]
    assert runs[0] == runs[1] and len(runs[0].splitlines()) == 4
    loaded = trained.load_trained(config.logging.output_dir)
    _, completions = trained.sample(loaded, "47+85=", n=3, seed=6)
    assert runs[2].splitlines()[1:] == [f"{i:>3}  {c}" for i, c in enumerate(completions, 1)]


def test_an_unfinished_run_is_read_from_its_newest_checkpoint(tmp_path, capsys):
    config = run_config(tmp_path, steps=3, eval_samples=0)
    trainer.train(config, stop_after=1, log=lambda _: None)
    code, out, _ = cli_output(capsys, "eval", config.logging.output_dir, "--problems", "4")
    assert code == 0 and "checkpoint step-000001 (the run has not finished: no model/)" in out
    loaded = trained.load_trained(config.logging.output_dir)
    saved = load_file(f"{config.logging.output_dir}/checkpoints/step-000001/policy.safetensors")
    for name, tensor in loaded.model.state_dict().items():
        if name in saved:
            assert torch.equal(tensor, saved[name]), name


@pytest.mark.parametrize("argv, message", [
    (["eval", "{tmp}/nowhere"], "eval: RUN_DIR: expected a run directory of grpo-edu train, got '{tmp}/nowhere' "
                                "(no such folder)"),
    (["eval", "{run}", "--problems", "100"], "eval: --problems: expected 1 to 24 (the run's held-out problems), got 100"),
    (["eval", "{run}", "--samples", "-1"], "eval: --samples: expected 0 (greedy only) or more, got -1"),
    (["sample", "{run}", "1+1=", "--temperature", "0", "-n", "2"],
     "sample: -n: greedy decoding (--temperature 0) gives one completion, got -n 2"),
    (["sample", "{run}", "1+1=", "--max-new-tokens", "0"], "sample: --max-new-tokens: expected 1 or more, got 0"),
])
def test_bad_input_is_one_line(finished, tmp_path, capsys, argv, message):
    config, _ = finished
    filled = [a.format(tmp=tmp_path, run=config.logging.output_dir) for a in argv]
    code, _, err = cli_output(capsys, *filled)
    assert code == 2 and err.strip() == f"grpo-edu {message.format(tmp=tmp_path)}" and len(err.splitlines()) == 1


def test_a_run_without_checkpoints_or_model_says_so(tmp_path, capsys):
    run = tmp_path / "empty"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(TrainConfig(output_dir=str(run)).to_dict()))
    code, _, err = cli_output(capsys, "sample", str(run), "1+1=")
    assert code == 2 and "has no model/ (the run has not finished) and no checkpoint" in err
