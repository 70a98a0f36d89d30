"""A model's entry arguments given static shapes, so that IREE forms static dispatches of a model
exported with dynamic dims (a batch or a sequence length left open).

Only public functions change: a private function's callers would no longer match its type. A
hinted argument takes the static type, and a `tensor.cast` back to the type it had feeds its
uses, so the body stays as written; IREE's canonicalization folds the cast into the ops it feeds
and their shapes become static (what it cannot make static stays dynamic, and is reported so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .hints import hint_for
from .mlir import context, ir, tensor


def is_public(function: ir.Operation) -> bool:
    attrs = function.attributes
    return "sym_visibility" not in attrs or ir.StringAttr(attrs["sym_visibility"]).value == "public"


def public_functions(module: ir.Module) -> list[tuple[str, ir.Operation]]:
    """(name, op) of every public func.func with a body: a model's entry points."""
    return [(ir.StringAttr(op.attributes["sym_name"]).value, op.operation) for op in module.body.operations
            if op.operation.name == "func.func" and len(op.regions[0].blocks) > 0 and is_public(op.operation)]


def specialize_arguments(module: ir.Module, hints: Mapping[str, Sequence[int]]) -> list[str]:
    """Give each public function's hinted ranked-tensor arguments the hint's static shape, in
    place; returns the arguments changed (`@func.argN: old -> new`). The hints must already fit
    the arguments (service.search.shapes.check_shape_hints): rank and static dims as given."""
    changed = []
    with context(), ir.Location.unknown():
        for name, function in public_functions(module):
            block = function.regions[0].blocks[0]
            before = len(changed)
            for index, argument in enumerate(block.arguments):
                hint = hint_for(hints, name, index)
                if hint is None or not isinstance(argument.type, ir.RankedTensorType):
                    continue
                dynamic = ir.RankedTensorType(argument.type)
                if dynamic.has_static_shape:
                    continue
                if dynamic.rank != len(hint):
                    raise ValueError(f"@{name} arg{index} has rank {dynamic.rank}, the hint {len(hint)}")
                static = ir.RankedTensorType.get(list(hint), dynamic.element_type, dynamic.encoding)
                argument.set_type(static)
                cast = tensor.CastOp(dynamic, argument, ip=ir.InsertionPoint.at_block_begin(block))
                argument.replace_all_uses_except(cast.result, cast.operation)
                changed.append(f"@{name}.arg{index}: {dynamic} -> {static}")
            if len(changed) > before:
                _retype(function, block)
    return changed


def _retype(function: ir.Operation, block: ir.Block) -> None:
    """The function's type from its entry block's arguments (its results unchanged)."""
    old = ir.FunctionType(ir.TypeAttr(function.attributes["function_type"]).value)
    function.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get([a.type for a in block.arguments], list(old.results)))
