"""`tilesearch` command line: thin wrappers over the library (no logic lives here)."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="tilesearch",
    help="Tile-and-fuse search for MLIR tensor programs.",
    no_args_is_help=True,
    add_completion=False,
)


if __name__ == "__main__":
    app()
