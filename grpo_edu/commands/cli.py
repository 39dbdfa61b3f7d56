"""The `grpo-edu` command.

    grpo-edu train [--config FILE] [--set KEY=VALUE ...] [--resume RUN_DIR]
    grpo-edu config show [FILE] [--set KEY=VALUE ...]   the resolved config, each key's source
    grpo-edu eval RUN_DIR [--samples K]    the trained policy on the run's held-out problems, again
    grpo-edu sample RUN_DIR PROMPT [-n N]  completions of your own prompt by the trained policy
    grpo-edu book list                 the chapter table
    grpo-edu book run [CHAPTER ...]    rebuild chapters (fresh kernel) and write their outputs
    grpo-edu book check [CHAPTER ...]  re-execute and compare outputs (nbval), check prose numbers
    grpo-edu book map [OUT]            draw the map of the book (docs/images/map.svg)
    grpo-edu book prose [CHAPTER ...]  write changed prose into the notebooks, where no code changed
    grpo-edu doctor RUN_DIR            diagnose a run: each failure symptom in its metrics, with evidence
    grpo-edu doctor --gpu              check a GPU machine for the vLLM and SGLang engines (pass/fail table)
    grpo-edu vllm-serve MODEL          start the vLLM server of vllm_mode = "server" (127.0.0.1)

A bad argument or input file is one line on stderr that names the argument, what
was expected and what was given, and exit code 2; --debug adds the traceback.
An SGLang server that is absent, dies or answers badly (engine = "sglang") is one line
saying what happened, and exit code 1. Anything else that goes wrong is a bug and shows
its traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

from grpo_edu import book as bookmod
from grpo_edu.book import commands as book_commands


class UsageError(Exception):
    """A bad argument or input file: one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse prints its usage block first; one line is the rule here too.
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ train

def _train_config(args):
    """The run's TrainConfig and where it came from; a bad file or --set is a UsageError."""
    from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
    from grpo_edu.config.files import tomllib

    if args.resume:
        # Continue the same run: its own config (written when it started), --set on top.
        run = Path(args.resume)
        if not run.is_dir():
            given = "not a folder" if run.exists() else "no such folder"
            raise UsageError(f"--resume: expected a run directory, got {args.resume!r} ({given})")
        if not (run / "config.json").is_file():
            raise UsageError(f"--resume: expected a run directory (config.json, metrics.jsonl, checkpoints/), "
                             f"got {args.resume!r}, which holds no config.json")
        if args.config:
            _say(f"grpo-edu train: --config {args.config} is not used: a resumed run keeps its own "
                 f"config.json (change keys with --set)")
        source = run / "config.json"
        try:
            return TrainConfig.load_run_config(run, args.set), source
        except json.JSONDecodeError as error:
            raise UsageError(f"--resume {args.resume}: expected config.json to hold JSON, got: {error}") from error
        except ValueError as error:
            raise _blame(error, lambda: TrainConfig.load_run_config(run), f"--resume {source}") from error

    source = args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    if args.config is not None and not Path(args.config).is_file():
        given = "a folder" if Path(args.config).is_dir() else "no such file"
        raise UsageError(f"--config: expected a TOML file, got {args.config!r} ({given})")
    try:
        return TrainConfig.from_toml(source, args.set), source or "defaults"
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"--config {source}: expected valid TOML, got: {error}") from error
    except OSError as error:
        raise UsageError(f"--config: expected a readable TOML file, got {str(source)!r} ({error.strerror})") from error
    except ValueError as error:
        raise _blame(error, lambda: TrainConfig.from_toml(source), f"--config {source}") from error


def _config_show(args) -> int:
    """grpo-edu config show [FILE] [--set ...]: the resolved config with each key's source."""
    from grpo_edu.config import DEFAULT_CONFIG
    from grpo_edu.config import TrainConfig
    from grpo_edu.config.files import show, tomllib
    resolve = TrainConfig.resolve

    source = args.file or (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    if args.file is not None and not Path(args.file).is_file():
        given = "a folder" if Path(args.file).is_dir() else "no such file"
        raise UsageError(f"FILE: expected a TOML file, got {args.file!r} ({given})")
    try:
        resolved = resolve(source, args.set)
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{source}: expected valid TOML, got: {error}") from error
    except ValueError as error:
        raise _blame(error, lambda: resolve(source), str(source)) from error
    print(show(resolved, overrides=args.set), end="")
    return 0


def _blame(error: ValueError, file_alone, file_argument: str) -> UsageError:
    """Name the argument at fault: the file if it fails on its own, else --set."""
    try:
        file_alone()
    except ValueError:
        return UsageError(f"{file_argument}: {error}")
    return UsageError(str(error) if str(error).startswith("--set") else f"--set: {error}")


def _check_writable(output_dir: str, argument: str) -> None:
    folder = Path(output_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise UsageError(f"{argument}: expected a folder that can be created and written, "
                         f"got {output_dir!r} ({error.strerror or error})") from error


def _check_model_and_device(config) -> None:
    import torch

    path = Path(config.run.model).expanduser()
    looks_local = path.exists() or config.run.model.startswith((".", "/", "~"))  # as models.load_policy decides
    from grpo_edu.policy.models import COMMITTED_POLICIES
    names = [repr(name) for name in COMMITTED_POLICIES]
    committed = f"{', '.join(names[:-1])} or {names[-1]}"
    if config.run.model not in COMMITTED_POLICIES and looks_local and not path.exists():
        raise UsageError(f"model: expected {committed}, a saved model folder (holding config.json) or a hub id, "
                         f"got {config.run.model!r}: no such folder. If an earlier step writes it (a pretraining "
                         f"run, python -m grpo_edu.commands.pretrain --output-dir {config.run.model}), run that step first: "
                         f"it writes the folder only once it reaches its --target-accuracy")
    if config.run.model not in COMMITTED_POLICIES and looks_local and not (path / "config.json").is_file():
        raise UsageError(f"model: expected {committed}, a saved model folder (holding config.json) or a hub id, "
                         f"got {config.run.model!r}, which holds no config.json")
    if config.run.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("device: expected a device this machine has, got 'cuda' (torch sees no CUDA GPU)")


def _cannot_write(error: OSError, output_dir: str) -> bool:
    """A write into the run directory failed (disk full, read-only, permissions), not a bug."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        return True
    return bool(error.filename) and Path(str(error.filename)).resolve().is_relative_to(Path(output_dir).resolve())


def _check_world(config) -> tuple[int, bool]:
    """The number of processes torchrun started (1 without it) and whether this is rank 0;
    prompts_per_step must split into whole prompts per process."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if config.rollout.prompts_per_step % processes:
        raise UsageError(f"prompts_per_step: expected a multiple of the number of processes ({processes}; each "
                         f"owns whole prompts, all G completions of each), got {config.rollout.prompts_per_step}")
    return processes, int(os.environ.get("RANK", "0")) == 0


def _train(args) -> int:
    config, source = _train_config(args)
    argument = f"--resume {args.resume}" if args.resume else "output_dir"
    processes, main_rank = _check_world(config)
    _check_writable(config.logging.output_dir, argument)
    # torch and transformers: seconds, after the quick checks
    from grpo_edu.runtime import distributed
    from grpo_edu.training import checkpoint, trainer, user_functions

    _check_model_and_device(config)
    try:   # the reader's own functions (by import path): imported and probed before the run starts
        user_functions.functions_from_config(config)
    except ValueError as error:
        raise UsageError(str(error)) from error

    if main_rank:
        world = f"; {processes} processes ({config.run.parallelism})" if processes > 1 else ""
        print(f"config: {source}; output: {config.logging.output_dir}{world}")
    try:
        # The log (start accuracy, what resume repaired) goes to stderr with the progress bar.
        result = trainer.train(config, resume=args.resume, log=_say)
    except checkpoint.CheckpointError as error:
        raise UsageError(f"--resume {error}") from error
    except ImportError as error:
        from grpo_edu.sampling.vllm_engine import VLLMNotInstalled
        if not isinstance(error, VLLMNotInstalled):
            raise
        raise UsageError(f"engine: {error}") from error
    except RuntimeError as error:
        from grpo_edu.sampling.sglang_engine import SGLangServerError
        if not isinstance(error, SGLangServerError):
            raise
        _say(f"grpo-edu train: {error}")   # the server failed, not the reader's input: exit 1
        return 1
    except OSError as error:
        if not _cannot_write(error, config.logging.output_dir):
            raise
        raise UsageError(f"{argument}: expected a folder that can be written, got {config.logging.output_dir!r} "
                         f"({error.strerror or error}: {error.filename or ''})") from error
    except KeyboardInterrupt:
        _say(f"grpo-edu train: interrupted; continue from the newest checkpoint with "
             f"grpo-edu train --resume {config.logging.output_dir}")
        return 130
    finally:
        distributed.close_world(distributed.World(size=processes))
    if not main_rank:
        return 0
    summary = result.summary
    print(f"\n{'':<28}{'before':>12}{'after':>12}")
    print(f"{'held-out greedy accuracy':<28}{summary['start_accuracy']:>12.4f}{summary['final_accuracy']:>12.4f}")
    spans = [f"{a:.3f}-{b:.3f}" for a, b in (summary["start_accuracy_interval_95"],
                                             summary["final_accuracy_interval_95"])]
    label = f"95% interval ({summary['eval_problems']} problems)"
    print(f"{label:<28}{spans[0]:>12}{spans[1]:>12}")
    ends = summary.get("rollouts") or {}
    if ends:
        print(f"\n{'rollouts (mean of ' + str(ends['window']) + ' steps)':<28}{'first':>12}{'last':>12}")
        for key in ends["first"]:
            print(f"{key:<28}{ends['first'][key]:>12.4f}{ends['last'][key]:>12.4f}")
    print(f"steps {summary['steps']}, {summary['seconds']:.0f} s, "
          f"median {summary['median_steps_per_second']:.1f} steps/s")
    run = Path(config.logging.output_dir)
    for name in ("samples_before.txt", "samples_after.txt"):
        if (run / name).is_file():
            print(f"\n{name[:-4].replace('_', ' ')}:\n" + (run / name).read_text())
    try:
        from grpo_edu.book.plots import plot_run
        plot_run(run, run / "curves.png", start_accuracy=summary["start_accuracy"])
        print(f"curves: {run / 'curves.png'}")
    except ImportError:
        print("curves: not plotted (matplotlib is not installed; pip install 'grpo-edu[book]')")
    return 0


def _trained(args):
    from grpo_edu.training import trained
    try:
        return trained, trained.load_trained(args.run_dir)
    except (trained.TrainedModelError, OSError) as error:
        raise UsageError(str(error)) from error


def _eval(args) -> int:
    trained, policy = _trained(args)
    try:
        results = trained.evaluate_run(policy, samples=args.samples, problems=args.problems,
                                       max_new_tokens=args.max_new_tokens)
    except trained.TrainedModelError as error:
        raise UsageError(str(error)) from error
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{args.run_dir}: {policy.source}; {results['problems']} held-out {results['task']} problems, "
          f"at most {results['max_new_tokens']} new tokens")
    rows = [("greedy accuracy", "greedy_accuracy"), ("greedy format", "greedy_format")]
    if args.samples:
        rows += [(f"{name} ({args.samples} samples, T = 1)", key) for name, key in
                 (("pass@1", "pass_at_1"), (f"pass@{args.samples}", f"pass_at_{args.samples}"),
                  (f"maj@{args.samples}", f"maj_at_{args.samples}"))]
    for name, key in rows:
        low, high = results[f"{key}_interval_95"]
        print(f"  {name:<32}{results[key]:>8.4f}   95% interval [{low:.4f}, {high:.4f}]")
    summary = Path(args.run_dir) / "summary.json"
    if summary.is_file() and args.problems is None and args.max_new_tokens is None:
        print(f"  (the run's own final evaluation: {json.loads(summary.read_text())['final_accuracy']:.4f})")
    return 0


def _sample(args) -> int:
    trained, policy = _trained(args)
    try:
        n = args.n if args.n is not None else 1 if args.temperature == 0 else 4
        prompt, completions = trained.sample(policy, args.prompt, n=n, temperature=args.temperature,
                                             max_new_tokens=args.max_new_tokens, seed=args.seed, raw=args.raw)
    except trained.TrainedModelError as error:
        raise UsageError(str(error)) from error
    print(f"{args.run_dir}: {policy.source}; prompt as the policy reads it: {prompt!r}")
    for i, completion in enumerate(completions, 1):
        print(f"{i:>3}  {completion}")
    return 0


def _doctor(args) -> int:
    if args.engine is not None and not args.gpu:
        raise UsageError(f"--engine: expected with --gpu, got --engine {args.engine} without it")
    if args.run_dir is not None and args.gpu:
        raise UsageError(f"expected RUN_DIR or --gpu, got both ({args.run_dir!r} and --gpu)")
    if args.run_dir is not None:
        from grpo_edu.doctor import diagnose
        try:
            findings = diagnose.diagnose_run(args.run_dir)
        except ValueError as error:
            raise UsageError(str(error)) from None
        steps = len(diagnose.MetricsLog(args.run_dir).read())
        print(diagnose.report(findings, steps))
        return 1 if findings else 0
    if not args.gpu:
        raise UsageError("expected RUN_DIR (diagnose a run from its metrics) or --gpu (the GPU machine's check "
                         "of the vLLM and SGLang engines), got neither")
    from grpo_edu.commands import doctor
    if args.engine is None:
        return doctor.gpu()
    return doctor.gpu(engines=(args.engine,), required=(args.engine,))


def _vllm_serve(args) -> int:
    import shlex
    import shutil

    path = Path(args.model).expanduser()
    if (path.exists() or args.model.startswith((".", "/", "~"))) and not (path / "config.json").is_file():
        given = "holds no config.json" if path.is_dir() else "not a folder" if path.exists() else "no such folder"
        raise UsageError(f"MODEL: expected a saved model folder (holding config.json) or a hub id, "
                         f"got {args.model!r} ({given})")
    if not 0.0 < args.gpu_memory_utilization <= 1.0:
        raise UsageError(f"--gpu-memory-utilization: expected a fraction in (0, 1], got {args.gpu_memory_utilization}")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port: expected a port number in 1..65535, got {args.port}")
    from grpo_edu.sampling.vllm_engine import serve_command
    try:
        command = serve_command(str(path) if path.exists() else args.model, host=args.host, port=args.port,
                                gpu_memory_utilization=args.gpu_memory_utilization)
    except ImportError as error:
        raise UsageError(f"expected TRL and vLLM installed (pip install -e '.[gpu]'), got: {error}") from error
    environment = dict(os.environ, VLLM_SERVER_DEV_MODE="1")   # the weight-transfer and cache routes
    if args.dry_run:
        print(f"VLLM_SERVER_DEV_MODE=1 {shlex.join(command)}")
        return 0
    # On PATH, else beside this Python (a virtual environment that is not activated).
    executable = shutil.which(command[0]) or shutil.which(command[0], path=str(Path(sys.executable).parent))
    if executable is None:
        raise UsageError(f"expected the {command[0]!r} command on PATH or beside {sys.executable} "
                         f"(pip install -e '.[gpu]'), found none")
    os.execve(executable, command, environment)   # the server replaces this process


def _debug_flag(parser, top: bool = False) -> None:
    # On every level, so that `grpo-edu train --debug` and `grpo-edu --debug train` both work.
    parser.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="on an error, show the traceback as well")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="grpo-edu", description="GRPO, a runnable textbook.")
    _debug_flag(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True)

    book = commands.add_parser("book", help="list, run and check the book's chapters")
    _debug_flag(book)
    book.add_argument("--root", default=str(bookmod.ROOT), help="the book's folder (holds book.toml)")
    actions = book.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="the chapter table")
    _debug_flag(listing)
    listing.add_argument("--markdown", action="store_true", help="print README.md's Markdown table")
    listing.set_defaults(func=book_commands.book_list)
    for name, func, text in (
            ("run", book_commands.book_run, "execute chapters in a fresh kernel and write their outputs"),
            ("check", book_commands.book_check, "re-execute, compare every output, check prose numbers"),
            ("prose", book_commands.book_prose, "write changed prose into the notebooks without executing "
                                                "them (refused where a code cell changed)")):
        action = actions.add_parser(name, help=text)
        _debug_flag(action)
        action.add_argument("chapters", nargs="*", metavar="CHAPTER",
                            help="chapter number or name (default: all)")
        action.set_defaults(func=func)
    drawing = actions.add_parser("map", help="draw the map of the book: parts, chapters, what needs what (SVG)")
    _debug_flag(drawing)
    drawing.add_argument("out", nargs="?", default=str(bookmod.ROOT / "docs" / "images" / "map.svg"),
                         metavar="OUT", help="the SVG file to write (default docs/images/map.svg)")
    drawing.set_defaults(func=book_commands.book_map)
    site = actions.add_parser("html", help="build the static website (every page from the committed "
                              "notebooks, explorers live in the browser)")
    _debug_flag(site)
    site.add_argument("out_dir", nargs="?", default="build/html", metavar="OUT_DIR",
                      help="where to write it (default build/html; an earlier build there is replaced)")
    site.set_defaults(func=book_commands.book_html)
    from grpo_edu.config import help_text
    train = commands.add_parser("train", help="train a policy with GRPO",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=help_text())
    _debug_flag(train)
    train.add_argument("--config", help="TOML config (default: configs/cpu-tiny.toml)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override one config key (repeatable), e.g. --set beta=0.0")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest "
                       "complete checkpoint (a damaged one is named and skipped)")
    train.set_defaults(func=_train)

    evaluate = commands.add_parser("eval", help="evaluate a run's trained policy on its held-out problems again")
    _debug_flag(evaluate)
    evaluate.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (its model/, else its newest checkpoint)")
    evaluate.add_argument("--samples", type=int, default=0, metavar="K",
                          help="also K samples per problem at temperature 1: pass@1, pass@K, maj@K (default 0)")
    evaluate.add_argument("--problems", type=int, help="the first N held-out problems only (default: the run's all)")
    evaluate.add_argument("--max-new-tokens", type=int, help="default: the run's max_completion_length")
    evaluate.add_argument("--json", action="store_true", help="print the results as JSON")
    evaluate.set_defaults(func=_eval)
    sampler = commands.add_parser("sample", help="sample completions of a prompt from a run's trained policy")
    _debug_flag(sampler)
    sampler.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (its model/, else its newest checkpoint)")
    sampler.add_argument("prompt", metavar="PROMPT", help='the prompt, e.g. "47+85=" (the tiny task\'s format)')
    sampler.add_argument("-n", type=int, help="completions (default 4; 1 with --temperature 0)")
    sampler.add_argument("--temperature", type=float, default=1.0, help="0 is greedy (default 1.0, as training samples)")
    sampler.add_argument("--max-new-tokens", type=int, help="default: the run's max_completion_length")
    sampler.add_argument("--seed", type=int, default=0, help="the sampling seed (default 0)")
    sampler.add_argument("--raw", action="store_true", help="do not wrap the prompt in the chat template")
    sampler.set_defaults(func=_sample)

    doctor = commands.add_parser("doctor", help="diagnose a run from its metrics (RUN_DIR), or check this machine "
                                 "for the GPU tier (--gpu)")
    _debug_flag(doctor)
    doctor.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run directory: report each failure "
                        "symptom in its metrics.jsonl, with the evidence and advice (exit status 1 if any)")
    doctor.add_argument("--gpu", action="store_true", help="CUDA, vLLM and SGLang: each engine's weight sync and "
                        "log-probs, two training steps: a pass/fail table (an engine not installed is skipped; "
                        "without a GPU: what it would check)")
    doctor.add_argument("--engine", choices=("vllm", "sglang"), default=None, help="with --gpu: check this engine "
                        "only, and fail if it is not installed")
    doctor.set_defaults(func=_doctor)

    config = commands.add_parser("config", help="the config a run would use: every key, its value and its source")
    shows = config.add_subparsers(dest="action", required=True)
    show = shows.add_parser("show", help="print the resolved config as a TOML file, each key's source in a comment "
                            "(default, the file that set it, or --set)")
    _debug_flag(show)
    show.add_argument("file", nargs="?", metavar="FILE", help="a TOML config (default: configs/cpu-tiny.toml)")
    show.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override one config key (repeatable), as grpo-edu train takes it")
    show.set_defaults(func=_config_show)

    serve = commands.add_parser("vllm-serve", help="start a vLLM server for vllm_mode = 'server'")
    _debug_flag(serve)
    serve.add_argument("model", metavar="MODEL", help="the policy: a saved model folder or a hub id (the "
                       "trainer's config.run.model)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: the server's "
                       "weight-transfer and cache routes must not face a network; 0.0.0.0 only when meant)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; the trainer's vllm_server_url)")
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                       help="the fraction of the GPU vLLM takes (default 0.9: the GPU is its own)")
    serve.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    serve.set_defaults(func=_vllm_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, book_commands.BookUsageError, bookmod.ManifestError) as error:
        if args.debug:
            traceback.print_exc()
        print(f"grpo-edu {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
