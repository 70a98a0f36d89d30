"""Tile-and-fuse search: candidate space, strategies, engine (`tune`)."""
