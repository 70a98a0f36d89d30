"""A model exported with dynamic dims, given static input shapes by shape hints.

IREE forms a static dispatch only where every size is known, and a tuning spec's matchers check
static dims, so a model whose batch or sequence length is left open is tuned for the sizes the
user names (`--shape-hint arg0=16x512`, as `tilesearch tune` names arguments) and the spec
matches the model with those sizes, which is written beside the spec to compile with it.
- MLIR (linalg on tensors): the public functions' hinted arguments take the static type
  (service.ir.specialize).
- ONNX: the graph's hinted inputs take the sizes before import, and so does every input dim
  named like a hinted one (an attention mask's [batch, seq] with the input ids'); iree-import-onnx
  runs ONNX's shape inference, which carries them through the graph.
- Torch dialect written by hand or by iree-turbine: refused, with what to give instead.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import onnx

from service.ir.errors import FrontendDialectError, IRError
from service.ir.hints import hint_for, split_hint_key
from service.ir.mlir import context, ir
from service.ir.parse import check_tensor_semantics, parse_module
from service.ir.sandbox import Sandbox
from service.ir.specialize import public_functions, specialize_arguments
from service.search.errors import ShapeHintError
from service.search.shapes import Argument, check_hints_agree, check_shape_hints, function_arguments, implied_sizes

ONNX_SUFFIX = ".onnx"
# Parsing a model with its weights inline takes seconds to minutes (DistilBERT's 150 MB: 87 s).
_PARSE_TIMEOUT_S = 600.0
_PROTOBUF_LIMIT = 2_000_000_000  # bytes: one protobuf message holds at most 2 GB


def static_model(model: Path, hints: dict[str, list[int]], workdir: Path) -> tuple[Path, list[Argument]]:
    """`model` with the hinted inputs' dynamic dims set, written into `workdir`, and the inputs
    still dynamic after it (ShapeHintError when a hint does not fit an input, saying which inputs
    there are)."""
    out = workdir / "static" / static_model_name(model, model)
    out.parent.mkdir(exist_ok=True)
    if model.suffix.lower() == ONNX_SUFFIX:
        return out, _static_onnx(model, hints, out)
    with Sandbox(workers=1) as sandbox:  # MLIR's C++ may abort on what a user gives it
        text, still_dynamic = sandbox.run(static_mlir_text, model.read_bytes(), model.name, hints,
                                          timeout=_PARSE_TIMEOUT_S)
    out.write_text(text)
    return out, still_dynamic


def static_model_name(spec: Path, model: Path) -> str:
    """What the model sized for a spec is called beside it: `enc.model.onnx` for the spec
    `enc.mlir` of an ONNX model, `enc.model.mlir` for an MLIR one."""
    return f"{spec.stem}.model{sized_suffix(model)}"


def sized_suffix(model: Path) -> str:
    """The suffix of `model` sized by hints: ONNX stays ONNX, MLIR bytecode is written back as text."""
    return ONNX_SUFFIX if model.suffix.lower() == ONNX_SUFFIX else ".mlir"


def sized_for(hints: dict[str, list[int]], sized_model: str | None = None, still_dynamic: list[str] | None = None) -> str:
    """What a spec of a model sized by `hints` matches, as its header says (service.measure.tuning_spec):
    the sized model's file, or (a REST job's model, sized on the server) how to write it; and the
    inputs the hints left open (`argN (type)`), which IREE may still size through shared dims
    but which a run of the model (`model bench`) needs sized."""
    sized = f"the model with its inputs sized {hints_shown(hints)}"
    if sized_model:
        sized = f"{sized}: {sized_model}"
    else:
        flags = " ".join(f"--shape-hint {hint}" for hint in hints_shown(hints).split())
        sized = f"{sized} (`tilesearch model size MODEL {flags}` writes it)"
    if still_dynamic:
        sized += f"; still dynamic: {', '.join(still_dynamic)} (size them too to run the model)"
    return sized


def dynamic_inputs(model: Path) -> list[Argument] | None:
    """The model's inputs with dynamic dims, as shape hints name them (None: a torch-dialect
    program, whose inputs hints cannot size; [] when the file cannot be read for them)."""
    try:
        if model.suffix.lower() == ONNX_SUFFIX:
            arguments = onnx_arguments(onnx.load(str(model), load_external_data=False).graph)
        else:
            with Sandbox(workers=1) as sandbox:
                return sandbox.run(mlir_dynamic_inputs, model.read_bytes(), timeout=_PARSE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - only for a message: IREE has already read the model, this reader may not
        return []
    return _dynamic(arguments)


def mlir_dynamic_inputs(source: bytes) -> list[Argument] | None:
    """`dynamic_inputs` of MLIR model text, in this process (a sandbox task)."""
    return _dynamic(mlir_arguments(source))


def _dynamic(arguments: list[Argument] | None) -> list[Argument] | None:
    return None if arguments is None else [a for a in arguments if a.dynamic_dims]


def hint_example(arguments: list[Argument]) -> str:
    """`--shape-hint arg0=1x512 --shape-hint arg1=...` for these inputs: 1 for each open dim."""
    return " ".join(f"--shape-hint {a.name}=" + "x".join(map(str, _sizes_or_one(a))) for a in arguments)


def input_labels(arguments: list[Argument]) -> list[str]:
    """`argN (type)` for each argument."""
    return [f"{a.name} ({a.type})" for a in arguments]


def inputs_shown(arguments: list[Argument]) -> str:
    return ", ".join(input_labels(arguments))


def mlir_arguments(source: bytes) -> list[Argument] | None:
    """The public functions' arguments of MLIR model text (None: torch dialect); a sandbox task."""
    with context():
        module = parse_module(source)
        return _arguments(module) if not _is_framework(module) else None


def static_mlir_text(source: bytes, name: str, hints: dict[str, list[int]]) -> tuple[str, list[Argument]]:
    """MLIR model text `source` (called `name`) with its public functions' hinted arguments
    given static shapes, and the arguments still dynamic (a sandbox task: bytes in, text out)."""
    with context():
        module = parse_module(source)  # its own IRError: line, column, message
        if (framework := _is_framework(module)) is not None:
            raise ShapeHintError(f"{name} is a framework's program ({framework} is torch dialect): shape "
                                 "hints size the inputs of linalg on tensors or of an ONNX graph. Give the ONNX "
                                 "export, or export the model with static shapes")
        check_shape_hints(hints, _arguments(module))
        check_hints_agree(module, hints)
        implied = implied_sizes(module, hints)
        specialize_arguments(module, hints)
        return str(module), [replace(a, implied=tuple(implied.get((a.func, a.index), {}).items()))
                             for a in _arguments(module) if a.dynamic_dims]


def _is_framework(module: ir.Module) -> str | None:
    """Where a torch-dialect op is (a framework's program), or None."""
    try:
        check_tensor_semantics(module)
    except FrontendDialectError as err:
        return err.op_where
    except IRError:
        pass  # not this step's to refuse: IREE says what it cannot compile
    return None


def _arguments(module: ir.Module) -> list[Argument]:
    """The public functions' arguments (a model's inputs), as hints name them."""
    public = {name for name, _ in public_functions(module)}
    return [a for a in function_arguments(module) if a.func in public]


def _inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The graph's inputs as iree-import-onnx makes them function arguments: initializers are
    weights, not arguments."""
    weights = {init.name for init in graph.initializer}
    return [v for v in graph.input if v.name not in weights]


def onnx_arguments(graph: onnx.GraphProto) -> list[Argument]:
    """The graph's inputs, named argN in order, their open dims shown by name (`x: FLOAT[batch,512]`)."""
    out = []
    for index, value in enumerate(_inputs(graph)):
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim]
        named = ",".join(str(d) if d is not None else (tensor.shape.dim[i].dim_param or "?") for i, d in enumerate(dims))
        dtype = onnx.TensorProto.DataType.Name(tensor.elem_type)
        out.append(Argument(f"arg{index}", index, graph.name or "main_graph", f"{value.name}: {dtype}[{named}]",
                            tuple(dims) if tensor.HasField("shape") else None))
    return out


def by_input_name(model: Path, items: list[str]) -> list[str]:
    """CLI hints as written for an ONNX model, its graph inputs' own names (`input_ids=8x128`)
    rewritten to the argN they are; argN keeps its meaning. ShapeHintError for a name that is
    neither, listing the graph's inputs."""
    if model.suffix.lower() != ONNX_SUFFIX or not items:
        return items
    try:
        inputs = {v.name: i for i, v in enumerate(_inputs(onnx.load(str(model), load_external_data=False).graph))}
    except Exception:  # noqa: BLE001 - the file's own errors come from the importer, with its reason
        return items
    out = []
    for item in items:
        name, eq, sizes = (part.strip() for part in item.partition("="))
        if not eq or split_hint_key(name):
            out.append(item)
        elif name in inputs:
            out.append(f"arg{inputs[name]}={sizes}")
        else:
            listed = ", ".join(f"{n} (arg{i})" for n, i in inputs.items()) or "none"
            raise ShapeHintError(f"shape hint {item}: {model.name} has no input {name!r}; its inputs: {listed}")
    return out


def _named_sizes(arguments: list[Argument], inputs: list[onnx.ValueInfoProto],
                 hints: dict[str, list[int]]) -> dict[str, int]:
    """The size each named open dim (`batch`, `seq`) takes from the hints; ShapeHintError when
    two hints give one name two sizes."""
    sizes: dict[str, tuple[int, str]] = {}
    for arg, value in zip(arguments, inputs):
        hint = hint_for(hints, arg.func, arg.index)
        for d, (dim, size) in enumerate(zip(value.type.tensor_type.shape.dim, hint or ())):
            if not dim.dim_param:
                continue
            first = sizes.setdefault(dim.dim_param, (size, f"dim {d} of {arg.name}"))
            if first[0] != size:
                raise ShapeHintError(f"shape hints disagree: {first[1]} and dim {d} of {arg.name} are both "
                                     f"'{dim.dim_param}' in the model, given {first[0]} and {size}; give them one size")
    return {name: size for name, (size, _) in sizes.items()}


def _static_onnx(model: Path, hints: dict[str, list[int]], out: Path) -> list[Argument]:
    try:
        proto = onnx.load(str(model))
    except Exception as err:  # noqa: BLE001 - protobuf's and onnx's own errors: the file is not ONNX
        raise ShapeHintError(f"{model.name} does not load as ONNX, so its inputs cannot be sized: {err}") from None
    arguments, inputs = onnx_arguments(proto.graph), _inputs(proto.graph)
    check_shape_hints(hints, arguments)
    named = _named_sizes(arguments, inputs, hints)
    for arg, value in zip(arguments, inputs):
        hint = hint_for(hints, arg.func, arg.index)
        for d, dim in enumerate(value.type.tensor_type.shape.dim):
            size = hint[d] if hint is not None else named.get(dim.dim_param) if dim.dim_param else None
            if size is not None:
                dim.dim_value = size  # clears a symbolic dim_param (a oneof)
    # Shapes stored for the graph's values were inferred with the dims open: the importer infers
    # them again from the sized inputs.
    del proto.graph.value_info[:]
    external = proto.ByteSize() > _PROTOBUF_LIMIT
    onnx.save(proto, str(out), save_as_external_data=external, location=_external_data(out).name if external else None)
    return [a for a in onnx_arguments(proto.graph) if a.dynamic_dims]


def _external_data(model: Path) -> Path:
    """Where a static ONNX model too large for one protobuf keeps its weights."""
    return model.with_name(model.name + ".data")


def copy_model(static: Path, out: Path) -> None:
    """The static model (and an ONNX model's external weights) copied to `out`."""
    shutil.copyfile(static, out)
    if _external_data(static).exists():
        shutil.copyfile(_external_data(static), _external_data(out))


def remove_model(out: Path) -> None:
    """An older run's sized model at `out` (and its external weights), so it is not taken for this run's."""
    out.unlink(missing_ok=True)
    _external_data(out).unlink(missing_ok=True)


def all_dynamic_message(model: str, dynamic: list[str], formed: int, inputs: list[Argument] | None,
                        hinted: bool, in_request: bool = False) -> str:
    """Why nothing in `model` (its name) can be tuned: its dispatches are dynamic; which of its
    `inputs` (those with dynamic dims; None for a torch-dialect program) to size, as the command
    line (or, `in_request`, a job request) sizes them."""
    which = (f"every dispatch IREE formed from {model} has" if len(dynamic) == formed else
             f"{len(dynamic)} of the {formed} dispatches IREE formed from {model} have")
    listed = f"{', '.join(dynamic[:3])}{', ...' if len(dynamic) > 3 else ''}"
    if inputs is None:
        what = ("it is a torch-dialect program, whose inputs shape hints cannot size: export it with static shapes, "
                "or give its ONNX export")
    elif inputs:
        example = (f'"shape_hints": {{{", ".join(f"{chr(34)}{a.name}{chr(34)}: {_sizes_or_one(a)}" for a in inputs)}}}'
                   if in_request else hint_example(inputs))
        what = (f"{'still ' if hinted else ''}dynamic: {inputs_shown(inputs)}; give them sizes, e.g. {example} "
                "(argN: the model's N-th input)")
    else:
        what = ('give the model\'s dynamic inputs their sizes with "shape_hints" {"argN": [A, B]}' if in_request else
                "give the model's dynamic inputs their sizes with --shape-hint argN=AxB") + " (argN: its N-th input)"
    return f"{which} dynamic shapes ({listed}), and nothing else tunes: {what}"


def _sizes_or_one(argument: Argument) -> list[int]:
    """An example shape: the open dims as other arguments fix them (a shared loop), else 1."""
    implied = dict(argument.implied)
    return [s or implied.get(d, 1) for d, s in enumerate(argument.shape or ())]


def hints_shown(hints: dict[str, list[int]] | None) -> str:
    return " ".join(f"{name}={'x'.join(map(str, sizes))}" for name, sizes in (hints or {}).items())
