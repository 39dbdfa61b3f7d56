"""One step of the default run, profiled: where its time goes, and how far it is from what its
arithmetic needs.

    python benchmarks/profile_step.py [--config FILE] [--warmup 30] [--steps 30] [--threads 2] [--out FILE]
    ATEN_CPU_CAPABILITY=avx2 python benchmarks/profile_step.py --out benchmarks/results/profile_step_avx2.json
    python benchmarks/profile_step.py --config configs/cpu-first-run.toml --out benchmarks/results/profile_step_first_run.json

The run is configs/cpu-tiny.toml's (B = 16 prompts x G = 8 completions, the fused engine), or
--config's (make train's: no reference model, so no scoring forward), with no evaluation inside
the measured steps. After --warmup steps it measures --steps steps twice:

1. Unprofiled: each phase's milliseconds per step, the trainer's own time/rollout, time/scoring
   and time/update (median over the steps), and the whole step.
2. Under torch.profiler (CPU): each phase wrapped in a record_function range, and inside it the
   self time of every ATen operator, grouped by kind (KINDS: matrix products, elementwise,
   reductions and softmax, attention, memory and indexing, the optimizer, other operators), plus the phase's
   own self time: the Python and dispatch overhead between operators. The profiler adds its own
   cost per operator, so these shares are of the profiled step; the unprofiled figures are the
   step's real length.

The sampler's per-token loop: the fused engine's decode steps per rollout, and milliseconds per
decode step (the rollout phase over the steps it took).

The compute floor. FLOPs from the step's own token counts and the policy's shapes: a forward is
2 FLOPs per matrix weight per token it computes, plus attention's 4 x width x context per layer and
token; a backward is twice a forward. The rollout prefills each prompt once and decodes each
generated token once; scoring is the frozen reference's forward; the update is the policy's
forward and backward (num_iterations = 1: pi_old is that forward's own detached log-probs), over
each prompt once and each completion token once (the fused engine's group packing). At the
machine's measured float32 matrix-product rate (torch.mm of 1024 x 1024 matrices, on the run's
threads), that is the floor in milliseconds, and floor / measured the fraction of the step the
arithmetic needs.

Writes FILE (default benchmarks/results/profile_step.json; the CPU capability torch dispatched to,
ATEN_CPU_CAPABILITY and the CPU model are in it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

OUT = Path(__file__).parent / "results" / "profile_step.json"
PHASES = ("rollout", "scoring", "update")
# ATen operator -> kind, by its base name (aten::, the "_" of in-place and private forms and a
# "_backward..." suffix dropped); a rule ending in "*" matches as a prefix. The rest are
# "other operators".
KINDS = {
    "attention": ("scaled_dot_product*", "_scaled_dot_product*", "*attention*"),
    "matrix products": ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot"),
    "optimizer": ("adam*", "adamw*", "fused_adam*", "fused_adamw*", "foreach*", "clip_grad*"),
    "reductions and softmax": ("sum", "mean", "max", "min", "amax", "amin", "softmax", "log_softmax",
                               "logsumexp", "cumsum", "argmax", "topk", "sort", "multinomial", "norm",
                               "linalg_vector_norm", "var", "std", "all", "any", "median", "quantile",
                               "searchsorted", "is_nonzero", "isfinite", "nansum", "prod"),
    "memory and indexing": ("empty*", "zeros*", "ones*", "full*", "new_*", "copy", "clone", "cat", "stack",
                            "index*", "gather", "scatter*", "contiguous", "to_copy", "to", "resize", "masked_select",
                            "masked_scatter", "nonzero", "fill", "zero", "set", "split*", "chunk", "narrow",
                            "slice", "select", "expand", "as_strided", "transpose", "permute", "reshape", "view",
                            "unsqueeze", "squeeze", "t", "detach", "alias", "unbind", "flatten", "unflatten",
                            "repeat*", "lift_fresh", "arange", "unsafe_view", "unfold", "roll", "flip",
                            "embedding*", "reshape_alias", "movedim", "item", "local_scalar_dense", "tril",
                            "triu", "eye", "pad", "constant_pad_nd", "unsafe_split*", "where_copy", "put"),
    "elementwise": ("add", "sub", "mul", "div", "exp", "log", "neg", "pow", "rsqrt", "sqrt", "silu",
                    "sigmoid", "tanh", "where", "clamp*", "masked_fill", "eq", "ne", "lt", "le", "gt", "ge",
                    "abs", "minimum", "maximum", "reciprocal", "sign", "floor", "ceil", "round", "logical*",
                    "bitwise*", "isnan", "isinf", "lerp", "addcmul", "addcdiv", "view_as_complex",
                    "view_as_real", "conj", "complex", "polar", "cos", "sin", "relu", "gelu", "threshold",
                    "rsub", "true_divide", "exp2", "log1p", "expm1", "erf", "nan_to_num", "neg_view", "fmod",
                    "remainder", "mse_loss", "softplus", "square"),
}
KIND_ORDER = ("matrix products", "attention", "elementwise", "reductions and softmax", "memory and indexing",
              "optimizer", "other operators")


def kind_of(name: str) -> str:
    """The kind of an ATen operator (aten::addmm -> "matrix products"), by its base name."""
    if not name.startswith("aten::"):
        return "other operators"
    base = name.split("::")[-1].strip("_")
    base = base.split("_backward")[0]   # silu_backward, _log_softmax_backward_data: the forward's kind
    for kind, rules in KINDS.items():
        for rule in rules:
            if (base == rule or (rule.endswith("*") and rule.startswith("*") and rule.strip("*") in base)
                    or (rule.endswith("*") and not rule.startswith("*") and base.startswith(rule.rstrip("*").strip("_")))):
                return kind
    return "other operators"


def matmul_rate(threads: int, n: int = 1024, repeats: int = 20) -> float:
    """FLOP/s of torch.mm on n x n float32 matrices, the best of `repeats`, on `threads` threads."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * n ** 3 / best


def policy_shapes(model) -> dict:
    """The numbers the floor needs: the matrix weights a token passes through (every Linear's,
    the output head's included), the layers and the width."""
    matrix = sum(module.weight.numel() for module in model.modules() if isinstance(module, torch.nn.Linear))
    config = model.config
    return {"parameters": sum(p.numel() for p in model.parameters()), "matrix_weights": matrix,
            "layers": config.num_hidden_layers, "width": config.hidden_size}


def forward_flops(shapes: dict, tokens: int, context: int) -> float:
    """One forward over `tokens` tokens whose attention contexts sum to `context` positions."""
    return 2 * shapes["matrix_weights"] * tokens + 4 * shapes["width"] * shapes["layers"] * context


class Counts:
    """What one step computed: its prompts, completions and decode steps, from the rollout."""

    def __init__(self):
        self.steps: list[dict] = []

    def record(self, flight) -> None:
        batch = flight.batch
        completion = batch.completion_mask.reshape(-1, batch.completion_mask.shape[-1]).long()
        lengths = completion.sum(-1)
        B, G = batch.completion_mask.shape[:2]
        prompt_lengths = (batch.attention_mask.reshape(B * G, -1).sum(-1) - lengths).view(B, G)[:, 0]
        # attention contexts: a prompt token t sees t positions; completion token t of a row sees
        # its prompt and t completion positions
        prompt_context = int(sum(int(p) * (int(p) + 1) // 2 for p in prompt_lengths))
        rows = prompt_lengths.repeat_interleave(G)
        completion_context = int(sum(int(n) * int(p) + int(n) * (int(n) + 1) // 2 for n, p in zip(lengths, rows)))
        self.steps.append({"prompts": B, "completions": B * G, "prompt_tokens": int(prompt_lengths.sum()),
                           "completion_tokens": int(lengths.sum()), "longest_completion": int(lengths.max()),
                           "prompt_context": prompt_context, "completion_context": completion_context})


def floor_ms(shapes: dict, step: dict, rate: float, reference: bool = True) -> dict:
    """The step's FLOPs by phase and their milliseconds at `rate` FLOP/s; reference: whether scoring runs
    the reference's forward (beta > 0), else scoring needs no matrix products."""
    prefill = forward_flops(shapes, step["prompt_tokens"], step["prompt_context"])
    decode = forward_flops(shapes, step["completion_tokens"], step["completion_context"])
    packed = prefill + decode   # each prompt once, each completion token once
    flops = {"rollout": packed, "scoring": packed if reference else 0.0, "update": 3 * packed}
    return {"flops": flops, "ms": {phase: 1e3 * f / rate for phase, f in flops.items()}}


def check_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, names) -> None:
    """A one-line error for the first of `names` that is not a positive number."""
    for name in names:
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected a positive number, got {getattr(args, name)}")


def quiet_run(config_path: Path, steps: int, threads: int, directory: str):
    """trainer.set_up for `steps` steps of the config at config_path, on `threads` threads, writing
    into `directory`: no evaluation inside them, no checkpoint, no progress line, no log."""
    from grpo_edu.training import trainer
    from grpo_edu.config import TrainConfig

    base = TrainConfig.from_toml(config_path).to_dict()
    config = TrainConfig.from_dict({**base, "steps": steps, "threads": threads, "eval_every": 10 ** 9,
                                    "eval_size": 16, "checkpoint_every": 0, "progress": False,
                                    "output_dir": directory})
    return trainer.set_up(config, log=lambda _: None)


def write_results(out: Path, payload: dict, table: str) -> None:
    """The results file (JSON), then its table and where it went on standard output."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1) + "\n")
    print(table)
    print(f"wrote {out}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="TOML config (default: configs/cpu-tiny.toml)")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    check_positive(parser, args, ("warmup", "steps", "threads"))

    from torch.profiler import ProfilerActivity, profile, record_function

    from grpo_edu.training import trainer
    from grpo_edu.config import DEFAULT_CONFIG

    counts = Counts()
    total = args.warmup + 2 * args.steps
    config_path = Path(args.config or DEFAULT_CONFIG)
    with tempfile.TemporaryDirectory() as directory:
        run = quiet_run(config_path, total + 1, args.threads, directory)
        rollout_next, score, optimise = run.rollouts.next, trainer.add_logprobs, run.optimise
        decode_steps: list[int] = []

        def rollout(*a, **k):
            with record_function("phase/rollout"):
                flight = rollout_next(*a, **k)
            counts.record(flight)
            decode_steps.append(counts.steps[-1]["longest_completion"])
            return flight

        def scoring(*a, **k):
            with record_function("phase/scoring"):
                return score(*a, **k)

        def update(*a, **k):
            with record_function("phase/update"):
                return optimise(*a, **k)

        run.rollouts.next, run.optimise = rollout, update
        trainer.add_logprobs = scoring
        try:
            trainer.loop(run, stop_after=args.warmup)
            started = time.perf_counter()
            first = len(run.history)
            trainer.loop(run, stop_after=args.warmup + args.steps)
            unprofiled_seconds = time.perf_counter() - started
            unprofiled = run.history[first:]
            with profile(activities=[ProfilerActivity.CPU]) as profiler:
                trainer.loop(run, stop_after=total)
        finally:
            trainer.add_logprobs = score
        shapes = policy_shapes(run.models.full_policy)
        reference = run.models.reference_logprobs is not None   # beta > 0: scoring runs the reference's forward

    measured = {phase: 1e3 * statistics.median(m[f"time/{phase}"] for m in unprofiled) for phase in PHASES}
    step_ms = 1e3 * unprofiled_seconds / args.steps
    by_phase = {phase: {kind: 0.0 for kind in (*KIND_ORDER, "Python and dispatch")} | {"total": 0.0}
                for phase in PHASES}
    for event in profiler.events():
        if not event.name.startswith("phase/"):
            continue
        phase = event.name.split("/")[1]
        by_phase[phase]["total"] += event.cpu_time_total
        by_phase[phase]["Python and dispatch"] += event.self_cpu_time_total
        stack = list(event.cpu_children)
        while stack:
            child = stack.pop()
            stack.extend(child.cpu_children)
            if child.name.startswith("aten::"):
                by_phase[phase][kind_of(child.name)] += child.self_cpu_time_total
            else:   # autograd's and the profiler's own ranges: time between operators
                by_phase[phase]["Python and dispatch"] += child.self_cpu_time_total
    profiled = {phase: {kind: round(us / 1e3 / args.steps, 3) for kind, us in kinds.items()}
                for phase, kinds in by_phase.items()}
    per_step = counts.steps[args.warmup:args.warmup + args.steps]
    mean_step = {key: statistics.mean(s[key] for s in per_step) for key in per_step[0]}
    rate = matmul_rate(args.threads)
    floor = floor_ms(shapes, mean_step, rate, reference=reference)
    decodes = statistics.mean(decode_steps[args.warmup:args.warmup + args.steps])
    capability = torch.backends.cpu.get_cpu_capability()
    cpu_model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    payload = {
        "written_by": "benchmarks/profile_step.py", "config": config_path.name,
        "warmup": args.warmup, "steps": args.steps,
        "threads": args.threads, "torch": torch.__version__, "cpu_capability": capability,
        "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY", ""), "cpu": cpu_model,
        "machine": platform.machine(), "shapes": shapes, "tokens_per_step": mean_step,
        "matmul_gflops": rate / 1e9,
        "measured_ms": {**{p: round(v, 3) for p, v in measured.items()}, "step": round(step_ms, 3)},
        "profiled_ms": profiled,
        "decode_steps_per_rollout": decodes, "ms_per_decode_step": round(measured["rollout"] / decodes, 4),
        "floor": {"gflop": {p: f / 1e9 for p, f in floor["flops"].items()},
                  "ms": {p: round(v, 3) for p, v in floor["ms"].items()}},
        "fraction_of_floor": {**{p: round(floor["ms"][p] / measured[p], 4) for p in PHASES},
                              "step": round(sum(floor["ms"].values()) / step_ms, 4)},
    }
    write_results(Path(args.out), payload, report(payload))
    return 0


def report(payload: dict) -> str:
    """The results file as the tables the closing note and the README quote."""
    lines = [f"{payload['cpu']} ({payload['machine']}), torch {payload['torch']}, CPU capability "
             f"{payload['cpu_capability']}" + (f" (ATEN_CPU_CAPABILITY={payload['ATEN_CPU_CAPABILITY']})"
                                               if payload["ATEN_CPU_CAPABILITY"] else "")
             + f", {payload['threads']} threads; torch.mm 1024^3: {payload['matmul_gflops']:.1f} GFLOP/s",
             f"tokens per step: {payload['tokens_per_step']['prompt_tokens']:.0f} prompt (each prompt once), "
             f"{payload['tokens_per_step']['completion_tokens']:.0f} completion, over "
             f"{payload['tokens_per_step']['completions']:.0f} completions; {payload['shapes']['matrix_weights']:,} "
             f"matrix weights of {payload['shapes']['parameters']:,} parameters",
             "",
             f"{'phase':<10}{'measured ms':>12}{'floor ms':>10}{'floor/measured':>16}   profiled ms by kind"]
    for phase in PHASES:
        kinds = payload["profiled_ms"][phase]
        shown = ", ".join(f"{kind} {kinds[kind]:.1f}" for kind in (*KIND_ORDER, "Python and dispatch") if kinds[kind] >= 0.05)
        lines.append(f"{phase:<10}{payload['measured_ms'][phase]:>12.2f}{payload['floor']['ms'][phase]:>10.2f}"
                     f"{payload['fraction_of_floor'][phase]:>16.3f}   {shown} (total {kinds['total']:.1f})")
    floor_step = sum(payload["floor"]["ms"].values())
    lines.append(f"{'step':<10}{payload['measured_ms']['step']:>12.2f}{floor_step:>10.2f}"
                 f"{payload['fraction_of_floor']['step']:>16.3f}   (the whole loop iteration: logging included)")
    lines.append(f"sampler: {payload['decode_steps_per_rollout']:.1f} decode steps per rollout, "
                 f"{payload['ms_per_decode_step']:.3f} ms per decode step")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
