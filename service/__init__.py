"""tilesearch: a tiling and fusion search service for MLIR compilers."""

__version__ = "0.1.0"
