"""What GRPO teaches a model (chapter 9): GRPO on outcome reward alone, from bases whose
pretraining we wrote (grpo_edu.environment.digitsum), measured over training on 3 seeds.

Arms, each configs/cpu-reasoning.toml (150 steps, accuracy the only reward) from one base:

    grpo           digitsum-start (direct 50%, worked 40%, with a check 10%), loss_type "grpo"
    dr_grpo        the same base, loss_type "dr_grpo" (a constant normaliser: Liu et al., 2025)
    no_check       digitsum-no-check (direct 50%, worked 50%: the base never saw a check)
    no_top_worked  digitsum-no-top-worked (the main mixture, but direct answers only at depth 12)

    .venv/bin/python benchmarks/reasoning.py --bases [NAME ...] # each base's precondition and pass@k
    .venv/bin/python benchmarks/reasoning.py [--runs grpo:0 ...] [--steps 150]
    .venv/bin/python benchmarks/reasoning.py --check FILE [--runs grpo:0] [--steps 4]
    .venv/bin/python benchmarks/reasoning.py --verdicts FILE
    .venv/bin/python benchmarks/reasoning.py --merge A B ...    # files written in parallel, into --out

Writes FILE (default benchmarks/results/reasoning.json) after every run or base:

- per base: the precondition (grpo_edu.training.reasoning.behaviour: 100 held-out problems a depth,
  3 to 13, greedy and 4 samples, the format forced and free), its probe (below) and pass@k for
  k = 1..256 on 10 problems a depth (256 samples each, the per-problem counts kept);
- per run: every step's rollout figures (reward, completion length mean and spread, the format
  shares and checks), the trainer's held-out greedy curve, a probe every 50 steps (30 held-out
  problems a depth, 3 to 13: greedy, and 4 samples at temperature 1, by depth: accuracy, format
  shares, length, checks), the final policy's greedy outcome on each probe problem, its pass@k
  on the bases' problems (the grpo arm's), and completions from the start and the end;
- the verdicts: the chapter's five questions, each paired over seeds (and over problems where
  the same problems were asked), grpo_edu.algorithm.statistics.

Run it under the book's pinned kernels (grpo_edu.runtime.numerics). --check re-trains the named
runs for their first --steps steps and compares every kept step figure with FILE's, exactly.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).parent / "results" / "reasoning.json"
CONFIG = ROOT / "configs" / "cpu-reasoning.toml"
BASES = ("digitsum-start", "digitsum-no-check", "digitsum-no-top-worked")
ARMS = {"grpo": ("digitsum-start", {}), "dr_grpo": ("digitsum-start", {"loss_type": "dr_grpo"}),
        "no_check": ("digitsum-no-check", {}), "no_top_worked": ("digitsum-no-top-worked", {})}
SETTINGS = {"checkpoint_every": 0, "progress": False}
DEPTHS = tuple(range(3, 14))          # the mixtures' 3 to 12, and one beyond
PROBE_EVERY, PROBE_PER_DEPTH, PROBE_SAMPLES, PROBE_SEED = 50, 30, 4, 1
PRECONDITION_PER_DEPTH = 100
PASS_PER_DEPTH, PASS_N = 10, 256
PASS_ARMS = ("grpo",)                 # pass@k of the trained policy: the main arm (the others' cost time)
KEPT = ("reward/mean", "completion_length/mean", "completion_length/std", "format/direct", "format/worked",
        "format/check", "format/other", "checks/written", "checks/on_wrong", "checks/fixed", "kl", "grad_norm")
EXAMPLES = 6                          # completions kept from the start and the end of a run


# Every setting tried before this grid, kept in the results file ("tried"), the ones that gave no story
# included. The probes pretrained with a script of their own (the same task and model code; "value"
# steps are a3b1c5..., letter and running value; "copy" steps are the library's a33b81c56..., letter,
# digit, running value) and ran GRPO with this trainer; one seed each unless named; greedy accuracy with
# the format forced, 200 held-out problems a depth.
TRIED = [
    {"name": "A1 value steps, 3 layers", "what": "main mixture 50/40/10, value steps, 3 layers x 128, SwiGLU 384 "
     "(652,928 parameters), lr 2e-3 warmup 100 cosine to 10%, 1500 steps x 64, 738 s",
     "result": "failed: never left the plateau; learned the markup only; direct and worked ~0.1 (chance) at every "
               "depth"},
    {"name": "diag1 value steps, worked only", "what": "worked chains only, depths 3-6, 2 layers x 128/256, lr 1e-3, "
     "600 steps", "result": "the plateau broke at ~350 steps (validation loss a token 0.003 at n = 3, 0.14 at n = 6)"},
    {"name": "diag2 value steps, 2 layers", "what": "main mixture, depths 3-12, 2 layers x 128/256, lr 1e-3, 800 steps",
     "result": "the plateau broke at 650-750 steps, to a worked loss of 0.45 a token; too slow for the budget"},
    {"name": "A2 value steps, 2 layers", "what": "main mixture, 2 layers x 128/256 (341,376), lr 1e-3 warmup 50 cosine "
     "to 10% over 3000, stopped at ~2600 (~900 s)", "result": "failed: a first partial break at 750-1000 steps "
     "(format, copying), then flat; forced greedy at chance (0.04-0.16) at n = 4, 8, 12"},
    {"name": "A3 copy steps, 2 layers", "what": "main mixture, copy steps (the library's), 2 layers x 128/256 "
     "(341,376), lr 1e-3 warmup 50 cosine to 10%, 2000 steps x 64, 773 s",
     "result": "worked greedy 1.000 at n = 3-12, 0.10 at 13 (its letter never seen); direct ~0.1 at every depth; "
               "worked sampled ~0.74; '!' at the data's rate but not on wrong values (9 of 362 wrong values flagged)"},
    {"name": "B copy steps, no check, 2 layers", "what": "50 direct / 50 worked, as A3", "result":
     "worked greedy 1.000 at n = 3-12, sampled 0.994-0.999; direct ~0.1; never a '!'"},
    {"name": "C copy steps, no worked at 12, 2 layers", "what": "main mixture, depth 12 direct only, as A3",
     "result": "worked greedy 1.000 at n = 3-11, 0.080 at 12; free samples at 12 all direct"},
    {"name": "A4 copy steps, 3 layers", "what": "main mixture, copy steps, 3 layers x 128/384 (652,928), lr 1e-3 "
     "warmup 50 cosine to 10%, 2000 steps, 1041 s: the recipe of the committed bases",
     "result": "worked greedy 1.000 at n = 3-12 (0.085 at 13); sampled 0.83-0.91; direct ~0.1; the check works: "
               "59-89% of '!' flag a wrong value, 44-59 a depth (800 samples) end in a right answer"},
    {"name": "GRPO from A3, lr 3e-5 / 5e-5 / 1e-4", "what": "this trainer, accuracy reward only, beta 0, B 16 x G 8, "
     "L 56, 300 steps, constant lr; 5e-5 on seeds 0, 1, 2", "result": "held-out sampled accuracy 0.41 -> 0.97-0.98 at "
     "every lr; worked share 0.37 -> 0.91-0.96; check share 0.10 -> 0.03-0.08; greedy worked by step 25"},
    {"name": "GRPO from B and C, lr 5e-5", "what": "as above, seed 0", "result": "B: 0.55 -> 0.99, never a '!'; "
     "C: n = 3-11 to 0.96-0.99, n = 12 stays direct and at chance (0.10 -> 0.09)"},
    {"name": "GRPO from A4, lr 5e-5, seeds 0 and 1", "what": "as above", "result": "0.48 -> 0.98; worked 0.38 -> "
     "0.77-0.83, check 0.10 -> 0.15-0.20; '!' 441 -> 657-922 a 4400 samples, on a wrong value 316 -> 59-81, fixes "
     "212 -> 46-53: the '!' becomes a re-check of a right value"},
    {"name": "this grid's grpo arm, seed 0, for 300 steps", "what": "this script at 300 steps, 50 probe problems a depth, "
     "pass@k on 20 a depth: 904 s a run beside another, too slow for 12 runs; the grid runs 150", "result":
     "means over 25 steps (0-25 -> 50-75 -> 275-300): reward 0.62 -> 0.97 -> 0.98, length 20.6 -> 29.1 -> 27.9 "
     "tokens, direct share 0.38 -> 0.004 -> 0.002, worked 0.50 -> 0.87 -> 0.92, check 0.11 -> 0.12 -> 0.08; settled "
     "by step 75; depth 13 sampled accuracy 0.06-0.08 at every probe"},
]


def problems(per_depth: int, seed: int) -> dict[int, list[dict]]:
    from grpo_edu.environment.digitsum import held_out_by_depth
    return held_out_by_depth(DEPTHS, per_depth, seed=seed)


def flat(by_depth: dict[int, list[dict]]) -> list[dict]:
    return [p for depth in sorted(by_depth) for p in by_depth[depth]]


def probe(model, tokenizer) -> dict:
    """The policy's own choice of format, by depth: greedy and sampled accuracy, format shares,
    length, checks (grpo_edu.training.reasoning.behaviour, free only), and the greedy outcome of
    each probe problem, in flat(problems) order."""
    from grpo_edu.training.reasoning import behaviour, complete, _correct
    by_depth = problems(PROBE_PER_DEPTH, PROBE_SEED)
    result = behaviour(model, tokenizer, by_depth, samples=PROBE_SAMPLES, seed=PROBE_SEED, modes=("free",))
    asked = flat(by_depth)
    texts, _ = complete(model, tokenizer, [p["prompt"] for p in asked])
    return {"by_depth": {str(d): row for d, row in result.items()},
            "greedy_correct": [int(c) for c in _correct([t[0] for t in texts], asked, 1)]}


def pass_curve(model, tokenizer) -> dict:
    from grpo_edu.training.reasoning import pass_at_k_curve
    asked = flat(problems(PASS_PER_DEPTH, seed=2))
    curve = pass_at_k_curve(model, tokenizer, asked, n=PASS_N, seed=3)
    return {**curve, "pass_at_k": {str(k): v for k, v in curve["pass_at_k"].items()},   # as JSON keeps them
            "depths": [p["depth"] for p in asked]}


def measure_base(name: str) -> dict:
    from grpo_edu.policy.models import load_policy, policy_source
    from grpo_edu.training.reasoning import behaviour
    model, tokenizer = load_policy(policy_source(name))
    started = time.perf_counter()
    precondition = behaviour(model, tokenizer, problems(PRECONDITION_PER_DEPTH, seed=0), samples=4)
    out = {"precondition": {str(d): row for d, row in precondition.items()}, "probe": probe(model, tokenizer),
           "pass": pass_curve(model, tokenizer)}
    pretrained = json.loads((Path(policy_source(name)) / "pretrain.json").read_text())
    out.update({"command": pretrained["command"], "seconds": round(time.perf_counter() - started, 1)})
    return out


def config_for(arm: str, seed: int, steps: int, output_dir: str):
    from grpo_edu.config import TrainConfig
    base, changes = ARMS[arm]
    values = TrainConfig.from_toml(CONFIG).to_dict()
    return TrainConfig.from_dict({**values, **SETTINGS, **changes, "model": base, "steps": steps, "seed": seed,
                                  "output_dir": output_dir})


def examples(model, tokenizer, seed: int) -> list[list[str]]:
    """(prompt, sampled completion) for the first EXAMPLES probe problems of depths 5 and 10."""
    from grpo_edu.training.reasoning import complete
    by_depth = problems(PROBE_PER_DEPTH, PROBE_SEED)
    asked = by_depth[5][:EXAMPLES // 2] + by_depth[10][:EXAMPLES // 2]
    texts, _ = complete(model, tokenizer, [p["prompt"] for p in asked], k=1, greedy=False, seed=100 + seed)
    return [[p["prompt"], t[0]] for p, t in zip(asked, texts)]


def run(arm: str, seed: int, steps: int, stop_after: int | None = None) -> dict:
    """One run of the grid: trained in chunks of PROBE_EVERY steps, probed between them (the probes
    draw from their own generators: the run's trajectory is the one an unprobed run takes)."""
    from grpo_edu.training.trainer import loop, set_up
    last = steps if stop_after is None else stop_after
    with tempfile.TemporaryDirectory() as directory:
        config = config_for(arm, seed, steps, directory)
        started = time.perf_counter()
        state = set_up(config, log=lambda line: None)
        policy = state.models.policy
        kept = {"arm": arm, "seed": seed, "base": ARMS[arm][0],
                "examples_start": examples(policy, state.tokenizer, seed), "probes": []}
        probe_seconds = 0.0
        for point in range(PROBE_EVERY, last + PROBE_EVERY, PROBE_EVERY):
            result = loop(state, stop_after=min(point, last))
            if stop_after is None:
                t0 = time.perf_counter()
                kept["probes"].append({"step": state.state.step, **probe(policy, state.tokenizer)})
                probe_seconds += time.perf_counter() - t0
        history = result.history
        kept.update({
            "start_accuracy": result.summary["start_accuracy"], "final_accuracy": result.summary["final_accuracy"],
            "eval": [[m["step"], m["eval/greedy_accuracy"]] for m in history if "eval/greedy_accuracy" in m],
            "steps": {key: [m.get(key) for m in history] for key in KEPT}})
        if stop_after is None:
            t0 = time.perf_counter()
            if arm in PASS_ARMS:
                kept["pass"] = pass_curve(policy, state.tokenizer)
            kept["examples_end"] = examples(policy, state.tokenizer, seed)
            probe_seconds += time.perf_counter() - t0
        kept["seconds"] = round(time.perf_counter() - started, 1)
        kept["probe_seconds"] = round(probe_seconds, 1)
    return kept


# --------------------------------------------------------------------------- the verdicts

def _window(run: dict, key: str, end: str, width: int = 10) -> float:
    values = run["steps"][key][:width] if end == "first" else run["steps"][key][-width:]
    return statistics.fmean(values)


def _depth(probe_entry: dict, depth: int, key: str = "free/sampled") -> float:
    return probe_entry["by_depth"][str(depth)][key]


def verdicts(payload: dict) -> dict:
    """The chapter's questions, each a paired comparison (grpo_edu.algorithm.statistics)."""
    from grpo_edu.algorithm.statistics import paired_seeds
    runs = {(r["arm"], r["seed"]): r for r in payload["runs"]}
    out = {}

    def over_seeds(name: str, arm_a: str, value_a, arm_b: str, value_b, a: str, b: str) -> None:
        seeds = sorted({s for arm, s in runs if arm == arm_a} & {s for arm, s in runs if arm == arm_b})
        if len(seeds) < 2:
            return
        verdict = paired_seeds([value_a(runs[arm_a, s]) for s in seeds], [value_b(runs[arm_b, s]) for s in seeds])
        out[name] = {"seeds": seeds, "a": a, "b": b, "difference": verdict.difference, "low": verdict.low,
                     "high": verdict.high, "method": verdict.method, "words": verdict.words(a, b)}

    for arm in ARMS:   # each arm's rollouts, its last 10 steps against its first 10
        for key, label in (("completion_length/mean", "length"), ("format/worked", "worked share"),
                           ("format/check", "check share"), ("checks/fixed", "checks that fix")):
            over_seeds(f"{arm}: {label}, last - first 10 steps", arm, lambda r, k=key: _window(r, k, "last"),
                       arm, lambda r, k=key: _window(r, k, "first"), "the last 10 steps", "the first 10")
        for depth in (12, 13):
            over_seeds(f"{arm}: depth {depth} sampled accuracy, end - start", arm,
                       lambda r, d=depth: _depth(r["probes"][-1], d), arm,
                       lambda r, d=depth: _depth(payload["bases"][r["base"]]["probe"], d), "the end", "the start")
    over_seeds("length at the end, grpo - dr_grpo", "grpo", lambda r: _window(r, "completion_length/mean", "last"),
               "dr_grpo", lambda r: _window(r, "completion_length/mean", "last"), "grpo", "dr_grpo")
    over_seeds("length growth, grpo - dr_grpo", "grpo",
               lambda r: _window(r, "completion_length/mean", "last") - _window(r, "completion_length/mean", "first"),
               "dr_grpo",
               lambda r: _window(r, "completion_length/mean", "last") - _window(r, "completion_length/mean", "first"),
               "grpo", "dr_grpo")
    over_seeds("final accuracy, grpo - no_check", "grpo", lambda r: r["final_accuracy"], "no_check",
               lambda r: r["final_accuracy"], "grpo", "no_check")
    # pass@k: the trained policy against its base on the same problems, at each k
    for arm in ARMS:
        for k in (1, 16, 256):
            seeds = sorted(s for a, s in runs if a == arm and "pass" in runs[a, s])
            if len(seeds) < 2:
                continue
            base = payload["bases"][ARMS[arm][0]]["pass"]
            trained = [runs[arm, s]["pass"]["pass_at_k"][str(k)] for s in seeds]
            verdict = paired_seeds(trained, [base["pass_at_k"][str(k)]] * len(seeds))
            entry = {"seeds": seeds, "a": "trained", "b": "base", "difference": verdict.difference,
                     "low": verdict.low, "high": verdict.high, "method": verdict.method,
                     "words": verdict.words("the trained policy", "the base")}
            from grpo_edu.training.evaluation import pass_at_k
            per_seed = {}
            for s in seeds:   # over the same problems: pass@k per problem, trained - base (a t interval)
                ours = [pass_at_k(PASS_N, c, k) for c in runs[arm, s]["pass"]["correct"]]
                theirs = [pass_at_k(PASS_N, c, k) for c in base["correct"]]
                problems_verdict = paired_seeds(ours, theirs)
                per_seed[str(s)] = {"difference": problems_verdict.difference, "low": problems_verdict.low,
                                    "high": problems_verdict.high, "method": problems_verdict.method}
            entry["per_seed"] = per_seed
            out[f"{arm}: pass@{k}, trained - base"] = entry
    return out


# --------------------------------------------------------------------------- command line

def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _write(path: Path, payload: dict) -> None:
    payload["verdicts"] = verdicts(payload) if payload.get("runs") and payload.get("bases") else {}
    payload["tried"] = TRIED
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, separators=(",", ":")) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bases", nargs="*", metavar="NAME",
                        help=f"measure these bases (default: all of {list(BASES)}): precondition, probe, pass@k")
    parser.add_argument("--merge", nargs="+", metavar="FILE",
                        help="files this script wrote in parallel (other --bases, other --runs), merged into --out")
    parser.add_argument("--runs", nargs="+", help="arm:seed (default: every arm x seeds 0 1 2)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (150), or with --check (4)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--check", metavar="FILE")
    parser.add_argument("--verdicts", metavar="FILE")
    args = parser.parse_args()
    runs = [(arm, int(seed)) for arm, seed in (value.split(":") for value in args.runs)] if args.runs else \
        [(arm, seed) for arm in ARMS for seed in (0, 1, 2)]
    for arm, _ in runs:
        if arm not in ARMS:
            raise SystemExit(f"--runs: expected arm:seed with an arm of {list(ARMS)}, got {arm!r}")
    for name in args.bases or ():
        if name not in BASES:
            raise SystemExit(f"--bases: expected names of {list(BASES)}, got {name!r}")
    if args.merge:
        merged = _load(Path(args.out))
        for path in args.merge:
            part = _load(Path(path))
            if not part:
                raise SystemExit(f"--merge: {path} is not a results file of this script")
            runs = {(r["arm"], r["seed"]): r for r in merged.get("runs", []) + part.get("runs", [])}
            for r in runs.values():   # pass@k is the PASS_ARMS' (a run of another arm may carry one)
                if r["arm"] not in PASS_ARMS:
                    r.pop("pass", None)
            merged = {**merged, **{k: v for k, v in part.items() if k not in ("bases", "runs")},
                      "bases": {**merged.get("bases", {}), **part.get("bases", {})}, "runs": list(runs.values())}
        _write(Path(args.out), merged)
        print(f"merged {len(args.merge)} files into {args.out}: {len(merged['bases'])} bases, {len(merged['runs'])} runs")
        return
    if args.verdicts:
        path = Path(args.verdicts)
        _write(path, _load(path))
        print(json.dumps(_load(path)["verdicts"], indent=1))
        return
    if args.check:
        stored = _load(Path(args.check))
        steps = args.steps or 4
        by_key = {(r["arm"], r["seed"]): r for r in stored["runs"]}
        failures = 0
        for arm, seed in (runs if args.runs else list(by_key)):
            got = run(arm, seed, stored["steps"], stop_after=steps)
            want = by_key[arm, seed]
            diffs = [key for key in KEPT if got["steps"][key] != want["steps"][key][:steps]]
            failures += bool(diffs)
            print(f"{arm}:{seed} first {steps} steps: " + ("equal to the file" if not diffs else
                                                            f"{', '.join(diffs)} differ"), flush=True)
        if failures:
            raise SystemExit(f"{failures} run(s) differ from {args.check}")
        return
    out = Path(args.out)
    payload = _load(out) or {"config": CONFIG.name, "arms": {a: [b, c] for a, (b, c) in ARMS.items()},
                             "settings": SETTINGS, "bases": {}, "runs": []}
    payload.update({"steps": args.steps or payload.get("steps", 150), "machine": platform.machine(),
                    "probe": {"every": PROBE_EVERY, "per_depth": PROBE_PER_DEPTH, "samples": PROBE_SAMPLES,
                              "depths": list(DEPTHS)}, "pass": {"per_depth": PASS_PER_DEPTH, "n": PASS_N}})
    if args.bases is not None:
        for name in args.bases or BASES:
            payload["bases"][name] = measure_base(name)
            print(f"{name}: measured in {payload['bases'][name]['seconds']:.0f} s", flush=True)
            _write(out, payload)
        return
    for arm, seed in runs:
        kept = run(arm, seed, payload["steps"])
        payload["runs"] = [r for r in payload["runs"] if (r["arm"], r["seed"]) != (arm, seed)] + [kept]
        last = kept["probes"][-1]["by_depth"]
        print(f"{arm}:{seed} accuracy {kept['start_accuracy']:.3f} -> {kept['final_accuracy']:.3f}, length "
              f"{_window(kept, 'completion_length/mean', 'first'):.1f} -> "
              f"{_window(kept, 'completion_length/mean', 'last'):.1f}, worked share "
              f"{_window(kept, 'format/worked', 'first'):.2f} -> {_window(kept, 'format/worked', 'last'):.2f}, "
              f"depth 12/13 sampled {last['12']['free/sampled']:.2f}/{last['13']['free/sampled']:.2f} in "
              f"{kept['seconds']:.0f} s ({kept['probe_seconds']:.0f} s probing)", flush=True)
        _write(out, payload)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
