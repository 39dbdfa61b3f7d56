"""The `grpo-edu` command.

    grpo-edu book list                 the chapter table
    grpo-edu book run [CHAPTER ...]    rebuild chapters (fresh kernel) and write their outputs
    grpo-edu book check [CHAPTER ...]  re-execute and compare outputs (nbval), check prose numbers
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpo_edu import book as bookmod


def _book_list(args) -> int:
    book = bookmod.load_book(args.root)
    if args.markdown:
        print(bookmod.chapter_table(book))  # the table README.md carries
        return 0
    print(f"{book.title}\n")
    print(f"{'#':>2}  {'title':<48} {'tier':<9} {'budget':>7}")
    for c in book.chapters:
        print(f"{c.number:>2}  {c.title:<48} {c.tier:<9} {c.budget_seconds:>5} s")
    return 0


def _runnable(chapter, tiers):
    reason = tiers[chapter.tier]
    if reason:
        print(f"chapter {chapter.number} ({chapter.name}): skipped, tier {chapter.tier!r}: {reason}")
    return reason is None


def _book_run(args) -> int:
    book = bookmod.load_book(args.root, building=True)
    tiers = bookmod.available_tiers()
    for chapter in book.select(args.chapters):
        if not _runnable(chapter, tiers):
            continue
        print(f"chapter {chapter.number} ({chapter.name}): running ...", flush=True)
        seconds = bookmod.run_chapter(chapter, book.root)
        verdict = "within" if seconds <= chapter.budget_seconds else "OVER"
        print(f"chapter {chapter.number}: wrote {chapter.path} in {seconds:.1f} s "
              f"({verdict} budget {chapter.budget_seconds} s)")
    return 0


def _book_check(args) -> int:
    book = bookmod.load_book(args.root)
    tiers = bookmod.available_tiers()
    rows, failed = [], False
    for chapter in book.select(args.chapters):
        offenders = bookmod.prose_number_offenders(book.root / chapter.path)
        for offender in offenders:
            print(f"chapter {chapter.number} prose: {offender}")
        if not _runnable(chapter, tiers):
            rows.append((chapter, "skipped", None, tiers[chapter.tier]))
            continue
        passed, seconds, output = bookmod.check_chapter(chapter, book.root)
        if not passed:
            print(output)
        within = seconds <= chapter.budget_seconds
        status = "ok" if passed and within and not offenders else "FAIL"
        failed |= status == "FAIL"
        notes = []
        if not passed:
            notes.append("outputs differ or a cell failed")
        if offenders:
            notes.append(f"{len(offenders)} prose number(s) not computed")
        if not within:
            notes.append("over budget")
        rows.append((chapter, status, seconds, "; ".join(notes)))

    print(f"\n{'#':>2}  {'chapter':<34} {'status':<8} {'time':>8} {'budget':>7}  notes")
    for chapter, status, seconds, note in rows:
        time = f"{seconds:.1f} s" if seconds is not None else "-"
        print(f"{chapter.number:>2}  {chapter.name:<34} {status:<8} {time:>8} {chapter.budget_seconds:>5} s  {note or ''}")
    return 1 if failed else 0


def _train(args) -> int:
    from grpo_edu import trainer
    from grpo_edu.config import DEFAULT_CONFIG, TrainConfig

    config_file = args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    try:
        config = TrainConfig.from_toml(config_file, args.set)
    except ValueError as error:
        print(f"grpo-edu train: {error}", file=sys.stderr)
        return 2
    if args.resume:
        # Continue the same run: its own config (written when it started), --set on top.
        config = TrainConfig.load_run_config(args.resume, args.set)
        config_file = f"{args.resume}/config.json"
    print(f"config: {config_file or 'defaults'}; output: {config.output_dir}")
    result = trainer.train(config, resume=args.resume)
    summary = result.summary
    print(f"\n{'':<28}{'before':>10}{'after':>10}")
    print(f"{'held-out greedy accuracy':<28}{summary['start_accuracy']:>10.4f}{summary['final_accuracy']:>10.4f}")
    print(f"steps {summary['steps']}, {summary['seconds']:.0f} s, "
          f"median {summary['median_steps_per_second']:.1f} steps/s")
    run = Path(config.output_dir)
    for name in ("samples_before.txt", "samples_after.txt"):
        if (run / name).is_file():
            print(f"\n{name[:-4].replace('_', ' ')}:\n" + (run / name).read_text())
    try:
        from grpo_edu.plots import plot_run
        plot_run(run, run / "curves.png", start_accuracy=summary["start_accuracy"])
        print(f"curves: {run / 'curves.png'}")
    except ImportError:
        print("curves: not plotted (matplotlib is not installed; pip install 'grpo-edu[book]')")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-edu", description="GRPO, a runnable textbook.")
    commands = parser.add_subparsers(dest="command", required=True)

    book = commands.add_parser("book", help="list, run and check the book's chapters")
    book.add_argument("--root", default=str(bookmod.ROOT), help="the book's folder (holds book.toml)")
    actions = book.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="the chapter table")
    listing.add_argument("--markdown", action="store_true", help="print README.md's Markdown table")
    listing.set_defaults(func=_book_list)
    for name, func, text in (("run", _book_run, "execute chapters in a fresh kernel and write their outputs"),
                             ("check", _book_check, "re-execute, compare every output, check prose numbers")):
        action = actions.add_parser(name, help=text)
        action.add_argument("chapters", nargs="*", metavar="CHAPTER",
                            help="chapter number or name (default: all)")
        action.set_defaults(func=func)
    from grpo_edu.config import help_text
    train = commands.add_parser("train", help="train a policy with GRPO",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=help_text())
    train.add_argument("--config", help="TOML config (default: configs/cpu-tiny.toml)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override one config key (repeatable), e.g. --set beta=0.0")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    train.set_defaults(func=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except bookmod.ManifestError as error:
        print(f"grpo-edu: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
