"""Multi-turn episodes (config key environment, grpo_edu.training.episodes): who wrote each token, the
environment's tokens as context that nothing of the loss counts, environments that misbehave,
and the trainer running episodes with every engine."""

import dataclasses

import pytest
import torch

from grpo_edu.training import episodes, placement, scoring, trainer, update
from grpo_edu.config import TrainConfig
from grpo_edu.training.episodes import Calculator, Reply, roll_out_episodes
from grpo_edu.algorithm.loss import LossSettings, grpo_loss
from grpo_edu.sampling.rollout import Rollout, SamplingParams
from grpo_edu.training.user_functions import functions_from_config
from test_trainer import small_config, tiny

ECHO = "tests.episode_envs:Echo"


def scripted(tokenizer, script: dict[tuple[int, int], str]):
    """A generate for roll_out_episodes that writes script[(row, turn)] (cut at a stop token
    or EOS, as an engine stops), with log-prob -0.5 per token; records its calls."""
    calls = []
    eos = tokenizer.eos_token_id

    def generate(turn, prompt_ids, prompt_mask, sampling: SamplingParams, rows):
        calls.append((turn, list(rows), prompt_ids.shape, sampling))
        texts = []
        for row in rows:
            ids = tokenizer(script[(row, turn)], add_special_tokens=False)["input_ids"] + [eos]
            end = next(i for i, t in enumerate(ids) if t == eos or t in sampling.stop_token_ids)
            texts.append(ids[:min(end + 1, sampling.max_new_tokens)])
        S = max(len(t) for t in texts)
        ids = torch.full((len(rows), S), tokenizer.pad_token_id)
        mask = torch.zeros(len(rows), S, dtype=torch.bool)
        for r, t in enumerate(texts):
            ids[r, :len(t)], mask[r, :len(t)] = torch.tensor(t), True
        G = sampling.num_generations
        return Rollout(prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0), ids, mask,
                       torch.full((len(rows), S), -0.5) * mask, mask[:, -1] | (ids == eos).any(1), G)
    return generate, calls


def prompts(tokenizer, texts):
    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return encoded["input_ids"], encoded["attention_mask"]


def text_of(tokenizer, ids, mask):
    return "".join(tokenizer.convert_ids_to_tokens([int(t) for t, m in zip(ids, mask) if m]))


# --------------------------------------------------------------------------- the episode's record

def test_an_episode_records_who_wrote_each_token():
    """Four scripted episodes (one prompt, G = 4) through Echo (hands over at '1', answers
    '<count of 1s>', 0.25 reward per answer, done when the action holds an x): ended by EOS,
    ended by the environment, at the turn limit, and by running out of room."""
    _, tokenizer = tiny()
    script = {(0, 0): "ab1", (0, 1): "cd",                              # EOS on turn 2
              (1, 0): "1", (1, 1): "x1",                                # the second answer is done
              (2, 0): "1", (2, 1): "1", (2, 2): "1",                    # hands over on turn 3 of 3
              (3, 0): "yyyyyyyyy1"}                                     # the answer finds no room
    generate, calls = scripted(tokenizer, script)
    ids, mask = prompts(tokenizer, ["2+2="])
    rollout = roll_out_episodes(generate, [{"prompt": "2+2=", "answer": "4"}], ids, mask,
                                SamplingParams(4, 12, 1.0), tokenizer, ECHO, max_turns=3)
    eos = tokenizer.eos_token
    written = rollout.completion_mask | rollout.env_mask
    assert [text_of(tokenizer, i, m) for i, m in zip(rollout.completion_ids, written)] == [
        f"ab1<1>cd{eos}", "1<1>x1<1>", "1<1>1<1>1", "yyyyyyyyy1<1"]
    assert [text_of(tokenizer, i, m) for i, m in zip(rollout.completion_ids, rollout.env_mask)] == [
        "<1>", "<1><1>", "<1><1>", "<1"]
    assert not (rollout.completion_mask & rollout.env_mask).any()
    assert (rollout.sampler_logp[rollout.completion_mask] == -0.5).all()
    assert (rollout.sampler_logp[~rollout.completion_mask] == 0).all()   # none for the environment's tokens
    assert rollout.finished.tolist() == [True, True, False, False]
    assert rollout.episode["turns"].tolist() == [2, 2, 3, 1]
    assert rollout.episode["env_reward"].tolist() == [0.25, 0.5, 0.5, 0.25]
    assert rollout.episode["turn_limit"].tolist() == [0, 0, 1, 0]
    assert rollout.episode["cut_answers"].tolist() == [0, 0, 0, 1]
    # Turn 0 samples G per prompt; later turns one per open episode, from its whole context.
    assert [(turn, rows) for turn, rows, _, _ in calls] == [(0, [0, 1, 2, 3]), (1, [0, 1, 2]), (2, [2])]
    assert calls[1][3].num_generations == 1 and calls[1][3].max_new_tokens == 12 - 4   # the most room left
    assert calls[1][2] == (3, 4 + 6)   # left-padded contexts: the prompt and the longest episode so far
    assert all(sampling.stop_token_ids == (tokenizer.convert_tokens_to_ids("1"),) for *_, sampling in calls)


def test_the_calculator_answers_calls_and_refuses_what_it_cannot_read():
    calculator = Calculator()
    calculator.reset({"prompt": "12*34="})
    assert calculator.step("<think>[12*34]") == Reply("=408")
    assert calculator.step("[7/2]") == Reply("=7/2")
    assert calculator.step("[12*]") == Reply("=?")
    assert calculator.step("no call]") == Reply("=?")
    assert calculator.step("[1+1]") == Reply("=!", done=True)   # a fifth call: over


@pytest.mark.parametrize("name, message", [
    ("Raises", "environment 'tests.episode_envs:Raises' raised KeyError: 'no such tool' in step() on the action"),
    ("WrongType", "environment 'tests.episode_envs:WrongType' returned str '=408' for the action"),
    ("NanReward", "environment 'tests.episode_envs:NanReward' returned a Reply whose reward is nan"),
    ("NoStop", "environment 'tests.episode_envs:NoStop' needs a class attribute 'stop'"),
    ("TwoTokenStop", "environment 'tests.episode_envs:TwoTokenStop': its stop text ']]' must be one token"),
    ("Missing", "config key 'environment': 'tests.episode_envs' has no function 'Missing'"),
])
def test_an_environment_that_misbehaves_stops_the_rollout_in_one_line(name, message):
    _, tokenizer = tiny()
    generate, _ = scripted(tokenizer, {(row, turn): "1" for row in range(2) for turn in range(4)})
    ids, mask = prompts(tokenizer, ["2+2="])
    with pytest.raises((RuntimeError, TypeError, ValueError)) as error:
        roll_out_episodes(generate, [{"prompt": "2+2="}], ids, mask, SamplingParams(2, 8, 1.0), tokenizer,
                          f"tests.episode_envs:{name}", max_turns=3)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_environment_key_is_checked_when_the_config_is_built():
    with pytest.raises(ValueError, match="config key 'environment' must be 'module:Class'"):
        TrainConfig(environment="episode_envs.Echo")
    with pytest.raises(ValueError, match="config key 'max_turns' must be >= 1, got 0"):
        TrainConfig(environment=ECHO, max_turns=0)
    with pytest.raises(ValueError, match="config keys 'eval_samples' \\(4\\) and 'environment'"):
        TrainConfig(environment=ECHO, eval_samples=4)


def test_a_batch_checks_who_wrote_each_token():
    """RolloutBatch with env_mask: the two writers never mark one token, the episode (both) is
    right-padded and is exactly what attention_mask marks in the completion columns."""
    from grpo_edu.training.batch import RolloutBatch
    ids = torch.ones(1, 2, 6, dtype=torch.long)
    attention = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]).view(1, 2, 6)
    policy = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool).view(1, 2, 4)
    env = torch.tensor([[0, 1, 0, 0], [0, 0, 1, 0]], dtype=torch.bool).view(1, 2, 4)

    def batch(**changes):
        values = dict(input_ids=ids, attention_mask=attention, completion_mask=policy, old_logp=None,
                      rewards=torch.zeros(1, 2), advantages=torch.zeros(1, 2), env_mask=env)
        return RolloutBatch(**{**values, **changes})
    assert batch().num_tokens == 5   # the policy's tokens only
    with pytest.raises(ValueError, match="completion_mask must be right-padded"):
        batch(env_mask=None)   # without env_mask a gap in the completion is an error, as ever
    with pytest.raises(ValueError, match="env_mask and completion_mask both mark a token"):
        batch(env_mask=env | policy)
    with pytest.raises(ValueError, match=r"completion_mask \| env_mask must be right-padded"):
        batch(env_mask=torch.zeros_like(env), completion_mask=policy)
    with pytest.raises(ValueError, match="env_mask must have the shape of completion_mask"):
        batch(env_mask=env[..., :3])
    with pytest.raises(ValueError, match="marks a token that attention_mask marks as padding"):
        batch(attention_mask=attention * torch.tensor([1, 1, 1, 0, 1, 1]))


# --------------------------------------------------------------------------- the loss sees the policy's tokens only

def episode_batch(policy, tokenizer, config):
    """A scored batch of scripted episodes (2 prompts x G = 4), as the trainer builds it."""
    script = {}
    for row in range(8):   # even rows: one answer (0.25), odd rows: two (0.5): the advantages differ
        script.update({(row, 0): "ab1"[row % 3:] or "q1", (row, 1): "7" * (row % 4) + ("1" if row % 2 else "e"),
                       (row, 2): "end"})
    generate, _ = scripted(tokenizer, script)
    samples = [{"prompt": "2+2=", "answer": "4"}, {"prompt": "31+4=", "answer": "35"}]
    ids, mask = prompts(tokenizer, [s["prompt"] for s in samples])
    rollout = roll_out_episodes(generate, samples, ids, mask, SamplingParams(4, 14, 1.0), tokenizer, ECHO, 3)
    _, rewards = functions_from_config(config)
    batch, plan = scoring.score(config, samples, rollout, tokenizer, rewards,
                                lambda r: r - r.mean(1, keepdim=True))
    return batch, plan


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_environment_tokens_get_no_gradient_and_count_in_no_normaliser(loss_type):
    """Through the trainer's own micro_batch_loss: the gradient with respect to the logits that
    score an environment token is exactly zero (and not at the policy's); the loss, with the
    KL, TIS and the sampler's log-probs on, is grpo_loss of the same forward with the
    environment's spans removed from the mask and nothing else changed."""
    torch.manual_seed(0)
    policy, tokenizer = tiny()
    config = TrainConfig(num_generations=4, prompts_per_step=2, max_completion_length=14, beta=0.04,
                         loss_type=loss_type, tis_cap=2.0, environment=ECHO, engine="hf", threads=1)
    batch, plan = episode_batch(policy, tokenizer, config)
    assert batch.env_mask.any() and (batch.completion_mask.sum(-1) < (batch.completion_mask | batch.env_mask).sum(-1)).all()
    models = placement.build_models(config, placement.World(), policy)
    batch = update.add_logprobs(config, models, replace_old(batch), plan)
    part = batch.rows(slice(0, 8))
    captured = []
    def keep(module, inputs, out):
        out.retain_grad()
        captured.append(out)
    hook = policy.lm_head.register_forward_hook(keep)
    totals = plan.totals(0, loss_type)
    loss, out, logp = update.micro_batch_loss(LossSettings.of(config), models.train_logprobs, part, totals)
    hook.remove()
    loss.backward()
    S = batch.completion_length
    grad = captured[0].grad[:, :S]          # (n, S, V): the logits that score completion column s (the last S + 1 kept)
    assert (grad[part.env_mask] == 0).all()
    assert (grad[part.completion_mask].abs().sum(-1) > 0).any()
    # The same numbers from grpo_loss on that forward, the mask the policy's tokens only.
    by_hand = grpo_loss(logp, part.old_logp, part.advantages, part.completion_mask, ref_logp=part.ref_logp,
                        beta=0.04, loss_type=loss_type, max_completion_length=14,
                        num_items=totals.num_items, num_completions=totals.num_completions,
                        sampler_logp=part.sampler_logp, tis_cap=2.0)
    assert torch.equal(out.loss.detach(), by_hand.loss)
    # An environment token's log-prob is never computed into the loss: 0 in every input.
    for name in ("old_logp", "ref_logp", "sampler_logp"):
        assert (getattr(part, name)[part.env_mask] == 0).all(), name
    assert int(plan.lengths.sum()) == int(batch.completion_mask.sum())   # dapo's and bnpo's token counts


def replace_old(batch):
    return dataclasses.replace(batch, old_logp=batch.sampler_logp.clone())


def test_the_forward_attends_to_the_environments_tokens():
    """Context, not padding: the policy's log-probs after an answer depend on what the
    environment wrote (another answer text gives other log-probs)."""
    torch.manual_seed(0)
    policy, tokenizer = tiny()
    config = TrainConfig(num_generations=4, prompts_per_step=2, max_completion_length=14, environment=ECHO,
                         engine="hf", threads=1, beta=0.0)
    batch, plan = episode_batch(policy, tokenizer, config)
    models = placement.build_models(config, placement.World(), policy)
    first = update.policy_logprobs(config, models, batch, plan)
    ids = batch.input_ids.clone()
    P = batch.prompt_length
    ids[..., P:][batch.env_mask] = tokenizer.convert_tokens_to_ids("9")
    other = update.policy_logprobs(config, models, dataclasses.replace(batch, input_ids=ids), plan)
    after = batch.completion_mask & (batch.env_mask.cumsum(-1) > 0)   # policy tokens after an answer
    assert not torch.equal(first[after], other[after])
    before = batch.completion_mask & (batch.env_mask.cumsum(-1) == 0)
    assert torch.equal(first[before], other[before])


# --------------------------------------------------------------------------- the trainer

def episode_run(tmp_path, name, resume=None, stop_after=None, **overrides):
    torch.manual_seed(0)
    policy, tokenizer = tiny()
    # 40 tokens: a random tiny policy writes the hand-over ('1', 1 token in 100) in a third of them
    settings = {"environment": ECHO, "max_turns": 3, "max_completion_length": 40, "steps": 2,
                "checkpoint_every": 0, "eval_every": 2, "learning_rate": 1e-2, **overrides}
    config = small_config(tmp_path, output_dir=str(tmp_path / name), **settings)
    return trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None, resume=resume,
                         stop_after=stop_after)


@pytest.mark.parametrize("engine", ["fused", "hf"])
def test_the_trainer_trains_on_episodes(tmp_path, engine):
    result = episode_run(tmp_path, engine, engine=engine)
    for metrics in result.history:
        assert 1 < metrics["episode/turns"] <= 3 and metrics["episode/env_tokens"] > 0
        assert metrics["reward/environment"] > 0 and metrics["loss"] == metrics["loss"]
        # Each turn's sampler log-probs (from the prompt, the episode so far and the answers) are the
        # trainer's forward over the whole episode, the environment's tokens attended and not scored.
        assert metrics["sampler_gap/mean_abs"] < 1e-5 and metrics["sampler_gap/max_ratio"] < 1 + 1e-4
        # completion_length counts the policy's tokens; the episode (40 at most) holds the environment's too
        assert metrics["completion_length/mean"] + metrics["episode/env_tokens"] <= 40
    assert 0 <= result.history[-1]["eval/tool_call_rate"] <= 1   # held out: greedy episodes, with the environment


def test_max_turns_bounds_the_episodes(tmp_path):
    one = episode_run(tmp_path, "one", max_turns=1)
    assert all(m["episode/turns"] == 1 and m["episode/env_tokens"] == 0 for m in one.history)
    assert all(m["episode/turn_limit"] > 0 for m in one.history)   # a hand-over on the only turn: unanswered


def test_without_an_environment_nothing_changes(tmp_path):
    """environment = '' is the single-turn trainer: no episode metrics, no env_mask."""
    result = episode_run(tmp_path, "single", environment="")
    assert not any(key.startswith("episode/") or key == "reward/environment" for key in result.history[0])


def test_through_vllm_the_engine_samples_each_turn(tmp_path):
    from vllm_fake import fake_vllm
    with fake_vllm():
        result = episode_run(tmp_path, "vllm", engine="vllm", vllm_sleep_mode=False)
    assert all(m["episode/turns"] > 1 for m in result.history)


def test_lagged_episodes_sampled_in_the_background_resume_bitwise(tmp_path):
    """rollout_lag = 1 with rollout_overlap: the in-flight episode (its env_mask and episode
    statistics) goes into the checkpoint; the resumed run is the uninterrupted one, bit for bit."""
    settings = {"rollout_lag": 1, "rollout_overlap": True, "steps": 4, "checkpoint_every": 1}
    whole = episode_run(tmp_path, "whole", **settings)
    episode_run(tmp_path, "stopped", stop_after=2, **settings)
    resumed = episode_run(tmp_path, "stopped", resume=tmp_path / "stopped", **settings)
    for (name, a), b in zip(whole.policy.state_dict().items(), resumed.policy.state_dict().values()):
        assert torch.equal(a, b), name
    strip = [{k: v for k, v in m.items() if not k.startswith("time/")} for m in whole.history]
    assert [{k: v for k, v in m.items() if not k.startswith("time/")} for m in resumed.history] == strip
    assert all(m["episode/turns"] > 1 for m in whole.history)


# --------------------------------------------------------------------------- the failure, on purpose

def test_the_environments_tokens_in_the_loss_are_a_failure_the_doctor_names(tmp_path):
    """Faults.env_tokens_in_loss scores the environment's tokens as the policy's: the sampler gap
    then holds -log pi of each (the sampler never drew them), and the doctor names it; the same
    run done right shows nothing."""
    from grpo_edu.doctor.diagnose import diagnose
    from grpo_edu.lab.faults import Faults
    settings = {"steps": 6, "eval_every": 6}
    right = episode_run(tmp_path, "right", **settings)
    torch.manual_seed(0)
    policy, tokenizer = tiny()
    config = small_config(tmp_path, output_dir=str(tmp_path / "leak"), environment=ECHO, max_turns=3,
                          max_completion_length=40, checkpoint_every=0, learning_rate=1e-2, **settings)
    leak = Faults(env_tokens_in_loss=True).train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None)
    assert max(m["sampler_gap/mean_abs"] for m in right.history) < 1e-5
    # measured: 0.086 to 0.18 nats per token, with 0.56 to 1.8 of each episode's 31 to 37 tokens the answers'
    assert min(m["sampler_gap/mean_abs"] for m in leak.history) > 0.05
    # the leaked run trained on more tokens than the policy wrote: its lengths count the answers
    assert leak.history[0]["completion_length/mean"] > right.history[0]["completion_length/mean"]
    assert [f.detector for f in diagnose(right.history, config.to_dict())] == []
    assert [f.detector for f in diagnose(leak.history, config.to_dict())] == ["environment_tokens_trained"]
    with pytest.raises(ValueError, match="Faults.env_tokens_in_loss: expected a multi-turn run"):
        Faults(env_tokens_in_loss=True).check(TrainConfig())


def test_a_failed_episode_stops_the_run_at_set_up_or_in_the_step_with_one_line(tmp_path):
    """What the trainer does with an environment that fails: it stops, saying which environment
    did what (no episode is dropped or trained on silently). One whose stop text is not one
    token stops before anything is built; one that raises stops at its first answer."""
    with pytest.raises(ValueError) as error:
        episode_run(tmp_path, "two-token", environment="tests.episode_envs:TwoTokenStop")
    assert "must be one token" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "two-token").exists()
    with pytest.raises(RuntimeError) as error:
        episode_run(tmp_path, "raises", environment="tests.episode_envs:Raises")
    assert str(error.value).startswith("environment 'tests.episode_envs:Raises' raised KeyError")
    assert "\n" not in str(error.value)


def test_the_episode_benchmark_measures_both_and_the_training_doc_quotes_its_file(tmp_path):
    """benchmarks/episodes.py at toy length; docs/training.md's figures are the committed file's."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from hang_guard import HANG_SECONDS
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "episodes.json"
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "episodes.py"), "--steps", "2", "--threads", "1",
                           "--out", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=HANG_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())["figures"]
    assert set(figures) == {"single-turn", "episodes"} and figures["episodes"]["turns_per_episode"] > 1
    committed = json.loads((root / "benchmarks" / "results" / "episodes.json").read_text())["figures"]
    single, multi = (committed[name]["phase_median_seconds"]["rollout"] for name in ("single-turn", "episodes"))
    readme = " ".join((root / "docs" / "training.md").read_text().split())
    assert (f"a rollout of {committed['episodes']['turns_per_episode']:.2f} turns per episode takes {multi:.3f} s "
            f"against {single:.3f} s single-turn (x{multi / single:.2f}") in readme
