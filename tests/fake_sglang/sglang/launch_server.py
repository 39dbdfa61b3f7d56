"""`python -m sglang.launch_server`, as the tests run it: the flags grpo_edu's engine passes, each
checked against SGLang 0.5.23's own (the frozen ServerArgs fields), parsed strictly (an unknown
flag exits 2, as SGLang's argparse does), then the stand-in serves on --port in this process.

FAKE_SGLANG_LOG: a file that gets one JSON line, the argv and the GPU the server was given
(CUDA_VISIBLE_DEVICES), and the stand-in's requests after it. FAKE_SGLANG_STARTING: seconds of
503 from /health_generate before it is ready. FAKE_SGLANG_EXIT: exit with this code at once
(before its flags are parsed), after one line on stderr (a server that fails to start).
FAKE_SGLANG_IGNORE_SEEDS: say it runs deterministic inference, but sample from its own random
state.
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # tests/, for sglang_standin


def write_log() -> str | None:
    """FAKE_SGLANG_LOG's first line: the argv and the environment the server was given."""
    log = os.environ.get("FAKE_SGLANG_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"argv": sys.argv[1:], "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                "SGLANG_USE_CPU_ENGINE": os.environ.get("SGLANG_USE_CPU_ENGINE"),
                                "SGLANG_RETURN_ORIGINAL_LOGPROB": os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB")})
                    + "\n")
    return log


def main() -> None:
    if os.environ.get("FAKE_SGLANG_EXIT"):
        # Before the stand-in's imports (torch, transformers: seconds on a loaded machine), so that the
        # exit always comes before a test's short start-up timeout.
        write_log()
        print("RuntimeError: the fake server was told to fail at start-up", file=sys.stderr, flush=True)
        sys.exit(int(os.environ["FAKE_SGLANG_EXIT"]))
    from sglang_standin import FROZEN, StandIn

    flags = {flag: field for field, flag in FROZEN["server_args"].items() if flag}
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    for flag in ("--model-path", "--host", "--device", "--dtype"):
        parser.add_argument(flag, dest=flags[flag], required=flag == "--model-path")
    parser.add_argument("--port", dest=flags["--port"], type=int, default=30000)
    parser.add_argument("--random-seed", dest=flags["--random-seed"], type=int)
    parser.add_argument("--mem-fraction-static", dest=flags["--mem-fraction-static"], type=float)
    for flag in ("--enable-memory-saver", "--enable-deterministic-inference"):
        parser.add_argument(flag, dest=flags[flag], action="store_true")
    args = parser.parse_args()
    log = write_log()
    standin = StandIn(args.model_path, port=args.port, deterministic=args.enable_deterministic_inference,
                      memory_saver=args.enable_memory_saver, random_seed=args.random_seed or 0,
                      starting_seconds=float(os.environ.get("FAKE_SGLANG_STARTING", "0")), call_log=log, serve=False,
                      ignore_seeds=bool(os.environ.get("FAKE_SGLANG_IGNORE_SEEDS")))
    print(f"The server is fired up and ready to roll! ({standin.url})", flush=True)
    standin.server.serve_forever()


if __name__ == "__main__":
    main()
