"""A chapter's claims, checked: each sentence the prose states, beside the test that makes it true.

A claims cell builds `{claim: bool}` from the results it computed and ends with `Claims(claims)`.
In the notebook and on the website that shows one line, "8 claims checked: all hold", with the
claims folded one click away; a claim that fails is named in that line, so a re-run that breaks
one cannot pass for the committed output.
"""

from __future__ import annotations

import html
from typing import Mapping

import numpy as np


class Claims:
    """`{claim: holds}`: the text says how many were checked and names every one that fails."""

    def __init__(self, claims: Mapping[str, object]):
        if not claims:
            raise ValueError("claims: expected at least one {claim: bool}, got none")
        checked = {}
        for claim, holds in claims.items():
            if not isinstance(holds, (bool, np.bool_)):
                raise TypeError(f"claims[{claim!r}]: expected a bool (the test of the claim), "
                                f"got {type(holds).__name__} {holds!r}")
            checked[str(claim)] = bool(holds)
        self.claims = checked

    @property
    def failing(self) -> list[str]:
        return [claim for claim, holds in self.claims.items() if not holds]

    def __bool__(self) -> bool:
        return not self.failing

    def _head(self) -> str:
        total = len(self.claims)
        if not self.failing:
            return f"{total} claim{'s' if total != 1 else ''} checked: all hold"
        return f"FAILS: {len(self.failing)} of {total} claims"

    def __repr__(self) -> str:
        if not self.failing:
            return self._head()
        return "\n".join([self._head() + ":"] + [f"  - {claim}" for claim in self.failing])

    def __str__(self) -> str:
        """Every claim, one line each."""
        return "\n".join([self._head()] + [f"  {'holds' if holds else 'FAILS'}: {claim}"
                                           for claim, holds in self.claims.items()])

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{'holds' if holds else '<b>FAILS</b>'}: {html.escape(claim)}</li>"
                        for claim, holds in self.claims.items())
        failing = "".join(f"\n  - {html.escape(claim)}" for claim in self.failing)
        head = html.escape(self._head()) + (":" if failing else "")
        return (f"<details class=\"claims\"><summary>{head}</summary><ul>{items}</ul></details>"
                + (f"<pre>{failing.strip()}</pre>" if failing else ""))
