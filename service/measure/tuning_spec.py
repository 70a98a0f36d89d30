"""IREE tuning specs: the transform-dialect module `iree-compile --iree-codegen-tuning-spec-path`
applies to every dispatch root it matches.

The form is IREE's own (its docs' reference/tuning.md and its tests' tuning_spec_*.mlir): a
module with `transform.with_named_sequence` and `iree_codegen.tuning_spec_with_default_entrypoint`
whose `@__kernel_config` (attribute `iree_codegen.tuning_spec_entrypoint`) runs one
`transform.foreach_match` from one matcher per tuned root to `@apply_op_config`, which annotates
the op with the `compilation_info` the matcher yields. A contraction matcher names the operand
element types, the indexing maps and every dim size (`transform.iree.match.contraction` +
`dims_equal`), so it matches the op it was tuned for and nothing else of another shape or layout.
A convolution matcher does the same with `transform.iree.match.convolution` (batch, output image,
output channel, filter, input channel and depth sizes, strides and dilations, as
`linalg::inferConvolutionDims` reads them), for the convolutions IREE takes a config on.
The text is parsed back with MLIR before it is returned: a spec that does not parse is our bug.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from service.ir.graph import CONVOLUTION_ROLES, ConvolutionDims, OpGraph, TileableOp
from service.ir.plan import Plan
from service.ir.mlir import context, ir

from .cache import host_key
from .tools import HOST_COMPILE_FLAGS
from .lowering import (
    CONVOLUTION_PIPELINE,
    as_iree_compiles,
    compilation_info_text,
    convolution_not_configured,
    iree_configures_convolution,
    iree_keeps_own_pipeline,
    lowering_config_from_levels,
    lowering_config_text,
    translation_info_text,
)


@dataclass(frozen=True)
class ContractionDims:
    """IREE's contraction dims of an op: loop dims by the operands that index them."""

    batch: tuple[int, ...]
    m: tuple[int, ...]
    n: tuple[int, ...]
    k: tuple[int, ...]


@dataclass(frozen=True)
class ContractionMatcher:
    """Everything a matcher checks of one contraction root, and the config it applies."""

    name: str  # symbol-safe, unique in the spec
    lhs_type: str
    rhs_type: str
    output_type: str
    indexing_maps: tuple[str, ...]  # affine_map<...> text, lhs, rhs, output
    sizes: ContractionDims  # the loop extents of each dim group, in IREE's order
    compilation_info: str  # #iree_codegen.compilation_info<...> text
    lowering_config: str = ""  # the #iree_cpu.lowering_config<...> inside it, as IREE's dumps show it

    @property
    def matched(self) -> tuple:
        """What the matcher checks: two matchers with the same match the same ops."""
        return self.lhs_type, self.rhs_type, self.output_type, self.indexing_maps, self.sizes


@dataclass(frozen=True)
class ConvolutionMatcher:
    """Everything a matcher checks of one convolution root, and the config it applies."""

    name: str
    lhs_type: str
    rhs_type: str
    output_type: str
    indexing_maps: tuple[str, ...]  # input, filter, output
    sizes: ConvolutionDims  # each role's loop extents (strides and dilations as they are)
    compilation_info: str
    lowering_config: str = ""

    @property
    def matched(self) -> tuple:
        return self.lhs_type, self.rhs_type, self.output_type, self.indexing_maps, self.sizes


RootMatcher = ContractionMatcher | ConvolutionMatcher


def symbol_part(name: str) -> str:
    """A name (a dispatch's, a job item's) as part of a matcher's symbol (`@match_<it>`), so a
    spec reads like the report it came with."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def affine_map_attribute(map_text: str) -> str:
    """`affine_map<...>` text for a map given bare (`(d0, d1) -> (d0)`) or as an attribute."""
    return map_text if map_text.startswith("affine_map<") else f"affine_map<{map_text}>"


def _map_dims(map_text: str) -> set[int]:
    affine = ir.AffineMapAttr(ir.Attribute.parse(affine_map_attribute(map_text))).value
    return {e.position for e in affine.results if isinstance(e, ir.AffineDimExpr)}


def contraction_dims(indexing_maps: list[str], n_loops: int) -> ContractionDims:
    """batch: in lhs, rhs and output; m: lhs and output; n: rhs and output; k: lhs and rhs (as
    IREE infers them: `linalg::inferContractionDims`)."""
    with context():
        lhs, rhs, out = (_map_dims(m) for m in indexing_maps[:3])
    dims = range(n_loops)
    return ContractionDims(
        batch=tuple(d for d in dims if d in lhs and d in rhs and d in out),
        m=tuple(d for d in dims if d in lhs and d in out and d not in rhs),
        n=tuple(d for d in dims if d in rhs and d in out and d not in lhs),
        k=tuple(d for d in dims if d in lhs and d in rhs and d not in out),
    )


def contraction_matcher(op: TileableOp, levels: list, name: str, translation_info: str | None = None) -> ContractionMatcher | None:
    """The matcher of a contraction op with the config its plan levels give it; None for an op
    that is not a static contraction or for more levels than IREE's CPU config has."""
    if (op.kind != "contraction" or len(levels) > 3 or not op.indexing_maps or any(r is None for r in op.loop_ranges)
            or iree_keeps_own_pipeline(op)):
        return None
    config = lowering_config_from_levels(levels, op.iterator_types, anchor=op.name)
    dims = contraction_dims(op.indexing_maps, len(op.loop_ranges))
    extent = lambda ds: tuple(int(op.loop_ranges[d]) for d in ds)  # noqa: E731
    types = [as_iree_compiles(t) for t in op.operand_element_types]
    return ContractionMatcher(
        name=name, lhs_type=types[0], rhs_type=types[1], output_type=types[-1],
        indexing_maps=tuple(op.indexing_maps),
        sizes=ContractionDims(extent(dims.batch), extent(dims.m), extent(dims.n), extent(dims.k)),
        compilation_info=compilation_info_text(config, translation_info),
        lowering_config=lowering_config_text(config),
    )


def convolution_matcher(op: TileableOp, levels: list, name: str, translation_info: str | None = None) -> ConvolutionMatcher | None:
    """The matcher of a convolution op with the config its plan levels give it; None for an op
    that is not a static convolution IREE takes a config on (one with a batch dim), for pooling
    (no output or depthwise channels), or for more levels than IREE's CPU config has. `translation_info` is IREE's own for the op (default: the
    convolution pipeline without options)."""
    if (op.kind != "convolution" or len(levels) > 3 or not op.indexing_maps or any(r is None for r in op.loop_ranges)
            or not iree_configures_convolution(op)):
        return None
    dims = op.convolution_dims()
    if dims is None or dims.is_pooling:
        return None
    config = lowering_config_from_levels(levels, op.iterator_types, anchor=op.name)
    extent = lambda ds: tuple(int(op.loop_ranges[d]) for d in ds)  # noqa: E731
    types = [as_iree_compiles(t) for t in op.operand_element_types]
    return ConvolutionMatcher(
        name=name, lhs_type=types[0], rhs_type=types[1], output_type=types[-1],
        indexing_maps=tuple(op.indexing_maps),
        sizes=ConvolutionDims(**{role: extent(getattr(dims, role)) for role in CONVOLUTION_ROLES},
                              strides=dims.strides, dilations=dims.dilations),
        compilation_info=compilation_info_text(config, translation_info or translation_info_text(CONVOLUTION_PIPELINE)),
        lowering_config=lowering_config_text(config),
    )


def root_matcher(op: TileableOp, levels: list, name: str, translation_info: str | None = None) -> RootMatcher | None:
    """The matcher of a dispatch root, contraction or convolution (None: no matcher can match it)."""
    if op.kind == "convolution":
        return convolution_matcher(op, levels, name, translation_info)
    return contraction_matcher(op, levels, name, translation_info)


def _sizes(values: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def _matcher(m: RootMatcher) -> str:
    maps = ", ".join(affine_map_attribute(t) for t in m.indexing_maps)
    if isinstance(m, ConvolutionMatcher):
        return _convolution_matcher_text(m, maps)
    return f"""
  transform.named_sequence @match_{m.name}(%op: !transform.any_op {{transform.readonly}}) -> (!transform.any_op, !transform.any_param) {{
    %batch, %m, %n, %k = transform.iree.match.contraction %op, lhs_type = {m.lhs_type}, rhs_type = {m.rhs_type}, output_type = {m.output_type}, indexing_maps = [{maps}] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch, {_sizes(m.sizes.batch)} : !transform.param<i64>
    transform.iree.match.dims_equal %m, {_sizes(m.sizes.m)} : !transform.param<i64>
    transform.iree.match.dims_equal %n, {_sizes(m.sizes.n)} : !transform.param<i64>
    transform.iree.match.dims_equal %k, {_sizes(m.sizes.k)} : !transform.param<i64>
    %config = transform.param.constant {m.compilation_info} -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }}"""


def _convolution_matcher_text(m: ConvolutionMatcher, maps: str) -> str:
    groups = (*CONVOLUTION_ROLES, "strides", "dilations")
    checks = "".join(f"\n    transform.iree.match.dims_equal %{g}, {_sizes(getattr(m.sizes, g))} : !transform.param<i64>"
                     for g in groups)
    return f"""
  transform.named_sequence @match_{m.name}(%op: !transform.any_op {{transform.readonly}}) -> (!transform.any_op, !transform.any_param) {{
    {", ".join("%" + g for g in groups)} = transform.iree.match.convolution %op, lhs_type = {m.lhs_type}, rhs_type = {m.rhs_type}, output_type = {m.output_type}, indexing_maps = [{maps}] : !transform.any_op -> !transform.param<i64>{checks}
    %config = transform.param.constant {m.compilation_info} -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }}"""


def plan_matchers(graph: OpGraph, plan: Plan, translation_info: str | None = None) -> list[ContractionMatcher]:
    """A matcher per contraction anchor of the plan with its config; anchors with the same
    matcher keep the first one's config."""
    matchers: dict[tuple, ContractionMatcher] = {}
    for group in plan.groups:
        m = contraction_matcher(graph.op(group.anchor), [lv.model_dump() for lv in group.levels], f"op_{group.anchor}",
                                translation_info)
        if m is not None:
            matchers.setdefault(m.matched, m)
    return list(matchers.values())


def spec_for_plan(graph: OpGraph, plan: Plan, translation_info: str | None = None) -> str | None:
    """A tuning spec giving each contraction anchor of the plan its config (None: the plan
    configures no contraction)."""
    matchers = plan_matchers(graph, plan, translation_info)
    return tuning_spec(matchers) if matchers else None


def why_no_spec(graph: OpGraph, plan: Plan) -> str:
    """Why `spec_for_plan` gives no spec for this plan: what its anchors are."""
    anchors = [graph.op(g.anchor) for g in plan.groups]
    if not anchors:
        return "the plan tiles nothing"
    dynamic = [op for op in anchors if op.kind == "contraction" and any(r is None for r in op.loop_ranges)]
    if dynamic:
        return (f"{dynamic[0].name} (uid {dynamic[0].uid}) has dynamic dims: IREE's contraction matcher checks every "
                "dim size, so a spec is for static shapes only (shape hints size the search, not the module: give the "
                "module static shapes, e.g. as `tilesearch model size MODULE --shape-hint ...` writes it)")
    own = [why for op in anchors if op.kind == "contraction" and (why := iree_keeps_own_pipeline(op))]
    if own:
        return own[0]
    convolutions = [op for op in anchors if op.kind == "convolution"]
    if convolutions:
        conv = convolutions[0]
        return f"{conv.name} is a convolution: {convolution_not_configured(conv)}"
    return "the plan configures no contraction: " + ", ".join(sorted({f"{op.name} ({op.kind})" for op in anchors}))


def spec_compile_flags(spec: str | Path) -> list[str]:
    """iree-compile's flags for a build that uses the spec at `spec`. IREE 3.13's
    MaterializeTuningSpecsPass can deadlock when executables compile in parallel
    (IREECodegenDialect::getOrLoadTransformLibraryModule waits on a mutex held across the pass
    manager's thread pool; a full test run hung there twice): such a build compiles single-threaded."""
    return [f"--iree-codegen-tuning-spec-path={spec}", "--mlir-disable-threading"]


def _header(for_model: str | None) -> str:
    """How to build with the spec: the target flags its configs were chosen and proven under (a
    config fits the CPU it was tuned on, not another one), then the spec's own flags; and which
    model it was tuned for when that is not the model as given."""
    flags = " ".join([*HOST_COMPILE_FLAGS, *spec_compile_flags("THIS_FILE")])
    return (f"// iree-compile MODEL.mlir {flags} -o MODEL.vmfb\n"
            f"// tuned on {host_key()}; an ONNX model is imported first: iree-import-onnx MODEL.onnx -o MODEL.mlir\n"
            + (f"// matches {for_model}\n" if for_model else ""))


def tuning_spec(matchers: list[RootMatcher], for_model: str | None = None) -> str:
    """The spec module's text, as MLIR prints it after parsing it, under a comment saying how
    to compile with it (and, `for_model`, which model it matches)."""
    if not matchers:
        raise ValueError("a tuning spec with no matcher: IREE requires its entry point to be one foreach_match")
    names = [m.name for m in matchers]
    if len(set(names)) != len(names):
        raise ValueError(f"matcher names must be unique: {names}")
    cases = ",".join(f"\n        @match_{m.name} -> @apply_op_config" for m in matchers)
    body = "".join(_matcher(m) for m in matchers)
    entry = f"""
    %updated = transform.foreach_match in %root{cases}
        : (!transform.any_op) -> !transform.any_op
    transform.yield %updated : !transform.any_op"""
    text = f"""module attributes {{iree_codegen.tuning_spec_with_default_entrypoint, transform.with_named_sequence}} {{
  transform.named_sequence @apply_op_config(%op: !transform.any_op {{transform.readonly}}, %config: !transform.any_param {{transform.readonly}}) {{
    transform.annotate %op "compilation_info" = %config : !transform.any_op, !transform.any_param
    transform.yield
  }}{body}
  transform.named_sequence @__kernel_config(%root: !transform.any_op {{transform.consumed}}) -> !transform.any_op attributes {{iree_codegen.tuning_spec_entrypoint}} {{{entry}
  }}
}}
"""
    with context():
        try:
            return _header(for_model) + str(ir.Module.parse(text))
        except ir.MLIRError as err:
            raise RuntimeError(f"the tuning spec tilesearch wrote does not parse (a tilesearch bug): {err}\n{text}") from None
