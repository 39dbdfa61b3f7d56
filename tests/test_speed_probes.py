"""benchmarks/speed_probes.py: its per-completion masks by hand, its attentions equal to each other
where they compute the same thing, and a short run that writes every figure the docs quote."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import speed_probes  # noqa: E402


def test_per_completion_masks_by_hand():
    # One prompt [pad, a, b] with G = 2 completions: [c, d] and [e, pad].
    prompt_mask = torch.tensor([[0, 1, 1]])
    completion_mask = torch.tensor([[[1, 1], [1, 0]]])
    prompts, completions = speed_probes.per_completion_masks(prompt_mask, completion_mask)
    assert prompts.shape == (1, 1, 3, 3) and completions.shape == (2, 1, 2, 5)
    assert prompts[0, 0].int().tolist() == [[1, 0, 0],     # the padding query sees itself only
                                            [0, 1, 0],
                                            [0, 1, 1]]
    assert completions[0, 0].int().tolist() == [[0, 1, 1, 1, 0],   # c: the prompt's a, b and itself
                                                [0, 1, 1, 1, 1]]   # d: a, b, c and itself
    assert completions[1, 0].int().tolist() == [[0, 1, 1, 1, 0],   # e
                                                [0, 1, 1, 1, 1]]   # the padding after e: a, b, e, itself (never scored)


def test_timed_pairs_each_call_with_the_first_ones(monkeypatch):
    now = {"seconds": 0.0}    # a clock that moves only when a timed function runs
    monkeypatch.setattr(speed_probes.time, "perf_counter", lambda: now["seconds"])

    def taking(seconds):
        def function():
            now["seconds"] += seconds
        return function

    result = speed_probes.timed({"now": taking(0.001), "tried": taking(0.003)}, repeats=10, warmup=1)
    assert result["ms"] == {"now": 1.0, "tried": 3.0}
    assert set(result["minus_first"]) == {"tried"}
    assert result["minus_first"]["tried"]["median"] == pytest.approx(2.0)
    assert result["minus_first"]["tried"]["interval"] == pytest.approx([2.0, 2.0])


def test_the_eager_attention_is_the_fused_one():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    mask = (torch.rand(2, 1, 7, 7, generator=generator) < 0.5) | torch.eye(7, dtype=torch.bool)
    torch.testing.assert_close(speed_probes.packed_eager(q, k, v, mask), speed_probes.packed_sdpa(q, k, v, mask),
                               rtol=1e-12, atol=1e-12)


def test_the_per_completion_attention_is_the_packed_one():
    """What the probe times per completion is the function the packed grid computes, for the
    completions' queries: the same outputs (float64), so the two timings compare like with like."""
    generator = torch.Generator().manual_seed(1)
    P, S, G, D = 3, 2, 2, 4
    prompt_mask = torch.tensor([[0, 1, 1]])
    completion_mask = torch.tensor([[[1, 1], [1, 0]]])
    pk, pv = (torch.randn(1, 1, P, D, generator=generator, dtype=torch.float64) for _ in range(2))
    cq, ck, cv = (torch.randn(G, 1, S, D, generator=generator, dtype=torch.float64) for _ in range(3))
    _, completions = speed_probes.per_completion_masks(prompt_mask, completion_mask)
    alone = F.scaled_dot_product_attention(cq, torch.cat([pk.expand(G, -1, -1, -1), ck], 2),
                                           torch.cat([pv.expand(G, -1, -1, -1), cv], 2), attn_mask=completions)
    # The packed grid: [prompt | completion 1 | completion 2], completion g sees the prompt and itself.
    grid_k = torch.cat([pk, ck[0:1], ck[1:2]], 2)
    grid_v = torch.cat([pv, cv[0:1], cv[1:2]], 2)
    grid_q = torch.cat([torch.zeros(1, 1, P, D, dtype=torch.float64), cq[0:1], cq[1:2]], 2)
    block = torch.tensor([-1] * P + [0] * S + [1] * S)
    real = torch.cat([prompt_mask[0], completion_mask[0].reshape(-1)]).bool()
    L = P + G * S
    visible = (block[None, :] == -1) | (block[None, :] == block[:, None])
    mask = (torch.ones(L, L, dtype=torch.bool).tril() & visible & real[None, :]) | torch.eye(L, dtype=torch.bool)
    packed = speed_probes.packed_sdpa(grid_q, grid_k, grid_v, mask)[0, 0, P:].view(G, S, D)
    scored = completion_mask[0].bool()
    torch.testing.assert_close(alone[:, 0][scored], packed[scored], rtol=1e-12, atol=1e-12)


def test_a_short_run_writes_every_figure(tmp_path, capsys, monkeypatch):
    # torch.compile itself takes ~10 s; here it is the identity, which still runs the probe's path.
    monkeypatch.setattr(torch, "compile", lambda function, **options: function)
    out = tmp_path / "probes.json"
    assert speed_probes.main(["--warmup", "2", "--repeats", "6", "--threads", "1", "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert set(payload["attention"]["ms"]) == {"packed", "per completion", "packed, eager"}
    assert all(ms > 0 for ms in payload["attention"]["ms"].values())
    B, heads, L, D = payload["attention"]["shapes"]["packed"]
    assert (B, heads, D) == (16, 4, 32) and payload["attention"]["shapes"]["completions"][0] == 128
    assert set(payload["compile"]["ms"]) == {"eager", "compiled"} and payload["compile"]["compile_seconds"] >= 0
    assert set(payload["compile"]["minus_first"]) == {"compiled"}
    assert set(payload["attention"]["minus_first"]) == {"per completion", "packed, eager"}
    assert set(payload["sampler_threads"]["ms"]) == {"1 thread"}
    assert payload["threads"] == 1 and payload["cpu_capability"]
    assert "attention of one layer" in capsys.readouterr().out
    assert torch.get_num_threads() == 1


def test_config_and_probes_choose_the_run_and_what_is_timed(tmp_path, capsys):
    """--config trains another config's step (the digit sum: longer completions, another base), and
    --probes runs only the probes named: here attention, with neither compile nor the sampler timed."""
    out = tmp_path / "probes.json"
    config = ROOT / "configs" / "cpu-reasoning.toml"
    assert speed_probes.main(["--config", str(config), "--probes", "attention", "--warmup", "1",
                              "--repeats", "6", "--threads", "1", "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["config"] == "cpu-reasoning.toml"
    assert "attention" in payload and "compile" not in payload and "sampler_threads" not in payload
    B, heads, L, D = payload["attention"]["shapes"]["packed"]
    assert B == 16 and payload["attention"]["shapes"]["completions"][0] == 128
    # the digit-sum base's prompts ("a3b8c5d1e9=" and longer) are longer than make train's ("47+85=")
    assert payload["attention"]["shapes"]["prompts"][2] > 7
    text = capsys.readouterr().out
    assert "attention of one layer" in text and "one rollout" not in text and "compiling" not in text


def test_bad_arguments_are_one_line(capsys):
    with pytest.raises(SystemExit):
        speed_probes.main(["--repeats", "0"])
    with pytest.raises(SystemExit):
        speed_probes.main(["--repeats", "5"])   # a 95% sign-test interval needs 6 pairs
    assert "--repeats: expected at least 6 (for a 95% interval of paired differences), got 5" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        speed_probes.main(["--probes", "attention,speed"])
    assert ("--probes: expected a comma-separated list of attention, compile, threads, got 'attention,speed'"
            in capsys.readouterr().err)
    with pytest.raises(SystemExit):
        speed_probes.main(["--config", "no-such.toml"])
    assert "--config: expected a TOML config file, got 'no-such.toml' (no such file)" in capsys.readouterr().err


def test_the_docs_quote_the_results():
    """docs/training.md's "Why not 3x": the probes' table is the committed files', and the bound
    without Python is computed from the profile of make train's step and the vs_trl table above it."""
    doc = (ROOT / "docs" / "training.md").read_text()
    results = ROOT / "benchmarks" / "results"
    native, avx2 = (json.loads((results / name).read_text()) for name in ("speed_probes.json", "speed_probes_avx2.json"))
    assert native["cpu_capability"] == "AVX512" and avx2["ATEN_CPU_CAPABILITY"] == "avx2"
    for row in speed_probes.markdown_rows(native, avx2):
        assert row in doc, row
    section = " ".join(doc.split("### Why not 3x")[1].split("## Speed")[0].split())
    saved = [-results["compile"]["minus_first"]["compiled"]["median"] for results in (native, avx2)]
    seconds = [results["compile"]["compile_seconds"] for results in (native, avx2)]
    # "wins" and "loses" only where the paired interval excludes zero, on both kernel settings
    assert all(results["compile"]["minus_first"]["compiled"]["interval"][1] < 0 for results in (native, avx2))
    assert all(d["interval"][0] > 0 for results in (native, avx2)
               for d in [*results["attention"]["minus_first"].values(), results["sampler_threads"]["minus_first"]["1 thread"]])
    assert (f"{saved[0]:.1f} ms shorter on AVX-512 and {saved[1]:.1f} ms on AVX2, about "
            f"{saved[0] / native['compile']['ms']['eager']:.0%} of it" in section)
    assert f"Compiling took {seconds[0]} s and {seconds[1]} s from an empty cache" in section
    assert f"Compiling would spend {seconds[0]:.0f} of the first run's 30 seconds, to save about {saved[0]:.1f} ms" in section
    profiled = json.loads((results / "profile_step_first_run.json").read_text())["profiled_ms"]
    total = sum(phase["total"] for phase in profiled.values())
    python = sum(phase["Python and dispatch"] for phase in profiled.values())
    arithmetic = sum(phase["matrix products"] + phase["attention"] for phase in profiled.values())
    ours, trl = 0.051, 0.124   # the AVX-512 rows of the table at make train's setting
    assert f"| AVX-512 | grpo_edu | {ours} |" in doc and f"| AVX-512 | TRL 1.16 GRPOTrainer | {trl} |" in doc
    without = ours * (1 - python / total)
    assert (f"{arithmetic:.1f} of its {total:.1f} profiled ms" in section
            and f"{python:.1f} ms ({python / total:.0%})" in section
            and f"about {without:.3f} s: {trl / without:.2f}x" in section
            and f"means {trl / 3:.3f} s a step, not {ours:.3f}" in section)


def test_the_docs_say_where_the_digit_sum_steps_time_goes():
    """docs/training.md, "The digit-sum step": every figure is the committed files', and "wins" or
    "loses" only where the paired interval excludes zero."""
    doc = (ROOT / "docs" / "training.md").read_text()
    section = " ".join(doc.split("### The digit-sum step: where its time goes")[1].split("## Speed")[0].split())
    results = ROOT / "benchmarks" / "results"
    profile = json.loads((results / "profile_step_digitsum.json").read_text())
    probe = json.loads((results / "speed_probes_digitsum.json").read_text())
    first_run = json.loads((results / "profile_step_first_run.json").read_text())["profiled_ms"]["update"]
    make_train = json.loads((results / "speed_probes_avx2.json").read_text())["attention"]["minus_first"]["per completion"]
    assert profile["config"] == probe["config"] == "cpu-reasoning.toml" and profile["warmup"] == probe["warmup"] == 30
    measured, floor, update = profile["measured_ms"], profile["floor"]["ms"], profile["profiled_ms"]["update"]
    tokens = profile["tokens_per_step"]
    attention = probe["attention"]
    per_completion = attention["minus_first"]["per completion"]
    low, high = per_completion["interval"]
    assert high < 0 < make_train["interval"][0]       # a win here, a loss on make train's step
    layers = json.loads((ROOT / "grpo_edu" / "assets" / "tiny-digitsum-start" / "config.json").read_text())[
        "num_hidden_layers"]
    for phrase in [
        f"The step took {measured['step']:,.1f} ms: the rollout {measured['rollout']:.1f} (floor {floor['rollout']:.1f}), "
        f"the update {measured['update']:.1f} (floor {floor['update']:.1f})",
        f"a completion has {tokens['completion_tokens'] / tokens['completions']:.1f} tokens on average",
        f"{profile['decode_steps_per_rollout']} decode steps a rollout, {profile['ms_per_decode_step']} ms each",
        f"attention took {update['attention']:.1f} of {update['total']:.1f} ms, beside {update['matrix products']:.1f} ms",
        f"On make train's step it is {first_run['attention']:.1f} of {first_run['total']:.1f} ms",
        f"one row of {attention['shapes']['packed'][2]} columns",
        f"its prompt and itself: {attention['shapes']['keys per completion']} keys",
        f"in {attention['ms']['per completion']:.2f} ms instead of {attention['ms']['packed']:.2f}: "
        f"{per_completion['median']:+.2f} ms [{low:+.2f}, {high:+.2f}]",
        f"Over {layers} layers that is about {-layers * per_completion['median'] / measured['update']:.0%} of the update",
        f"loses ({make_train['median']:+.2f} ms on AVX2",
    ]:
        assert phrase in section, phrase
    ratio = json.loads((results / "vs_trl_digitsum.json").read_text())["speed_vs_trl"]["grpo_edu"]
    assert ratio["low"] < 3 < ratio["high"] and ratio["ratio"] < 3
    assert f"{ratio['ratio']:.2f}x [{ratio['low']:.2f}, {ratio['high']:.2f}]" in section
