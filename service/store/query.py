"""What the store's query modules share: dialect upserts, keyset pages and their cursors."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

# Any JSON-serializable value (dicts, lists, numbers, strings, bools, None).
JSONValue = Any

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
# Bound on bind parameters per IN (...) list.
IN_CHUNK = 500

# Re-read rows even when the session already holds them: other processes change decisions.
FRESH = {"populate_existing": True}


class InvalidCursor(ValueError):
    """A pagination cursor that this store did not hand out."""


def upsert_insert(session: Session, table: Table) -> postgresql.Insert | sqlite.Insert:
    """A dialect INSERT that supports ON CONFLICT (both PostgreSQL and SQLite >= 3.24 do)."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"no upsert for dialect {dialect!r}")


def page_size(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return min(limit, MAX_PAGE_SIZE)


def encode_cursor(position: int) -> str:
    return base64.urlsafe_b64encode(f"v1:{position}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        version, _, position = raw.partition(":")
        if version != "v1":
            raise ValueError(version)
        return int(position)
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidCursor(f"invalid cursor {cursor!r}") from exc
