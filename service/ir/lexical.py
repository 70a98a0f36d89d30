"""Resource guards and a cache key read from MLIR text without parsing it (no MLIR here).

These look at tokens only: string literals, `//` comments, SSA and block names, brackets.
They never decide what a module means; MLIR's parser does that. They exist because
  * MLIR's parser recurses on nesting and overflows its stack on deep input: the nesting is
    bounded before the parser sees the text (`check_text`);
  * the bindings raise a pybind TypeError on a lone surrogate: refused with a message instead;
  * two texts that differ only in comments, whitespace, SSA value names or block labels are
    the same module, and MLIR prints them the same: `normalised_key` lets the service answer
    the second one from what it knows of the first without a worker (a cache key only).
"""

from __future__ import annotations

import hashlib
import re

from .errors import InvalidTextError, NestingTooDeepError

# Real modules nest brackets a dozen deep; MLIR's recursive parser overflows its stack some
# thousands deep (a crash that costs a worker). 100 leaves room for any real module.
MAX_NESTING = 100

# Only the tokens each reader needs; everything between them is skipped by the regex engine.
# String literals and comments come first so that brackets or names inside them do not count.
_STRING = r'"(?:[^"\\\n]|\\.)*"?'
_COMMENT = r"//[^\n]*"
_BRACKETS = re.compile(rf"{_STRING}|{_COMMENT}|->|>=|[{{}}()\[\]<>]")
_NAMES = re.compile(rf"{_STRING}|(?:\s|{_COMMENT})+|[%^](?:[0-9]+|[A-Za-z_$.\-][A-Za-z0-9_$.\-]*)")
_OPEN = frozenset("{([<")
_CLOSE = frozenset("})]>")


def _line_column(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def check_text(source: str, max_nesting: int = MAX_NESTING) -> None:
    """InvalidTextError for text MLIR cannot take (lone surrogates, NUL), NestingTooDeepError
    when brackets nest deeper than `max_nesting`. Linear in the text; allocates nothing big."""
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as exc:
        line, column = _line_column(source, exc.start)
        raise InvalidTextError(f"it contains a lone surrogate (U+{ord(source[exc.start]):04X})", line, column) from None
    nul = source.find("\x00")
    if nul >= 0:
        raise InvalidTextError("it contains a NUL character", *_line_column(source, nul))
    depth = 0
    for match in _BRACKETS.finditer(source):
        token = match.group()
        if token in _OPEN:
            depth += 1
            if depth > max_nesting:
                raise NestingTooDeepError(depth, max_nesting, *_line_column(source, match.start()))
        elif token in _CLOSE:
            depth = max(0, depth - 1)


def normalised_key(source: str) -> str:
    """sha256 of the text with comments dropped, whitespace runs made one space and SSA values
    and block labels renamed in order of appearance. Equal keys: the same module."""
    names: dict[str, str] = {}

    def normal(match: re.Match[str]) -> str:
        token = match.group()
        first = token[0]
        if first in "%^":
            return names.setdefault(token, f"{first}{len(names)}")
        if first != '"':  # whitespace and comments, in one run
            return " "
        return token

    normal_text = _NAMES.sub(normal, source).strip()
    return hashlib.sha256(normal_text.encode("utf-8", "surrogatepass")).hexdigest()
