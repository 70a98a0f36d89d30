"""Tile-and-fuse search.

Entry point: `service.search.engine.tune(source_text, hardware, ...) -> TuneResult`.

- space: the candidate space (tile groups and their knobs); knobs: knob names
- candidate: candidates, evaluations and which evaluation is better
- strategies: what proposes candidates (TPE, NSGA-II, random, exhaustive, super tiling)
- evaluator: plans applied and costed in worker processes
- start: where each group's search starts, and its repair when that does not apply in MLIR
- engine: the search loop (coordinate descent over groups) and `tune`; results: what it answers
- refine: measure the top plans with IREE and answer with the fastest measured
- shapes: shape hints and buckets; report: presenting a result
"""
