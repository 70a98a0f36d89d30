"""How shape hints name function arguments, in one place for everything that reads them.

`argN` names argument N of every function of the module; `FUNC.argN` names it in function
@FUNC only and wins over `argN` there. So a module whose functions share a dynamic `arg0` takes
one hint, and one whose functions have differently shaped `arg0`s takes one hint each
(`f1.arg0=8x64`, `f2.arg0=8x64x4`). Symbol names may contain dots; the argument is the last
`argN` component.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

HINT_NAME = re.compile(r"(?:@?(?P<func>.+)\.)?arg(?P<arg>\d+)")


def hint_key(func: str | None, index: int) -> str:
    """The name of argument `index`: `argN`, or `FUNC.argN` when `func` is given."""
    return f"{func}.arg{index}" if func else f"arg{index}"


def split_hint_key(name: str) -> tuple[str | None, int] | None:
    """'f2.arg0' -> ('f2', 0), 'arg0' -> (None, 0); None when `name` names no argument."""
    match = HINT_NAME.fullmatch(name)
    return None if match is None else (match.group("func"), int(match.group("arg")))


def hint_for(hints: Mapping[str, Sequence[int]], func: str | None, index: int) -> Sequence[int] | None:
    """The hint for argument `index` of function `func`: its own (`FUNC.argN`), else the
    module-wide one (`argN`), else None."""
    if func:
        own = hints.get(hint_key(func, index))
        if own is not None:
            return own
    return hints.get(hint_key(None, index))
