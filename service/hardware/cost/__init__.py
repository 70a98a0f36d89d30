"""Analytical memory/latency cost model over a TILED CLONE (the module a plan produced).

Each live top-level scf.forall / scf.for nest in a function body, and each tileable op standing
alone, is a *nest*: a tree of loop nodes with their trip counts, the slices their bodies read and
write, and the ops computed there. Module latency = sum over nests.

Modules, in the order a cost is made:
- ops: what the model asks of single ops and values; affine: affine maps on known values
- nest: the loop-node tree; analyzer: the walk of a function into those trees
- memory: footprints and the misses of each memory level
- registers: register-tile (microkernel) efficiency, spills, vector-tile limits
- nest_cost: one nest's compute, traffic and overhead terms
- latency: the one formula combining terms into latency (calibration uses it too)
- estimate: estimate_cost over a module, NestMemo, cost_of_plan; results: what they return
"""

from .estimate import COST_MODEL_VERSION, NestMemo, cost_of_plan, estimate_cost
from .latency import (
    NestTerms,
    module_latency_s,
    nest_latency_s,
    nest_terms,
    overlapped,
    under_calibration,
)
from .ops import DEFAULT_DYNAMIC_EXTENT, op_name_of
from .results import Cost, LevelCost, NestCost

__all__ = [
    "COST_MODEL_VERSION",
    "DEFAULT_DYNAMIC_EXTENT",
    "Cost",
    "LevelCost",
    "NestCost",
    "NestMemo",
    "NestTerms",
    "cost_of_plan",
    "estimate_cost",
    "module_latency_s",
    "nest_latency_s",
    "nest_terms",
    "op_name_of",
    "overlapped",
    "under_calibration",
]
