"""Comparing a browser explorer's numbers and HTML with the Python explorer's (shared by
tests/test_html_explorers.py and tests/test_site.py)."""

from __future__ import annotations

import math
from html.parser import HTMLParser

from grpo_edu.book import explorer_specs

TOLERANCE = 1e-12


def assert_same(js, py, where: str = "state") -> None:
    """JS data equals Python's: floats to TOLERANCE, everything else exactly."""
    if isinstance(py, dict):
        assert isinstance(js, dict) and set(js) == set(py), f"{where}: keys {sorted(js)} != {sorted(py)}"
        for key in py:
            assert_same(js[key], py[key], f"{where}.{key}")
    elif isinstance(py, list):
        assert isinstance(js, list) and len(js) == len(py), f"{where}: {js!r} != {py!r}"
        for i, (a, b) in enumerate(zip(js, py)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(py, bool) or py is None or isinstance(py, str):
        assert js == py and type(js) is type(py), f"{where}: {js!r} != {py!r}"
    elif isinstance(py, int):
        assert js == py and float(js).is_integer(), f"{where}: {js!r} != {py!r}"
    else:
        assert isinstance(js, (int, float)) and not isinstance(js, bool), f"{where}: {js!r} is not a number"
        assert (js == py if math.isinf(py) else math.isclose(js, py, rel_tol=TOLERANCE, abs_tol=TOLERANCE)), \
            f"{where}: {js!r} != {py!r}"


class _Tokens(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tokens = []

    def handle_starttag(self, tag, attrs):
        self.tokens.append(("start", tag, tuple(attrs)))

    def handle_endtag(self, tag):
        self.tokens.append(("end", tag))

    def handle_data(self, data):
        self.tokens.append(("text", data))


def html_tokens(text: str) -> list:
    parser = _Tokens()
    parser.feed(text)
    parser.close()
    return parser.tokens


def assert_same_html(js: str, py: str, where: str) -> set[str]:
    """Same tags, attributes and text; data-value (a float's repr) to TOLERANCE. Returns
    the classes of the cells whose data-value differs from Python's in the last bits."""
    js_tokens, py_tokens = html_tokens(js), html_tokens(py)
    assert len(js_tokens) == len(py_tokens), f"{where}: {js}\n!=\n{py}"
    inexact = set()
    for a, b in zip(js_tokens, py_tokens):
        if a[0] == "start" and a[1] == b[1] == "td":
            a_attrs, b_attrs = dict(a[2]), dict(b[2])
            if "data-value" in b_attrs:
                a_value, b_value = a_attrs.pop("data-value"), b_attrs.pop("data-value")
                assert_same(float(a_value), float(b_value), where)
                if a_value != b_value:
                    inexact.add(b_attrs["class"])
            assert list(a_attrs.items()) == list(b_attrs.items()), f"{where}: {a} != {b}"
        else:
            assert a == b, f"{where}: {a} != {b}"
    return inexact


def assert_matches_python(kind: str, shown: dict) -> None:
    """`shown` (config, state, and the table and notes boxes' innerHTML, read from the page)
    is what the Python explorer computes and shows for that config."""
    python = explorer_specs.python_state(kind, shown["config"])
    assert_same_html(shown["table"], python.pop("table"), f"{kind} table")
    assert_same_html(shown["notes"], python.pop("notes_html"), f"{kind} notes")
    assert_same(shown["state"], python, f"{kind} state")
