"""Errors that are the caller's fault: search parameters the search cannot use. The CLI exits 2
and the API answers 422 with the message; any other exception from a search is a bug of ours."""

from __future__ import annotations


class SearchInputError(ValueError):
    """A search parameter the module or the search cannot use; the message says what to fix."""


class ShapeHintError(SearchInputError):
    """A shape hint or bucket the module cannot use."""


class UnknownStrategyError(SearchInputError):
    """A strategy name the search does not have."""
