"""The config owns its rules: one key's beside the key, from the module that implements them;
the rules across keys in one table; each checked once; each refusal one line naming the keys."""

import re
from pathlib import Path

import pytest

from grpo_edu.algorithm import advantages, aggregation, kl, offpolicy, surrogates
from grpo_edu.environment import process, tasks
from grpo_edu.runtime import distributed, precision
from grpo_edu.sampling import rollout, sglang_engine, vllm_engine
from grpo_edu.training import config as config_module
from grpo_edu.algorithm import schedules
from grpo_edu.config import TrainConfig
from grpo_edu.training.config_rules import RULES

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
FIELDS = TrainConfig.__dataclass_fields__


def test_allowed_values_come_from_the_module_that_implements_them():
    implemented = {"task": tasks.TASKS, "device": distributed.DEVICES, "parallelism": distributed.PARALLELISM,
                   "precision": precision.PRECISIONS, "engine": rollout.ENGINES, "vllm_mode": vllm_engine.VLLM_MODES,
                   "lr_schedule": schedules.LR_SCHEDULES, "old_logprobs": offpolicy.PI_OLD_SOURCES,
                   "is_mask": offpolicy.IS_MASKS, "loss_type": aggregation.AGGREGATIONS, "kl_estimator": kl.KL_ESTIMATES,
                   "importance_sampling_level": surrogates.RATIO_LEVELS, "supervision": process.SUPERVISIONS,
                   "advantage_scale": advantages.SCALES, "advantage_std": advantages.STD_KINDS,
                   "sglang_weight_sync": sglang_engine.WEIGHT_SYNCS}
    with_choices = {name for name, spec in FIELDS.items() if spec.metadata.get("choices") is not None}
    assert with_choices == set(implemented)
    for key, values in implemented.items():
        assert FIELDS[key].metadata["choices"] is values, key
    assert not re.search(r"\(\s*\"(grpo|k1|token|constant|fused|auto|recomputed)\"", Path(config_module.__file__).read_text()), \
        "an allowed-values tuple is typed in config.py again"


def test_a_registered_variant_is_a_value_the_config_accepts(monkeypatch):
    with pytest.raises(ValueError, match=r"config key 'loss_type' must be one of \('grpo', 'bnpo', 'dr_grpo', 'dapo'\)"):
        TrainConfig(loss_type="sum")
    monkeypatch.setitem(aggregation.AGGREGATIONS, "sum", lambda mask, counts: (None, 1.0))
    assert TrainConfig(loss_type="sum").loss_type == "sum"


def _sections(source: str) -> dict[str, str]:
    """{key: the section label of its group} from the dataclass's `# --- ...` comments."""
    label, found = "", {}
    for line in source.splitlines():
        if line.startswith("    # --- "):
            label = line
        elif match := re.match(r"    (\w+): [\w\[\], |]+ = _doc\(", line):
            found[match[1]] = label
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_keys_are_grouped_as_the_toml_files_group_them(path):
    sections = _sections(Path(config_module.__file__).read_text())
    assert set(sections) == set(FIELDS)
    data = tomllib.loads(path.read_text())
    for key, value in data.items():
        if key == "rewards":
            assert "[rewards]" in sections[key]
        elif isinstance(value, dict):
            for inner in value:
                assert f"[{key}]" in sections[inner], f"{path.name}: [{key}] {inner} is under {sections[inner]!r}"
        else:
            assert "top level" in sections[key], f"{path.name}: top-level {key} is under {sections[key]!r}"


# One config that breaks each rule across keys (and no key's own rule).
BREAKS = {
    ("eval_samples", "environment"): {"environment": "grpo_edu.training.episodes:Calculator", "eval_samples": 4},
    ("num_mini_batches", "prompts_per_step"): {"num_mini_batches": 3},
    ("overlong_cache", "max_completion_length"): {"overlong_cache": 16},
    ("rollout_lag", "num_iterations", "num_mini_batches"): {"rollout_lag": 1, "num_iterations": 2},
    ("rollout_overlap", "rollout_lag"): {"rollout_overlap": True},
    ("rollout_overlap", "vllm_sleep_mode"): {"rollout_overlap": True, "rollout_lag": 1, "engine": "vllm"},
    ("rollout_overlap", "sglang_sleep"): {"rollout_overlap": True, "rollout_lag": 1, "engine": "sglang",
                                          "sglang_sleep": True},
    ("sglang_sleep", "environment"): {"engine": "sglang", "sglang_sleep": True,
                                      "environment": "grpo_edu.training.episodes:Calculator"},
    ("sglang_weight_sync", "sglang_url"): {"sglang_weight_sync": "tensor", "sglang_url": "http://10.1.2.3:30000"},
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
    for rule in RULES:
        assert set(rule.keys) <= set(FIELDS), rule.keys
        values = BREAKS[rule.keys]
        with pytest.raises(ValueError) as error:
            TrainConfig(**values)
        message = str(error.value)
        assert "\n" not in message
        assert message == rule.message(_unchecked(values))
        for key in rule.keys:
            assert key in message, (rule.keys, message)


def _unchecked(values: dict) -> TrainConfig:
    """A TrainConfig holding `values` without validating them (to compute a rule's message)."""
    config = TrainConfig()
    for key, value in values.items():
        object.__setattr__(config, key, value)
    return config


def test_each_rule_is_checked_in_one_place():
    from grpo_edu.policy import lora
    assert not hasattr(lora, "check_config") and not hasattr(process, "check_config")
    own = {name for name, spec in FIELDS.items()
           if any(spec.metadata.get(rule) is not None for rule in ("choices", "at_least", "above", "check"))}
    # a key with a rule of its own is not checked again by a rule across keys that only restates it
    assert "overlong_cache" not in own and "tis_cap" in own
    assert len(RULES) == len({rule.keys for rule in RULES})
