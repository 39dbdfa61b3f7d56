"""Peak extra memory and time of per-token log-probs: chunked vs naive vs TRL.

    python benchmarks/logprobs.py                     # N=64, S=512, V=32000, float32, CPU
    python benchmarks/logprobs.py --rows 8 --vocab 4000 --repeats 1   # a quick look

Part 1 starts from logits (N, S, V), as a trainer holds them after a forward:
  naive    torch.log_softmax(logits, -1).gather(-1, ids)      writes (N, S, V)
  grpo_edu grpo_edu.algorithm.logprobs.token_logprobs                   a chunk of rows at a time
  grpo_edu_inplace   the same with inplace_backward=True      the gradient overwrites the logits
  TRL      trl.trainer.utils.selective_log_softmax            logsumexp one sequence at a time
Part 2 starts one step earlier, from hidden states (N S, H) and the LM head (V, H):
  naive         log_softmax(hidden @ W.T).gather(...)
  grpo_edu C    grpo_edu.algorithm.logprobs.lm_head_logprobs(chunk_tokens=C): the head on C
                token positions at a time, over the whole vocabulary; recomputed in
                backward
  TRL C         trl.kernels.ChunkedLogProbFunction, TRL 1.16's fused head (torch ops
                on the CPU), as TRL's own model code calls it, with its token tile
                set to C positions
Both compute the logits one tile of (token positions x vocabulary columns) at a
time, and the tile's size sets their peak memory, so each C is run for both
(--chunk-tokens, default 1024 and 4096). The two APIs chunk differently: ours
takes the positions per tile as an argument (chunk_tokens, default 1024) and
always spans the whole vocabulary; TRL's chunk_size argument, which its model
code sets to 32,768 (trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE), is the
tile's vocabulary width, and its positions per tile are a module constant,
trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE = 4096, which this benchmark sets
to C. With V <= 32,768 both compute C x V logits per tile (TRL allocates its
buffer C x 32,768 wide; only the pages it writes become resident). C = 4096 is
TRL exactly as it ships; C = 1024 is grpo_edu's default.

Every (method, pass) runs in a fresh subprocess, which first checks the
method's values against float64 on positions spread over the whole input (every
tile), so a fast wrong answer cannot pass. "Peak extra" is the process's peak
resident memory during the call minus its resident memory just before (inputs
allocated and touched): what the method itself adds. "forward" runs
under torch.no_grad (old / reference log-probs); "forward+backward" is the
training pass, whose extra memory includes the unavoidable gradient of the
input (one (N, S, V) tensor in part 1). Times are the best of --repeats runs
after the measured one, with torch's default thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time

import torch

PASSES = ("forward", "forward+backward")
TRL_VOCABULARY_CHUNK = 32768   # trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE in TRL 1.16 (checked in _method)


def methods(part: str, chunk_tokens: list[int]) -> list[str]:
    """The rows of a part; part 2's name a chunk size after '@': grpo_edu@1024, trl@1024, ..."""
    if part == "logits":
        return ["naive", "grpo_edu", "grpo_edu_inplace", "trl"]
    return ["naive"] + [f"{name}@{chunk}" for chunk in chunk_tokens for name in ("grpo_edu", "trl")]


def label(method: str) -> str:
    name, _, chunk = method.partition("@")
    name = "TRL" if name == "trl" else name
    return f"{name} {chunk}" if chunk else name


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def _peak_kib() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1))


def _reset_peak() -> bool:
    """Linux lets a process reset its own peak RSS; elsewhere fall back to ru_maxrss."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _method(part: str, method: str):
    """f(inputs) -> per-token log-probs, for one part and method."""
    from grpo_edu.algorithm.logprobs import lm_head_logprobs, token_logprobs

    if part == "logits":
        if method == "naive":
            return lambda logits, ids: torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1)
        if method == "grpo_edu":
            return token_logprobs
        if method == "grpo_edu_inplace":
            return lambda logits, ids: token_logprobs(logits, ids, inplace_backward=True)
        from trl.trainer.utils import selective_log_softmax
        return selective_log_softmax
    name, _, chunk = method.partition("@")
    if name == "naive":
        return lambda hidden, head, ids: torch.log_softmax(head(hidden), -1).gather(-1, ids[..., None]).squeeze(-1)
    if name == "grpo_edu":
        return lambda hidden, head, ids: lm_head_logprobs(hidden, head, ids, chunk_tokens=int(chunk))
    import trl.kernels.chunked_logprob as trl_chunked
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE
    if _CHUNKED_LOGPROB_CHUNK_SIZE != TRL_VOCABULARY_CHUNK:
        raise RuntimeError(f"TRL's vocabulary chunk is {_CHUNKED_LOGPROB_CHUNK_SIZE}, not {TRL_VOCABULARY_CHUNK}: "
                           f"update benchmarks/logprobs.py's description")
    # TRL has no argument for the positions per tile: forward and backward read this constant at call time.
    trl_chunked.TOKEN_CHUNK_SIZE = int(chunk)
    return lambda hidden, head, ids: trl_chunked.ChunkedLogProbFunction.apply(
        hidden, head.weight, None, ids, 1.0, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, ("log_probs",))[0]


def worker(part: str, method: str, pass_name: str, rows: int, length: int, vocab: int, hidden_size: int,
           repeats: int) -> dict:
    """Runs in its own process: allocate inputs, measure one call, then time `repeats` more."""
    generator = torch.Generator().manual_seed(0)
    backward = pass_name == "forward+backward"
    if part == "logits":
        leaf = torch.empty(rows, length, vocab).normal_(generator=generator).mul_(2.0)
        inputs = (leaf, torch.randint(0, vocab, (rows, length), generator=generator))
        parameters = [leaf]
    else:
        leaf = torch.empty(rows * length, hidden_size).normal_(generator=generator)
        head = torch.nn.Linear(hidden_size, vocab, bias=False)
        with torch.no_grad():
            head.weight.normal_(generator=generator).mul_(hidden_size ** -0.5)
        inputs = (leaf, head, torch.randint(0, vocab, (rows * length,), generator=generator))
        parameters = [leaf, head.weight]
    for p in parameters:
        p.requires_grad_(backward)
    weights = torch.randn(inputs[-1].shape, generator=generator)
    fn = _method(part, method)

    def call():
        if backward:
            (fn(*inputs) * weights).sum().backward()
            for p in parameters:
                p.grad = None
        else:
            with torch.no_grad():
                fn(*inputs)

    # Check the method against float64 first (an in-place backward overwrites the logits
    # later), so a fast wrong answer cannot pass: the first and last sequences in part 1,
    # 512 positions spread over every chunk in part 2.
    with torch.no_grad():
        got = fn(*inputs)
        if part == "logits":
            picked = torch.tensor([0, rows - 1])
            logits, ids = inputs[0][picked].double(), inputs[1][picked]
        else:
            picked = torch.linspace(0, rows * length - 1, 512).long().unique()
            logits, ids = inputs[1](inputs[0][picked]).double(), inputs[2][picked]
        exact = torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1)
        error = (got[picked].double() - exact).abs().max().item()
    can_reset = _reset_peak()
    before = _rss_kib()
    call()
    peak = _peak_kib() if can_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return {"extra_mib": (peak - before) / 1024, "seconds": min(times), "max_abs_error": error}


def run(part, method, pass_name, args) -> dict:
    command = [sys.executable, __file__, "--worker", part, method, pass_name, "--threads", str(args.threads),
               "--rows", str(args.rows), "--length", str(args.length), "--vocab", str(args.vocab),
               "--hidden-size", str(args.hidden_size), "--repeats", str(args.repeats)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64, help="N sequences")
    parser.add_argument("--length", type=int, default=512, help="S completion tokens per sequence")
    parser.add_argument("--vocab", type=int, default=32000, help="V vocabulary size")
    parser.add_argument("--hidden-size", type=int, default=256, help="H of part 2's LM head")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after the measured one")
    parser.add_argument("--parts", default="logits,hidden", help="logits, hidden or both")
    parser.add_argument("--chunk-tokens", type=int, nargs="+", default=[1024, 4096],
                        help="part 2: token positions per tile, each run for grpo_edu and TRL")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--worker", nargs=3, metavar=("PART", "METHOD", "PASS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads is None:
        args.threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(worker(*args.worker, args.rows, args.length, args.vocab, args.hidden_size, args.repeats)))
        return

    try:
        import trl
        trl_version = trl.__version__
    except ImportError:
        trl_version = None
    N, S, V = args.rows, args.length, args.vocab
    print(f"N={N} S={S} V={V} float32, CPU, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"TRL {trl_version or 'not installed'}")
    print(f"(N, S, V) float32 = {N * S * V * 4 / 2**20:.0f} MiB\n")
    tile_columns = (f"tiles span all V = {V} columns in both" if V <= TRL_VOCABULARY_CHUNK else
                    f"TRL's tiles span {TRL_VOCABULARY_CHUNK} of V = {V} columns, ours all of them")
    titles = {"logits": "Part 1: from logits (N, S, V)",
              "hidden": f"Part 2: from hidden states (N S, H = {args.hidden_size}) through the LM head; after a "
                        f"method, its token positions per tile ({tile_columns})"}
    for part in args.parts.split(","):
        print(titles[part])
        print(f"{'pass':<18}{'method':<18}{'peak extra MiB':>16}{'vs naive':>10}{'seconds':>10}"
              f"{'vs naive':>10}{'max |error|':>13}")
        for pass_name in PASSES:
            naive = None
            for method in methods(part, args.chunk_tokens):
                if method.startswith("trl") and trl_version is None:
                    continue
                if method == "grpo_edu_inplace" and (part != "logits" or pass_name == "forward"):
                    continue  # the same as grpo_edu there (lm_head_logprobs always reuses its chunk)
                result = run(part, method, pass_name, args)
                if "error" in result:
                    print(f"{pass_name:<18}{label(method):<18}  failed: {result['error']}")
                    continue
                naive = naive or result
                print(f"{pass_name:<18}{label(method):<18}{result['extra_mib']:>16.0f}"
                      f"{result['extra_mib'] / naive['extra_mib']:>10.1%}{result['seconds']:>10.2f}"
                      f"{result['seconds'] / naive['seconds']:>9.2f}x{result['max_abs_error']:>13.1e}")
        print()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
