"""Other ways of computing a `make train` step, each timed against what the step does now, on the
shapes of a real step: what was tried on the way to 3x TRL's speed (docs/training.md, "Why not 3x").

    python benchmarks/speed_probes.py [--config FILE] [--probes attention,compile,threads] [--warmup 40]
                                      [--repeats 30] [--threads 2] [--out FILE]
    ATEN_CPU_CAPABILITY=avx2 python benchmarks/speed_probes.py --out benchmarks/results/speed_probes_avx2.json
    python benchmarks/speed_probes.py --config configs/cpu-reasoning.toml --probes attention \
        --out benchmarks/results/speed_probes_digitsum.json

The run is configs/cpu-first-run.toml's (make train's), or --config's. --probes names the probes to
run (default all three, below). After --warmup training steps the script
keeps the last step's rollout and times each probe. The ways compared alternate call by call, so
that the machine's drift falls on all of them; each gets its median ms and, against the first (what
the step does now), the median of the paired differences with its 95% interval (`timed`):

1. attention: the update's causal attention of one layer, forward and backward, on the q, k, v
   and mask the fused forward built for that rollout (grpo_edu.sampling.fused_llama), three ways:
   - packed (what the fused forward does): each group of G completions one row of a grid, a
     block mask, PyTorch's fused attention (scaled_dot_product_attention);
   - per completion: each completion its own row with its prompt's keys before its own (the
     prompt's keys computed once and repeated, as a KV cache shares them), the same fused
     attention, plus the prompts' own causal attention: smaller problems, no wasted entries;
   - packed, eager: q k^T, the mask as -inf, softmax, times v (transformers' "eager" attention).
   --repeats calls each.
2. compile: the fused forward and backward of the whole update batch, eager and with the layers
   under torch.compile (one fixed shape, so it compiles once: a best case), 3 x --repeats calls
   each (the difference is small), and the compile's own seconds from an empty compiler cache.
   Without a C++ compiler it fails; the results file then says why. What the compiler warned is
   kept (inductor generates no code for complex numbers, which the fused forward's rotary
   embedding uses: that multiplication stays eager).
3. sampler threads: one rollout of the same prompts with --threads threads and with one,
   --repeats / 3 calls each (at least 6).

Writes FILE (default benchmarks/results/speed_probes.json) and prints a table.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

from grpo_edu.algorithm.statistics import paired_medians
from profile_step import check_positive, quiet_run, write_results

OUT = Path(__file__).parent / "results" / "speed_probes.json"
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cpu-first-run.toml"
PROBES = ("attention", "compile", "threads")


def timed(functions: dict, repeats: int, warmup: int = 3) -> dict:
    """Each of `functions` (name -> callable) called `repeats` times, the calls alternating.

    Returns {"ms": each one's median milliseconds, "minus_first": for each but the first, the median
    of its paired differences from the first (call i of it minus call i of the first, in ms) and that
    median's 95% interval (grpo_edu.algorithm.statistics.paired_medians: the sign test's; at least 6
    calls each)}.
    """
    for function in functions.values():
        for _ in range(warmup):
            function()
    seconds: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            seconds[name].append(time.perf_counter() - start)
    ms = {name: [1e3 * s for s in values] for name, values in seconds.items()}
    first, *others = ms
    verdicts = {name: paired_medians(ms[name], ms[first]) for name in others}
    return {"ms": {name: round(statistics.median(values), 3) for name, values in ms.items()},
            "minus_first": {name: {"median": round(v.difference, 3), "interval": [round(v.low, 3), round(v.high, 3)]}
                            for name, v in verdicts.items()}}


def forward_backward(attend, *tensors) -> None:
    """One attention's forward and backward, from fresh leaves (no gradient accumulates)."""
    leaves = [t.detach().requires_grad_() if t.is_floating_point() else t for t in tensors]
    attend(*leaves).sum().backward()


def packed_sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def packed_eager(q, k, v, mask):
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1) @ v


def per_completion_masks(prompt_mask: torch.Tensor, completion_mask: torch.Tensor):
    """(B, P), (B, G, S) -> the prompts' causal mask (B, 1, P, P) and the completions' (B G, 1, S, P + S):
    a completion token sees its prompt's real tokens and its own earlier ones (itself always, so no
    softmax row is empty)."""
    B, G, S = completion_mask.shape
    P = prompt_mask.shape[-1]
    real = prompt_mask.bool()
    prompts = (torch.ones(P, P, dtype=torch.bool).tril() & real[:, None, :]) | torch.eye(P, dtype=torch.bool)
    own = torch.ones(S, S, dtype=torch.bool).tril() & completion_mask.bool().reshape(B * G, 1, S)
    own |= torch.eye(S, dtype=torch.bool)
    seen = real.repeat_interleave(G, dim=0)[:, None, :].expand(B * G, S, P)
    return prompts[:, None], torch.cat([seen, own], dim=-1)[:, None]


def attention_probe(batch, packed: tuple, heads: int, head_dim: int, repeats: int) -> dict:
    """The three attentions of one layer at this rollout's shapes (module docstring, 1)."""
    q, k, v, mask = packed
    B, G, S = batch.completion_mask.shape
    P = batch.input_ids.shape[-1] - S                                    # the prompt's columns
    prompt_masks, completion_masks = per_completion_masks(batch.attention_mask[:, 0, :P], batch.completion_mask)
    generator = torch.Generator().manual_seed(0)
    shaped = [torch.randn(*shape, generator=generator) for shape in
              [(B, heads, P, head_dim)] * 3 + [(B * G, heads, S, head_dim)] * 3]
    pq, pk, pv, cq, ck, cv = shaped

    def per_completion(pq, pk, pv, cq, ck, cv):
        prompt_out = F.scaled_dot_product_attention(pq, pk, pv, attn_mask=prompt_masks)
        keys = torch.cat([pk.repeat_interleave(G, dim=0), ck], dim=2)       # (B G, heads, P + S, D)
        values = torch.cat([pv.repeat_interleave(G, dim=0), cv], dim=2)
        out = F.scaled_dot_product_attention(cq, keys, values, attn_mask=completion_masks)
        return prompt_out.sum() + out.sum()

    return {"shapes": {"packed": list(q.shape), "prompts": [B, heads, P, head_dim],
                       "completions": [B * G, heads, S, head_dim], "keys per completion": P + S},
            **timed({"packed": lambda: forward_backward(packed_sdpa, q, k, v, mask),
                     "per completion": lambda: forward_backward(per_completion, pq, pk, pv, cq, ck, cv),
                     "packed, eager": lambda: forward_backward(packed_eager, q, k, v, mask)}, repeats)}


def compile_probe(model, flat, group_size: int, repeats: int) -> dict:
    """The update batch's fused forward and backward, eager and with the layers compiled (2)."""
    from grpo_edu.sampling import fused_llama

    layers = fused_llama._forward

    def update(forward):
        fused_llama._forward = forward
        logp = fused_llama.completion_logprobs(model, flat["input_ids"], flat["attention_mask"],
                                               flat["completion_mask"], group_size=group_size)
        logp.sum().backward()
        model.zero_grad(set_to_none=True)

    # A cache of its own, empty: the compile's seconds are a first compile's, as on a reader's machine.
    with (tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}),
          warnings.catch_warnings(record=True) as caught):
        warnings.simplefilter("always")
        try:
            compiled = torch.compile(layers, dynamic=False)
            start = time.perf_counter()
            update(compiled)
            compile_seconds = time.perf_counter() - start
            times = timed({"eager": lambda: update(layers), "compiled": lambda: update(compiled)}, repeats)
        except Exception as error:   # no compiler, or an operator inductor cannot lower
            return {**timed({"eager": lambda: update(layers)}, repeats),
                    "failed": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
        finally:
            fused_llama._forward = layers
            torch._dynamo.reset()
    # What the compiler warned (that it generates no code for the rotary embedding's complex
    # multiplication, for one), each message once; not deprecation notices.
    said = sorted({str(w.message).splitlines()[0][:200] for w in caught
                   if not issubclass(w.category, (DeprecationWarning, FutureWarning))})
    return {**times, "compile_seconds": round(compile_seconds, 1), "compiler_warnings": said}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(CONFIG), help="TOML config (default: configs/cpu-first-run.toml)")
    parser.add_argument("--probes", default=",".join(PROBES), help=f"comma-separated, of {', '.join(PROBES)}")
    parser.add_argument("--warmup", type=int, default=40, help="training steps before the probes")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    check_positive(parser, args, ("warmup", "repeats", "threads"))
    if args.repeats < 6:
        parser.error(f"--repeats: expected at least 6 (for a 95% interval of paired differences), got {args.repeats}")
    probes = args.probes.split(",")
    if not probes or any(probe not in PROBES for probe in probes):
        parser.error(f"--probes: expected a comma-separated list of {', '.join(PROBES)}, got {args.probes!r}")
    config_path = Path(args.config)
    if not config_path.is_file():
        parser.error(f"--config: expected a TOML config file, got {args.config!r} (no such file)")

    from grpo_edu.sampling import fused_llama
    from grpo_edu.training import trainer

    with tempfile.TemporaryDirectory() as directory:
        run = quiet_run(config_path, args.warmup + 1, args.threads, directory)
        kept: dict = {}
        optimise, rollout_next = run.optimise, run.rollouts.next

        def keep_batch(config, settings, models, optimizer, scheduler, batch, *rest, **options):
            kept["batch"] = batch
            return optimise(config, settings, models, optimizer, scheduler, batch, *rest, **options)

        def keep_rollout(*a, **k):
            kept["rollout"] = (a, k)
            return rollout_next(*a, **k)

        run.optimise, run.rollouts.next = keep_batch, keep_rollout
        trainer.loop(run, stop_after=args.warmup)
        batch, model = kept["batch"], run.models.policy
        flat = batch.flat()

        probed = {}
        if "attention" in probes:
            # The q, k, v and mask of the update's first layer, as the fused forward builds them.
            attend = fused_llama._attend
            seen: list = []

            def capture(q, k, v, mask, weights, layout=None):
                seen.append(tuple(t.detach().transpose(1, 2) for t in (q, k, v)) + (mask,))   # (B, heads, L, D)
                return attend(q, k, v, mask, weights, layout)

            fused_llama._attend = capture
            try:
                with torch.no_grad():
                    fused_llama.completion_logprobs(model, flat["input_ids"], flat["attention_mask"],
                                                    flat["completion_mask"], group_size=batch.group_size)
            finally:
                fused_llama._attend = attend
            weights = fused_llama.fuse(model)
            probed["attention"] = attention_probe(batch, seen[0], weights.heads, weights.head_dim, args.repeats)
        if "compile" in probes:   # a small difference: more calls
            probed["compile"] = compile_probe(model, flat, batch.group_size, 3 * args.repeats)
        if "threads" in probes:
            rollout_args, rollout_options = kept["rollout"]
            sample = {}
            for threads in (args.threads, 1):
                def one_rollout(threads=threads):
                    torch.set_num_threads(threads)
                    rollout_next(*rollout_args, **rollout_options)
                sample[f"{threads} thread{'s' * (threads > 1)}"] = one_rollout
            probed["sampler_threads"] = timed(sample, max(6, args.repeats // 3))
            torch.set_num_threads(args.threads)

    payload = {
        "written_by": "benchmarks/speed_probes.py", "config": config_path.name, "warmup": args.warmup,
        "repeats": args.repeats, "threads": args.threads, "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY", ""), "machine": platform.machine(),
        **probed,
    }
    write_results(Path(args.out), payload, report(payload))
    return 0


ROWS = (  # (what is timed, now, tried instead, the results' section, now's key, the tried key)
    ("attention of one layer, forward + backward", "packed groups, fused attention", "each completion its own row",
     "attention", "packed", "per completion"),
    ("attention of one layer, forward + backward", "packed groups, fused attention",
     'packed, eager (transformers\' "eager")', "attention", "packed", "packed, eager"),
    ("the update's forward + backward", "eager", "the layers under `torch.compile`", "compile", "eager", "compiled"),
)


def difference(results: dict, key: str, digits: int) -> str:
    """'+1.34 [+1.20, +1.51]': the tried way's paired difference from now's, ms, with its 95% interval."""
    d = results["minus_first"][key]
    low, high = d["interval"]
    return f"{d['median']:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def markdown_rows(native: dict, avx2: dict) -> list[str]:
    """docs/training.md's table rows: each probe's now and tried ms and their paired difference, on
    the machine's own kernels, then on AVX2."""
    probes = list(ROWS)
    first = next(iter(native["sampler_threads"]["ms"]))
    probes.append(("one rollout", first, "1 thread", "sampler_threads", first, "1 thread"))
    rows = []
    for what, now, tried, section, now_key, tried_key in probes:
        digits = 2 if section == "attention" else 1
        cells = []
        for results in (native, avx2):
            ms = results[section]["ms"]
            cells += [f"{ms[now_key]:.{digits}f} / {ms[tried_key]:.{digits}f}", difference(results[section], tried_key, digits)]
        rows.append(f"| {what} | {now} | {tried} | " + " | ".join(cells) + " |")
    return rows


def report(payload: dict) -> str:
    def line(title: str, results: dict) -> str:
        figures = ", ".join(f"{name} {ms:.2f}" for name, ms in results["ms"].items())
        against = "; ".join(f"{name} - {next(iter(results['ms']))}: {difference(results, name, 2)}"
                            for name in results["minus_first"])
        return f"  {title}: {figures}" + (f" (paired, 95%: {against})" if against else "")

    lines = [f"speed probes, {payload['config']}, {payload['threads']} threads, "
             f"{payload['cpu_capability']} kernels (median ms)"]
    if "attention" in payload:
        lines.append(line("attention of one layer, forward + backward", payload["attention"]))
    if "compile" in payload:
        lines.append(line("the update's fused forward + backward", payload["compile"]))
        compiled = payload["compile"]
        if "compile_seconds" in compiled:
            lines.append(f"    compiling took {compiled['compile_seconds']} s")
        if "failed" in compiled:
            lines.append(f"    torch.compile failed: {compiled['failed']}")
    if "sampler_threads" in payload:
        lines.append(line("one rollout", payload["sampler_threads"]))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
