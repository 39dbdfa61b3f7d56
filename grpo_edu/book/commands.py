"""`grpo-edu book ...`: the book's subcommands (list, run, check, html), as grpo_edu.commands.cli
dispatches them. A bad argument or manifest raises BookUsageError: one line, exit code 2."""

from __future__ import annotations

from pathlib import Path

from grpo_edu import book as bookmod


class BookUsageError(Exception):
    """A bad --root, CHAPTER or book.toml: the CLI prints it as one line and exits 2."""


def load_book(args, building: bool = False):
    if not (Path(args.root) / "book.toml").is_file():
        raise BookUsageError(f"--root: expected a folder holding book.toml, got {args.root!r}")
    try:
        return bookmod.load_book(args.root, building=building)
    except bookmod.tomllib.TOMLDecodeError as error:
        raise BookUsageError(f"--root {args.root}: expected book.toml to be valid TOML, got: {error}") from error
    except bookmod.ManifestError as error:
        raise BookUsageError(f"--root {args.root}: {error}") from error


def _select(book, names):
    try:
        return book.select(names)
    except bookmod.ManifestError as error:
        raise BookUsageError(f"CHAPTER: {error}") from error


def book_list(args) -> int:
    book = load_book(args)
    if args.markdown:
        print(bookmod.chapter_table(book))  # the table README.md carries
        return 0
    print(f"{book.title}\n")
    print(f"{'#':>2}  {'title':<40} {'part':<12} {'needs':<6} {'reading':>8} {'tier':<5} {'budget':>7}")
    for c in book.chapters:
        needs = ",".join(str(n) for n in c.needs) or "-"
        print(f"{c.number:>2}  {c.title:<40} {c.part:<12} {needs:<6} {book.reading_minutes(c):>4} min "
              f"{c.tier:<5} {c.budget_seconds:>5} s")
    return 0


def book_map(args) -> int:
    """Draw the map of the book (book.toml's parts and needs) as SVG."""
    from grpo_edu.book.map import draw_map

    book = load_book(args)
    out = Path(args.out)
    if not out.parent.is_dir():
        raise BookUsageError(f"OUT: expected a file in an existing folder, got {args.out!r}")
    out.write_text(draw_map(book))
    print(f"wrote {out}")
    return 0


def _runnable(chapter, tiers):
    reason = tiers[chapter.tier]
    if reason:
        print(f"chapter {chapter.number} ({chapter.name}): skipped, tier {chapter.tier!r}: {reason}")
    return reason is None


def book_run(args) -> int:
    book = load_book(args, building=True)
    tiers = bookmod.available_tiers()
    for chapter in _select(book, args.chapters):
        if not _runnable(chapter, tiers):
            continue
        print(f"chapter {chapter.number} ({chapter.name}): running ...", flush=True)
        try:
            seconds = bookmod.run_chapter(chapter, book.root)
        except bookmod.UnpinnedBuildError as error:
            raise BookUsageError(str(error)) from error
        verdict = "within" if seconds <= chapter.budget_seconds else "OVER"
        print(f"chapter {chapter.number}: wrote {chapter.path} in {seconds:.1f} s "
              f"({verdict} budget {chapter.budget_seconds} s)")
    return 0


def book_prose(args) -> int:
    """Bring each chapter's changed prose into its notebook without executing it: only where
    its code is unchanged, so that every output stays the one a re-run prints."""
    from grpo_edu.book import notebooks

    book = load_book(args)
    for chapter in _select(book, args.chapters):
        try:
            changed = notebooks.sync_prose(book.root / chapter.source, book.root / chapter.path)
        except notebooks.CodeChangedError as error:
            raise BookUsageError(f"CHAPTER {chapter.number}: {error}") from error
        offenders = bookmod.prose_number_offenders(book.root / chapter.path)
        print(f"chapter {chapter.number}: {changed} markdown cell(s) written"
              + "".join(f"\n  prose: {o}" for o in offenders))
    return 0


def book_check(args) -> int:
    book = load_book(args)
    tiers = bookmod.available_tiers()
    rows, failed = [], False
    for chapter in _select(book, args.chapters):
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


def book_html(args) -> int:
    from grpo_edu.book import html as site

    book = load_book(args)
    try:
        pages = site.build_site(book, args.out_dir)
    except site.SiteError as error:
        raise BookUsageError(str(error)) from error
    print(f"{'page':<38} {'html':>9} {'figures':>9}  explorers")
    for page in pages:
        figures = f"{page.figure_bytes / 1024:.0f} KiB" if page.figures else "-"
        print(f"{page.path:<38} {page.html_bytes / 1024:>5.0f} KiB {figures:>9}  {page.explorers or '-'}")
    total = site.site_bytes(args.out_dir)
    index = Path(args.out_dir).resolve() / "index.html"
    print(f"\n{len(pages)} pages, {total / 2**20:.1f} MiB in all (KaTeX and the notebooks included); "
          f"open {index.as_uri()}")
    return 0
