"""`python -m service.cli`: the `tilesearch` command."""

from service.cli import app

app()
