"""A loop nest as the cost model sees it: a tree of loop nodes, the slices each body reads and
writes, and the tileable ops it computes.

The root is a pseudo-node (one iteration, depth 0) whose "iteration" is the whole nest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.ir.mlir import ir


@dataclass
class Slice:
    """One read or write of a tile of a tensor defined outside the node that holds it."""

    key: tuple
    source: ir.Value  # resolved through loop-carried block args
    bytes: int
    source_bytes: int
    deps: frozenset[int]  # ids of loop nodes whose induction variables move the slice
    node: "Node"
    is_write: bool = False


@dataclass
class Compute:
    """One tileable op in a node's body: one execution of it over its (tiled) iteration space."""

    op: object
    name: str
    uid: int | None
    points: int  # iteration points of one execution
    flops_per_point: int
    reduction_tile: list[int]
    parallel_tile: list[int]
    element_type: str
    element_bytes: int
    operand_bytes: int  # all operand + result tile bytes of one execution
    node: "Node"
    # Bytes of the accumulator (init operand + result) when it is carried by the enclosing
    # scf.for (iter_args, the reduction loop of a tiled contraction); 0 otherwise.
    carried_acc_bytes: int = 0
    # The outermost loop of the reduction nest that carries that accumulator (its own scf.for,
    # or one enclosing it whose iter_args feed it; None when not carried): the accumulator lives
    # across all its trips.
    accumulator_loop: "Node | None" = None
    # Rows of the register tile in the operand broadcast along the innermost parallel dim (A of
    # a matmul): (tile extent, byte stride in its whole tensor) per row dim; () if none.
    lhs_rows: tuple[tuple[int, int], ...] = ()
    # A row dim of that register tile has a dynamic extent in the IR: a tile above it (or the
    # register tile itself) does not divide the rows it tiles.
    dynamic_rows: bool = False
    # B (the input the innermost parallel dim indexes) is contiguous along a reduction dim, as
    # nn.Linear keeps weights [out, in]: its register tile is transposed (cost/registers.py).
    rhs_k_contiguous: bool = False
    # Rows of that B the register tile reads (extent, byte stride in its whole tensor) per row
    # dim: with a reduction tile under a vector, each row's line serves several steps.
    rhs_rows: tuple[tuple[int, int], ...] = ()
    # B's elements per reduction point when B is read through a slice that steps over elements
    # along the output row (a stride-2 convolution's input): no vector load reads them, each is
    # gathered on its own (cost/registers.py); 0 when B's rows are dense.
    strided_rhs_elements: int = 0
    # The first input is the one the innermost parallel dim indexes, read densely, and the second
    # is not (a 1x1 convolution over NCHW as IREE forms it, out[co, p] = X[ci, p] x W[co, ci]):
    # the register tile's extent over the second input's own parallel dims (co), 0 otherwise.
    # IREE's vector lowering puts the lanes along them (cost/registers.py).
    second_input_rows: int = 0
    # B stored [k, n] (its rows along the output's innermost dim) and read by a register tile
    # narrower than its rows: the whole tensor B is cut from, the bytes of one of its rows a
    # reduction step reads, and (extent, byte stride) of each of B's reduction dims, the rows a
    # register tile walks for its part of them (cost/registers.py); None, 0 and () otherwise.
    rhs_root: ir.Value | None = None
    rhs_run_bytes: int = 0
    rhs_walk_rows: tuple[tuple[int, int], ...] = ()
    # That first input's tile is dynamic along the innermost parallel dim (a tile above it does
    # not divide the pixels): IREE masks its reads and builds the FMAs' operands element by element.
    masked_first_input: bool = False


@dataclass
class Node:
    """A loop of the nest (or its root): trips per execution, and what its body holds."""

    id: int
    op: object | None  # None for the nest's root pseudo-node
    kind: str  # "root", "forall", "for"
    trips: int
    depth: int
    parent: "Node | None"
    items: list = field(default_factory=list)  # body in program order (ops)
    slices: list[Slice] = field(default_factory=list)  # direct reads/writes of this body
    computes: list[Compute] = field(default_factory=list)
    children: list["Node"] = field(default_factory=list)

    def subtree(self):
        yield self
        for c in self.children:
            yield from c.subtree()

    @property
    def executions(self) -> int:
        """How many times this node's loop runs in total (product of enclosing trips)."""
        total = 1
        n = self.parent
        while n is not None:
            total *= n.trips
            n = n.parent
        return total
