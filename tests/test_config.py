"""The config's sections as types: each key in one section, documented and checked beside its rules,
the allowed values from the module that implements them; the rules across keys in one table;
each refusal one line naming the keys; every loss rule a config rule."""

import dataclasses
import re
from pathlib import Path

import pytest

from grpo_edu.algorithm import advantages, aggregation, kl, offpolicy, schedules, surrogates
from grpo_edu.algorithm.loss import LossSettings
from grpo_edu.config import TrainConfig, sections
from grpo_edu.config.rules import RULES
from grpo_edu.config.keys import SECTIONS, all_sections, key_field, key_index
from grpo_edu.environment import process
from grpo_edu.environment.registry import TASKS
from grpo_edu.runtime import distributed, precision
from grpo_edu.runtime.settings import Section, setting
from grpo_edu.sampling import engines

ROOT = Path(__file__).resolve().parent.parent


def test_allowed_values_come_from_the_module_that_implements_them():
    implemented = {"task": TASKS, "device": distributed.DEVICES, "parallelism": distributed.PARALLELISM,
                   "precision": precision.PRECISIONS, "engine": engines.ENGINES, "vllm_mode": engines.VLLM_MODES,
                   "lr_schedule": schedules.LR_SCHEDULES, "old_logprobs": offpolicy.PI_OLD_SOURCES,
                   "is_mask": offpolicy.IS_MASKS, "loss_type": aggregation.AGGREGATIONS,
                   "surrogate": surrogates.SURROGATES, "kl_estimator": kl.KL_ESTIMATES,
                   "importance_sampling_level": surrogates.RATIO_LEVELS, "supervision": process.SUPERVISIONS,
                   "advantage_scale": advantages.SCALES, "advantage_std": advantages.STD_KINDS,
                   "sglang_weight_sync": engines.WEIGHT_SYNCS}
    with_choices = {key for key in key_index() if key_field(key).metadata.get("choices") is not None}
    assert with_choices == set(implemented)
    for key, values in implemented.items():
        assert key_field(key).metadata["choices"] is values, key
    source = Path(sections.__file__).read_text()
    assert not re.search(r"\(\s*\"(grpo|k1|token|constant|fused|auto|recomputed)\"", source), \
        "an allowed-values tuple is typed in the sections again"


def test_a_registered_variant_is_a_value_the_config_accepts(monkeypatch):
    with pytest.raises(ValueError, match=r"config key 'loss_type' must be one of \('grpo', 'bnpo', 'dr_grpo', 'dapo'\)"):
        TrainConfig(loss_type="sum")
    monkeypatch.setitem(aggregation.AGGREGATIONS, "sum", aggregation.Aggregation(lambda mask, counts: (None, 1.0)))
    assert TrainConfig(loss_type="sum").loss.loss_type == "sum"


def test_every_key_lives_in_one_section_and_reads_by_name():
    index = key_index()
    assert len(index) == sum(len(section.keys()) for section in all_sections().values())
    assert list(SECTIONS) == ["run", "data", "rollout", "optimisation", "off_policy", "lora", "loss", "advantages",
                              "logging"]
    assert {"vllm", "sglang"} <= set(all_sections())   # the engines' own sections, from their registrations
    config = TrainConfig(beta=0.0, steps=7, vllm_mode="server", engine="vllm")
    assert (config.loss.beta, config.optimisation.steps, config.vllm.vllm_mode) == (0.0, 7, "server")
    assert config.value("steps") == 7 and config.section_of("beta") is config.loss
    assert config.to_dict()["beta"] == 0.0 and set(config.to_dict()) == set(index)
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert config.replace(steps=9).optimisation.steps == 9 and config.optimisation.steps == 7
    assert TrainConfig(loss=sections.Loss(beta=0.5)).loss.beta == 0.5
    for section in all_sections().values():
        assert issubclass(section, Section) and dataclasses.is_dataclass(section)
        for f in dataclasses.fields(section):
            assert f.metadata["doc"], f.name


def test_a_key_read_without_its_section_says_where_it_is():
    with pytest.raises(AttributeError, match=r"the key is in section 'loss' \(config.loss.beta; config.value\('beta'\)\)"):
        TrainConfig().beta
    with pytest.raises(ValueError, match=r"^unknown config key 'bta'; known keys: imports, model"):
        TrainConfig(bta=0.0)
    with pytest.raises(ValueError, match=r"config section 'loss' given whole and keys of it by name \(beta\)"):
        TrainConfig(loss=sections.Loss(), beta=0.0)
    with pytest.raises(ValueError, match=r"config key 'steps' must be an integer, got 1.5"):
        TrainConfig(steps=1.5)


def test_an_engine_whose_settings_reuse_a_key_is_refused(monkeypatch):
    @dataclasses.dataclass
    class Reuses(Section):
        title = "reuses"
        beta: float = setting("a key of the loss section again", 0.0)

    monkeypatch.setitem(engines.ENGINES, "reuses", engines.Engine("reuses", "m:f", "", settings=Reuses))
    with pytest.raises(ValueError, match=r"config key 'beta' is in two sections, \[loss\] and \[reuses\]"):
        TrainConfig()


# Every loss rule is a config rule, naming its key, refused when the config is made (not at the first update).
@pytest.mark.parametrize("values, message", [
    ({"beta": -0.1}, "config key 'beta' must be a number >= 0 (the KL term's weight), got -0.1"),
    ({"epsilon": 1.5}, "config key 'epsilon' must be a number in [0, 1) (the clip range below: ratio >= 1 - "
                       "epsilon), got 1.5"),
    ({"epsilon_high": -0.2}, "config key 'epsilon_high' must be a number >= 0 (the clip range above: ratio <= 1 + "
                             "epsilon_high), or None (= epsilon), got -0.2"),
    ({"ratio_cap": 0.5}, "config key 'ratio_cap' must be 0 (unused: the clipped surrogate) or a finite number > 1"),
    ({"surrogate": "capped"}, "config keys 'surrogate' ('capped') and 'ratio_cap' (0.0): surrogate = 'capped' needs "
                              "ratio_cap"),
    ({"ratio_cap": 2.0}, "config keys 'surrogate' ('clip') and 'ratio_cap' (2.0): ratio_cap = 2.0 is the capped "
                         "surrogate's largest weight, but surrogate = 'clip' has no cap"),
    ({"surrogate": "capped", "ratio_cap": 2.0, "epsilon": 0.3},
     "config key 'epsilon' (0.3) sets the clip range, but surrogate = 'capped' has no clip"),
    ({"loss_type": "mean"}, "config key 'loss_type' must be one of"),
    ({"importance_sampling_level": "word"}, "config key 'importance_sampling_level' must be one of"),
    ({"kl_estimator": "k4"}, "config key 'kl_estimator' must be one of"),
    ({"overlong_cache": 16}, "config key 'overlong_cache' must be an int in [0, max_completion_length = 16)"),
])
def test_every_loss_rule_is_a_config_rule_naming_its_key(values, message):
    with pytest.raises(ValueError) as error:
        TrainConfig(**values)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_the_loss_settings_of_a_config_are_what_it_says():
    config = TrainConfig(beta=0.1, loss_type="dr_grpo", max_completion_length=12, tis_cap=2.0,
                         surrogate="clip", epsilon_high=0.28)
    assert LossSettings.of(config) == LossSettings(beta=0.1, loss_type="dr_grpo", max_completion_length=12,
                                                   tis_cap=2.0, epsilon=0.2, epsilon_high=0.28)
    capped = TrainConfig(surrogate="capped", ratio_cap=3.0, loss_type="dapo")
    assert LossSettings.of(capped).surrogate == "capped" and LossSettings.of(capped).ratio_cap == 3.0


# One config that breaks each rule across keys (and no key's own rule).
BREAKS = {
    ("engine",): {"vllm_mode": "server"},
    ("task",): {"digitsum_depths": [3, 5]},
    ("eval_samples", "environment"): {"environment": "grpo_edu.training.episodes:Calculator", "eval_samples": 4},
    ("num_mini_batches", "prompts_per_step"): {"num_mini_batches": 3},
    ("overlong_cache", "max_completion_length"): {"overlong_cache": 16},
    ("surrogate", "ratio_cap"): {"surrogate": "capped"},
    ("epsilon", "surrogate"): {"surrogate": "capped", "ratio_cap": 2.0, "epsilon": 0.3},
    ("epsilon_high", "surrogate"): {"surrogate": "capped", "ratio_cap": 2.0, "epsilon_high": 0.3},
    ("rollout_lag", "num_iterations", "num_mini_batches"): {"rollout_lag": 1, "num_iterations": 2},
    ("rollout_overlap", "rollout_lag"): {"rollout_overlap": True},
    ("rollout_overlap", "vllm_sleep_mode"): {"rollout_overlap": True, "rollout_lag": 1, "engine": "vllm"},
    ("rollout_overlap", "sglang_sleep"): {"rollout_overlap": True, "rollout_lag": 1, "engine": "sglang",
                                          "sglang_sleep": True},
    ("sglang_sleep", "environment"): {"engine": "sglang", "sglang_sleep": True,
                                      "environment": "grpo_edu.training.episodes:Calculator"},
    ("sglang_weight_sync", "sglang_url"): {"engine": "sglang", "sglang_weight_sync": "tensor",
                                           "sglang_url": "http://10.1.2.3:30000"},
    ("tis_cap", "is_mask"): {"tis_cap": 2.0, "is_mask": "token"},
    ("tis_cap", "old_logprobs"): {"tis_cap": 2.0, "old_logprobs": "sampler"},
    ("is_mask", "old_logprobs"): {"is_mask": "token", "old_logprobs": "sampler"},
    ("advantage_fn", "advantage_scale", "advantage_std"): {"advantage_fn": "m:f", "advantage_scale": "batch"},
    ("ref_mixup_alpha", "ref_sync_steps", "beta"): {"ref_mixup_alpha": 0.5},
    ("lora_alpha", "lora_rank"): {"lora_alpha": 8.0},
    ("lora_target_modules", "lora_rank"): {"lora_target_modules": ["q_proj"]},
    ("lora_rank", "ref_sync_steps"): {"lora_rank": 4, "ref_sync_steps": 10},
    ("supervision", "task"): {"supervision": "process"},
    ("supervision", "advantage_fn"): {"supervision": "process", "task": "chain", "advantage_fn": "m:f"},
    ("supervision", "advantage_scale"): {"supervision": "process", "task": "chain", "advantage_scale": "batch"},
    ("supervision", "importance_sampling_level"): {"supervision": "process", "task": "chain",
                                                   "importance_sampling_level": "sequence"},
    ("supervision", "filter_zero_std_groups"): {"supervision": "process", "task": "chain",
                                                "filter_zero_std_groups": True},
    ("supervision", "dynamic_sampling_rounds"): {"supervision": "process", "task": "chain",
                                                 "dynamic_sampling_rounds": 2},
    ("supervision", "environment"): {"supervision": "process", "task": "chain",
                                     "environment": "grpo_edu.training.episodes:Calculator"},
}


def test_every_rule_across_keys_is_one_line_naming_its_keys():
    assert sorted(rule.keys for rule in RULES) == sorted(BREAKS), "a rule without a breaking config here, or the reverse"
    fired = []
    for rule in RULES:
        assert set(rule.keys) <= set(key_index()), rule.keys
        with pytest.raises(ValueError) as error:
            TrainConfig(**BREAKS[rule.keys])
        message = str(error.value)
        assert "\n" not in message
        broken = [r for r in RULES if r.keys == rule.keys]
        assert len(broken) == 1
        for key in rule.keys:
            assert key in message, (rule.keys, message)
        fired.append(message)
    assert len(set(fired)) == len(fired), "two rules answer with the same line"


def test_an_engine_or_task_setting_for_another_one_configures_nothing_and_is_refused():
    with pytest.raises(ValueError, match=r"^config key 'vllm_mode' configures the engine 'vllm', not engine = 'fused', "
                                         r"so it would do nothing: set engine to 'vllm', or leave it at its default$"):
        TrainConfig(vllm_mode="server")
    with pytest.raises(ValueError, match=r"^config key 'sglang_sleep' configures the engine 'sglang', not engine = 'vllm'"):
        TrainConfig(engine="vllm", sglang_sleep=True)
    assert TrainConfig(engine="sglang", sglang_sleep=True).sglang.sglang_sleep
    with pytest.raises(ValueError, match=r"^config key 'digitsum_depths' configures the task 'digitsum', not task = "
                                         r"'arithmetic'"):
        TrainConfig(digitsum_depths=[3, 5])
    assert TrainConfig(task="digitsum", digitsum_depths=[3, 5]).registered["digitsum"].digitsum_depths == [3, 5]


def test_each_rule_is_checked_in_one_place():
    from grpo_edu.policy import lora
    assert not hasattr(lora, "check_config") and not hasattr(process, "check_config")
    own = {key for key in key_index() if any(key_field(key).metadata.get(rule) is not None
                                             for rule in ("choices", "at_least", "above", "check"))}
    # a key with a rule of its own is not checked again by a rule across keys that only restates it
    assert "tis_cap" in own and {"beta", "epsilon", "epsilon_high"} <= own and "overlong_cache" not in own
    assert len(RULES) == len({rule.keys for rule in RULES})
    # overlong_cache's range: one function (grpo_edu.environment.rewards), used by the config and the reward
    sources = "".join(p.read_text() for p in (ROOT / "grpo_edu").rglob("*.py"))
    assert sources.count("stretch before the limit where the punishment falls") == 1
    assert not (ROOT / "grpo_edu" / "algorithm" / "loss_checks.py").exists()


def test_imports_registers_a_variant_before_the_config_is_checked(tmp_path, monkeypatch):
    (tmp_path / "sum_loss.py").write_text(
        "from grpo_edu.algorithm.aggregation import aggregation\n"
        "@aggregation('plain_sum')\n"
        "def divisors(mask, counts):\n"
        "    return None, 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(aggregation.AGGREGATIONS, "plain_sum", raising=False)
    with pytest.raises(ValueError, match="config key 'loss_type' must be one of"):
        TrainConfig(loss_type="plain_sum")
    config = TrainConfig(imports=["sum_loss"], loss_type="plain_sum")
    assert config.loss.loss_type == "plain_sum" and config.run.imports == ["sum_loss"]
    aggregation.AGGREGATIONS.pop("plain_sum")
    with pytest.raises(ValueError, match=r"config key 'imports': cannot import 'no_such_module_here'"):
        TrainConfig(imports=["no_such_module_here"])
