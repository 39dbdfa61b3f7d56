"""benchmarks/profile_step.py: its operator kinds, its compute floor by hand, and a short run that
writes every figure the closing note quotes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import profile_step  # noqa: E402


@pytest.mark.parametrize("name, kind", [
    ("aten::addmm", "matrix products"), ("aten::mm", "matrix products"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
    ("aten::mul", "elementwise"), ("aten::silu_backward", "elementwise"), ("aten::bitwise_or", "elementwise"),
    ("aten::_log_softmax_backward_data", "reductions and softmax"), ("aten::sum", "reductions and softmax"),
    ("aten::copy_", "memory and indexing"), ("aten::_index_put_impl_", "memory and indexing"),
    ("aten::empty_strided", "memory and indexing"), ("aten::_fused_adamw_", "optimizer"),
    ("aten::_foreach_mul_", "optimizer"), ("aten::some_new_op", "other operators"),
    ("autograd::engine::evaluate_function: MmBackward0", "other operators"),
])
def test_operator_kinds(name, kind):
    assert profile_step.kind_of(name) == kind


def test_the_floor_by_hand():
    shapes = {"matrix_weights": 1000, "layers": 2, "width": 8}
    # one prompt of 3 tokens (contexts 1 + 2 + 3 = 6), one completion of 2 tokens after it (4 + 5 = 9)
    step = {"prompt_tokens": 3, "prompt_context": 6, "completion_tokens": 2, "completion_context": 9}
    forward = 2 * 1000 * 5 + 4 * 8 * 2 * 15
    floor = profile_step.floor_ms(shapes, step, rate=1e9)
    assert floor["flops"] == {"rollout": forward, "scoring": forward, "update": 3 * forward}
    assert floor["ms"]["update"] == pytest.approx(3e3 * forward / 1e9)
    # beta = 0 (make train's config): no reference, so scoring's floor is 0, the others unchanged
    alone = profile_step.floor_ms(shapes, step, rate=1e9, reference=False)
    assert alone["flops"] == {"rollout": forward, "scoring": 0.0, "update": 3 * forward}


def test_a_short_profile_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert profile_step.main(["--warmup", "1", "--steps", "2", "--threads", "1", "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    for phase in profile_step.PHASES:
        kinds = payload["profiled_ms"][phase]
        assert kinds["total"] > 0 and kinds["matrix products"] > 0
        parts = sum(v for k, v in kinds.items() if k != "total")
        assert parts == pytest.approx(kinds["total"], rel=0.02), phase   # the kinds add up to the phase
        assert 0 < payload["fraction_of_floor"][phase] < 1
    assert payload["tokens_per_step"]["completions"] == 128 and payload["threads"] == 1
    assert payload["cpu_capability"] and payload["decode_steps_per_rollout"] > 0
    assert "floor/measured" in capsys.readouterr().out


def test_bad_arguments_are_one_line():
    with pytest.raises(SystemExit):
        profile_step.main(["--steps", "0"])
