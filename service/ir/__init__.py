"""IR core: parse MLIR, build the op graph, fingerprint, clone with an origin map, apply plans.

Only `service.ir.mlir` imports the MLIR bindings; everything here works on MLIR objects that
live in one context per process (see `mlir.context()`).
"""
