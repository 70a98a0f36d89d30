"""Tile-and-fuse search: candidate space, strategies, engine.

Entry point: `service.search.engine.tune(source_text, hardware, ...) -> TuneResult`.
"""
