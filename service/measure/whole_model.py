"""A whole model through IREE on this CPU: its dispatches, its compiled configurations, its time.

IREE itself forms the dispatches (`--compile-to=executable-sources`), so what is tuned is what
IREE will compile. A tuning spec reaches the model through
`--iree-codegen-tuning-spec-path`, and `--iree-hal-dump-executable-configurations-to` shows what
each dispatch's ops were given: both builds of a model are read back with MLIR to prove a spec
was applied, and timed in interleaved rounds with iree-benchmark-module.
"""

from __future__ import annotations

import math
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from service.ir.graph import walk_ops
from service.ir.mlir import context, ir
from service.ir.specialize import is_public

from .forcing import ArgumentSpec, write_inputs
from .rounds import round_order
from .tools import BENCH_DEVICE, HOST_COMPILE_FLAGS, ToolFailure, benchmark_module, run_tool
from .tuning_spec import spec_compile_flags

_STRUCTURED_PREFIX = "linalg."


def iree_input(model: Path, workdir: Path, timeout_s: float = 300.0) -> Path:
    """The model as a file iree-compile takes: an ONNX model (.onnx) imported to MLIR's torch
    dialect by IREE's own iree-import-onnx (into `workdir`, under the model's own name, which
    iree-compile's messages then show); anything else as it is. Raises ToolFailure with the
    importer's reason when it refuses the file."""
    if model.suffix.lower() != ".onnx":
        return model
    out = workdir / "imported" / model.name
    out.parent.mkdir(exist_ok=True)
    run_tool("iree-import-onnx", [str(model), "-o", str(out)], timeout_s)
    return out


# Constants above this many elements are left out of the IR read back for its structure:
# inline (`dense<"0x...">`, as ONNX initializers import) they print as `dense_resource<__elided__>`,
# and resource blobs (`dense_resource<key>`, as iree-turbine exports weights) of as many f32 in
# hex are not printed. A model's weights (DistilBERT's 150 MB) took MLIR's Python bindings 87 s
# and 22 GB to parse, for nothing the structure needs. IREE inlines into a dispatch only
# constants far below it (256 bytes by default), so a dispatch keeps its own.
ELIDED_CONSTANT_ELEMENTS = 1 << 16
_STRUCTURE_ONLY = (f"--mlir-elide-elementsattrs-if-larger={ELIDED_CONSTANT_ELEMENTS}",
                   f"--mlir-elide-resource-strings-if-larger={8 * ELIDED_CONSTANT_ELEMENTS}")


def executable_sources(model: Path, out: Path, timeout_s: float = 300.0, flow_out: Path | None = None) -> str:
    """The model's host program and one hal.executable per unique dispatch, as IREE forms them
    for this CPU (any input IREE takes: linalg, torch, ...); large constants elided. `flow_out`:
    also write there the same compile's flow-level program (IREE's dump of that phase), where the
    model's loops are still scf.for (`service.ir.dispatch.dispatches_of`)."""
    phases = out.parent / f"{out.stem}.phases"
    dump = [f"--dump-compilation-phases-to={phases}"] if flow_out is not None else []
    run_tool("iree-compile", [str(model), *HOST_COMPILE_FLAGS, "--compile-to=executable-sources", *_STRUCTURE_ONLY,
                              *dump, "-o", str(out)], timeout_s)
    if flow_out is not None:
        (flow,) = phases.glob("*.flow.mlir")
        flow.replace(flow_out)
        shutil.rmtree(phases)
    return out.read_text()


def input_program(model: Path, out: Path, timeout_s: float = 300.0) -> str:
    """The model lowered to IREE's input form (linalg on tensors behind `hal.tensor.import`),
    large constants elided: for its entry function and arguments, not to compile."""
    run_tool("iree-compile", [str(model), "--compile-to=input", *_STRUCTURE_ONLY, "-o", str(out)], timeout_s)
    return out.read_text()


def compile_model(model: Path, vmfb: Path, configs_dir: Path, spec: Path | None = None,
                  timeout_s: float = 600.0) -> None:
    args = [str(model), *HOST_COMPILE_FLAGS, f"--iree-hal-dump-executable-configurations-to={configs_dir}", "-o", str(vmfb)]
    if spec is not None:
        args += spec_compile_flags(spec)
    run_tool("iree-compile", args, timeout_s)


def _walk(op: ir.Operation, keep) -> list[ir.Operation]:
    return [o for o in walk_ops(op) if keep(o)]


@dataclass(frozen=True)
class DispatchConfig:
    """The structured ops of one dispatch function in program order, with the lowering config
    IREE gave each (printed by MLIR; None where it gave none)."""

    entry: str
    ops: tuple[tuple[str, str | None], ...]
    translation_info: str | None = None  # the function's: IREE's pipeline (and its options) for it


def dispatch_configs(configs_dir: Path) -> dict[str, DispatchConfig]:
    """Per dispatch function (by symbol), what IREE's configuration dumps say it compiled."""
    out: dict[str, DispatchConfig] = {}
    with context():
        for path in sorted(configs_dir.glob("*.mlir")):
            module = ir.Module.parse(path.read_text())
            for function in _walk(module.operation, lambda o: o.name == "func.func"):
                entry = ir.StringAttr(function.attributes["sym_name"]).value
                ops = tuple(
                    (o.name, str(o.attributes["lowering_config"]) if "lowering_config" in o.attributes else None)
                    for o in _walk(function, lambda o: o.name.startswith(_STRUCTURED_PREFIX) and o.name != "linalg.yield")
                )
                translation = function.attributes["translation_info"] if "translation_info" in function.attributes else None
                out[entry] = DispatchConfig(entry, ops, None if translation is None else str(translation))
    return out


def configs_not_applied(module: Path, spec: Path, lowering_configs: list[str], workdir: Path,
                        timeout_s: float = 300.0) -> list[str]:
    """Of the lowering configs a spec gives, those no op of `module` got when IREE configured it
    with the spec (empty: IREE applied them all). A matcher checks the op as IREE forms it, which
    can differ from the module's (IREE collapses a contraction's contiguous reduction dims)."""
    configs_dir = workdir / "spec_configs"
    run_tool("iree-compile", [str(module), *HOST_COMPILE_FLAGS, "--compile-to=executable-configurations",
                              *spec_compile_flags(spec), f"--iree-hal-dump-executable-configurations-to={configs_dir}",
                              "-o", str(workdir / "configured.mlir")], timeout_s)
    got = {config for d in dispatch_configs(configs_dir).values() for _, config in d.ops if config}
    return [c for c in lowering_configs if canonical_attribute(c) not in got]


def canonical_attribute(text: str) -> str:
    """An attribute as MLIR prints it, to compare with what IREE's dumps print."""
    with context():
        return str(ir.Attribute.parse(text))


def _symbol(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def entry_function(input_text: str) -> str:
    """The function a model is run by: its one public function (`@main` among several). A model
    exported by iree-turbine calls it `main`; one written by hand names it as it likes."""
    with context():
        module = ir.Module.parse(input_text)
        public = [_symbol(f) for f in _walk(module.operation, lambda o: o.name in ("util.func", "func.func"))
                  if is_public(f)]
    names = [n for n in public if not n.endswith("$async")]
    if len(names) == 1:
        return names[0]
    if "main" in names:
        return "main"
    raise ToolFailure(f"the model has {len(names)} public functions ({', '.join('@' + n for n in names) or 'none'}): "
                      "name the one to run (--function)")


def model_arguments(input_text: str, function: str = "main") -> list[ArgumentSpec]:
    """The tensors `function` takes, in order: its tensor arguments, or, behind IREE's ABI
    (`@main` calling `@main$async` on buffer views), the types its `hal.tensor.import`s give them."""
    with context():
        module = ir.Module.parse(input_text)
        functions = {_symbol(f): f for f in _walk(module.operation, lambda o: o.name in ("util.func", "func.func"))}
        for name in (f"{function}$async", function):
            if name not in functions:
                continue
            body = functions[name].regions[0].blocks[0]
            imports = _walk(functions[name], lambda o: o.name == "hal.tensor.import")
            if imports:
                index = {a: i for i, a in enumerate(body.arguments)}
                by_argument = {index[o.operands[0]]: o.results[0].type for o in imports if o.operands[0] in index}
                types = [by_argument[i] for i in sorted(by_argument)]
            else:
                types = [a.type for a in body.arguments]
            return [_static_tensor(t, i, function) for i, t in enumerate(types)]
        raise ToolFailure(f"the model has no function @{function}")


def _static_tensor(t: ir.Type, i: int, function: str) -> ArgumentSpec:
    t = t.maybe_downcast() if hasattr(t, "maybe_downcast") else t
    if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
        raise ToolFailure(f"argument {i} of @{function} is {t}, not a static tensor: export the model with static shapes, "
                          f"or give it sizes (`tilesearch model size MODEL --shape-hint arg{i}=...` writes the model so sized; "
                          "`model tune --shape-hint` writes it beside its spec)")
    return ArgumentSpec(tuple(t.shape), str(t.element_type))


@dataclass
class ModelTiming:
    """Both builds' wall times per call, in round order; `rounds`: (IREE's default, the spec's)
    per alternating round, each the median of that round's repetitions."""

    default_s: list[float] = field(default_factory=list)
    tuned_s: list[float] = field(default_factory=list)
    rounds: list[tuple[float, float]] = field(default_factory=list)

    @property
    def default_median_s(self) -> float:
        return statistics.median(self.default_s)

    @property
    def tuned_median_s(self) -> float:
        return statistics.median(self.tuned_s)

    @property
    def speedup(self) -> float:
        return self.default_median_s / self.tuned_median_s

    @property
    def tuned_faster_rounds(self) -> int:
        return sum(1 for default, tuned in self.rounds if tuned < default)

    @property
    def sign_test_p(self) -> float:
        """One-sided sign test over the rounds: the chance that the spec's build wins at least
        this many of them when the two builds are equally fast (each round a coin toss). Rounds
        pair builds timed back to back, under the same load; medians alone do not say whether
        a gain of a few percent is the machine's noise."""
        return _at_least(self.tuned_faster_rounds, len(self.rounds))

    @property
    def default_faster_p(self) -> float:
        """The same test the other way: the chance that IREE's default build wins at least as
        many rounds as it did when the two builds are equally fast."""
        return _at_least(sum(1 for default, tuned in self.rounds if default < tuned), len(self.rounds))


def _at_least(wins: int, n: int) -> float:
    """The chance of at least `wins` heads in `n` fair coin tosses."""
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


def time_models(default_vmfb: Path, tuned_vmfb: Path, input_flags: list[str], *, function: str = "main",
                rounds: int = 5, repetitions: int = 3, min_time_s: float = 0.2, timeout_s: float = 300.0) -> ModelTiming:
    """Wall time per call of both builds, in rounds timing both back to back so that load from
    other processes hits both alike, each first in every other round (`round_order`)."""
    timing = ModelTiming()
    builds = ((default_vmfb, timing.default_s), (tuned_vmfb, timing.tuned_s))
    for r in range(rounds):
        medians = [0.0, 0.0]
        for i in round_order(2, r):
            vmfb, samples = builds[i]
            got = benchmark_module(vmfb, function, input_flags, repetitions=repetitions,
                                   min_time_s=min_time_s, timeout_s=timeout_s)
            samples.extend(got.real_s)
            medians[i] = statistics.median(got.real_s)
        timing.rounds.append((medians[0], medians[1]))
    return timing


def run_outputs(vmfb: Path, input_flags: list[str], out_dir: Path, n_outputs: int, function: str = "main",
                timeout_s: float = 300.0) -> list[Path]:
    """Run the model once with iree-run-module, writing each output to a .npy file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = [out_dir / f"out{i}.npy" for i in range(n_outputs)]
    run_tool("iree-run-module", [f"--module={vmfb}", f"--device={BENCH_DEVICE}", f"--function={function}",
                                 *input_flags, *(f"--output=@{p}" for p in outputs)], timeout_s)
    return outputs


__all__ = [
    "DispatchConfig",
    "ModelTiming",
    "canonical_attribute",
    "compile_model",
    "dispatch_configs",
    "entry_function",
    "executable_sources",
    "input_program",
    "model_arguments",
    "run_outputs",
    "time_models",
    "write_inputs",
]
