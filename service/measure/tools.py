"""IREE's command-line tools: compile for this host's CPU, time a function, read what IREE chose.

`iree-compile` and `iree-benchmark-module` come from the same wheels as the MLIR bindings
(`tool_path`). Both run as subprocesses with time limits; a non-zero exit or a timeout is a
`ToolFailure` carrying the first error line. A caller that may be stopped (a job item being
cancelled) runs them `interruptible(check)`: the check is asked before each tool and each second
while one runs, and what it raises kills the tool's process group and propagates.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from service.ir.graph import walk_ops
from service.ir.mlir import context, ir, tool_path

from .lowering import DEFAULT_PIPELINE, translation_info_text

log = logging.getLogger(__name__)

HOST_COMPILE_FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
)
BENCH_DEVICE = "local-task"  # IREE's multi-threaded CPU device: what a model runs on
# Runs of each dispatch back to back in one timed call (timing.BenchSettings.dispatch_repeat).
DISPATCH_REPEAT = 16


def iree_version() -> str:
    return "; ".join(
        f"{p}=={importlib.metadata.version(p)}" for p in ("iree-base-compiler", "iree-base-runtime")
    )


def benchmark_threads() -> int:
    """Worker threads of IREE's local-task device here: one per physical core by default."""
    return os.cpu_count() or 1


class ToolFailure(Exception):
    """An IREE tool exited non-zero or timed out; `line` is the first error line."""

    def __init__(self, line: str):
        super().__init__(line)
        self.line = line


def first_error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if lines and any(ln.startswith("Traceback (most recent call last)") for ln in lines):
        return lines[-1]  # a Python tool (iree-import-onnx) that raised: the exception is last
    for ln in lines:
        if "error:" in ln or "ERROR" in ln or "INVALID_ARGUMENT" in ln:
            return ln
    return lines[0] if lines else "failed without a message"


StopCheck = Callable[[], None]  # raises to stop the caller's work
_stop_check: ContextVar[StopCheck | None] = ContextVar("tool_stop_check", default=None)
_POLL_S = 1.0


@contextmanager
def interruptible(check: StopCheck | None) -> Iterator[None]:
    """The IREE tools run inside this block ask `check` before they start and each second while
    they run; an exception from it kills the running tool (its whole process group) and
    propagates to the caller. None: nothing to ask."""
    token = _stop_check.set(check)
    try:
        yield
    finally:
        _stop_check.reset(token)


def run_tool(tool: str, args: Sequence[str], timeout_s: float) -> str:
    """One of IREE's tools; its stdout, or ToolFailure with the first error line it printed."""
    check = _stop_check.get()
    if check is not None:
        check()
    # A session of its own (so a process group to kill, and no controlling terminal whose job
    # control could stop it): a stop or a timeout kills whatever the tool started too. Output is
    # decoded leniently: iree-compile echoes the bytes of a binary file it was given.
    proc = subprocess.Popen([tool_path(tool), *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                stdout, stderr = proc.communicate(timeout=max(0.0, min(_POLL_S, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise ToolFailure(f"{tool} timed out after {timeout_s:g} s") from None
                if check is not None:
                    check()
    except BaseException:
        _kill_group(proc)
        raise
    if proc.returncode != 0:
        raise ToolFailure(first_error_line(stderr or stdout))
    return stdout


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()  # reaps it and closes the pipes


def compile_module(mlir_path: Path, vmfb_path: Path, configs_dir: Path, timeout_s: float,
                   dispatch_repeat: int = 1) -> None:
    """iree-compile for this host's CPU; dumps the chosen executable configurations too.
    `dispatch_repeat`: each dispatch runs that many times back to back per call (time the
    call with benchmark_module's batch_size equal to it)."""
    repeat = [f"--iree-hal-benchmark-dispatch-repeat-count={dispatch_repeat}"] if dispatch_repeat > 1 else []
    run_tool("iree-compile", [str(mlir_path), *HOST_COMPILE_FLAGS, *repeat,
                              f"--iree-hal-dump-executable-configurations-to={configs_dir}", "-o", str(vmfb_path)],
             timeout_s)


def configure_module(mlir_path: Path, configs_dir: Path, timeout_s: float) -> None:
    """iree-compile for this host's CPU up to the executable configurations (IREE's lowering
    configs chosen and dumped, no code generated): a fraction of a full compile's time."""
    run_tool("iree-compile", [str(mlir_path), *HOST_COMPILE_FLAGS, "--compile-to=executable-configurations",
                              f"--iree-hal-dump-executable-configurations-to={configs_dir}",
                              "-o", str(mlir_path.with_suffix(".configured.mlir"))],
             timeout_s)


def configure_in_process(mlir_path: Path, configs_dir: Path, timeout_s: float) -> None:
    """configure_module in this process, through IREE's compiler API (iree.compiler.api): no tool
    to start, so about a third of the time and a fifth of the CPU (docs/benchmarks.md, session
    20). For sandbox workers only: their sandbox isolates a compiler crash and bounds the time.
    When IREE cannot take the module, or this IREE's API lacks what is used here, the tool runs
    instead (and says why)."""
    from iree.compiler.api import Source

    session = _configure_session()
    if session is None:
        return configure_module(mlir_path, configs_dir, timeout_s)
    session.set_flags(f"--iree-hal-dump-executable-configurations-to={configs_dir}")
    with session.invocation() as invocation:
        _set_compile_to_phase(invocation, b"executable-configurations")
        source = Source.open_file(session, str(mlir_path))
        try:
            done = invocation.parse_source(source) and invocation.execute()  # dumps the configurations
        finally:
            source.close()
    if not done:
        shutil.rmtree(configs_dir, ignore_errors=True)  # what the failed run dumped is not the tool's answer
        configure_module(mlir_path, configs_dir, timeout_s)


def _set_compile_to_phase(invocation, phase: bytes) -> None:
    """ireeCompilerInvocationSetCompileToPhase, a C API call iree.compiler.api does not wrap."""
    from iree.compiler.api import ctypes_dl

    setter = ctypes_dl._dylib.ireeCompilerInvocationSetCompileToPhase
    setter.restype, setter.argtypes = None, [ctypes.c_void_p, ctypes.c_char_p]
    setter(invocation._inv_p, phase)


@functools.cache
def _configure_session():
    """One compiler session per process with the host flags, or None when this IREE's Python API
    lacks the handles _set_compile_to_phase uses (the tool is then used)."""
    from iree.compiler.api import Session, ctypes_dl

    session = Session()
    if not hasattr(getattr(ctypes_dl, "_dylib", None), "ireeCompilerInvocationSetCompileToPhase"):
        log.warning("iree.compiler.api cannot set a compile-to phase here: configuring with iree-compile")
        return None
    with session.invocation() as probe:
        if not hasattr(probe, "_inv_p"):
            return None
    session.set_flags(*HOST_COMPILE_FLAGS)
    return session


def _dumped_attributes(configs_dir: Path, name: str) -> list[str]:
    """The `name` attributes of the ops in IREE's executable-configuration dumps, in file and
    op order, as MLIR prints them (the dumps are parsed with the real MLIR parser)."""
    found: list[str] = []
    with context():
        for path in sorted(configs_dir.glob("*.mlir")):
            module = ir.Module.parse(path.read_text())
            found.extend(str(op.attributes[name]) for op in walk_ops(module.operation) if name in op.attributes)
    return found


def chosen_lowering_configs(configs_dir: Path) -> list[str]:
    """The lowering configs IREE put on the ops of its dispatches."""
    return _dumped_attributes(configs_dir, "lowering_config")


def chosen_translation_infos(configs_dir: Path) -> list[str]:
    """The translation_info attributes IREE gave the dispatch functions."""
    return _dumped_attributes(configs_dir, "translation_info")


# A static matmul: what IREE's CPU default chooses for it shows the pipeline options it uses on
# this host. On x86 without AVX-512 it turns on loop peeling (remainders peeled, not masked); a
# forced config without it compiles masked vectors, much slower than IREE's default at IREE's
# own tile sizes (measured: docs/benchmarks.md).
_PROBE_MATMUL = """
func.func @probe(%a: tensor<64x64xf32>, %b: tensor<64x64xf32>, %c: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %r = linalg.matmul ins(%a, %b : tensor<64x64xf32>, tensor<64x64xf32>) outs(%c : tensor<64x64xf32>) -> tensor<64x64xf32>
  return %r : tensor<64x64xf32>
}
"""


@functools.cache
def host_translation_info() -> str:
    """The translation_info IREE's own CPU config gives a matmul on this host (pipeline and
    options, e.g. `{enable_loop_peeling}` on AVX2), from one probe configured (not compiled to
    code) per process; the plain DoubleTilingExpert one when the probe fails or IREE picks another
    pipeline (a forced config is a DoubleTilingExpert config)."""
    plain = translation_info_text()
    with tempfile.TemporaryDirectory(prefix="tilesearch-probe-") as tmp:
        workdir = Path(tmp)
        (workdir / "probe.mlir").write_text(_PROBE_MATMUL)
        try:
            configure_module(workdir / "probe.mlir", workdir / "configs", 120.0)
            chosen = chosen_translation_infos(workdir / "configs")
        except (ToolFailure, OSError, ir.MLIRError) as err:
            log.warning("IREE's pipeline options on this host are unknown (%s); forcing %s", err, plain)
            return plain
    ours = [t for t in chosen if f"#iree_cpu.pipeline<{DEFAULT_PIPELINE}>" in t]
    return ours[0] if ours else plain


@dataclass(frozen=True)
class BenchSamples:
    real_s: list[float]  # wall time per call, one per repetition (mean over its runs)
    cpu_s: list[float]  # process CPU time per call (all threads), same repetitions


def benchmark_module(
    vmfb_path: Path,
    function: str,
    input_flags: Sequence[str],
    *,
    repetitions: int,
    min_time_s: float,
    timeout_s: float,
    device: str = BENCH_DEVICE,
    batch_size: int = 1,
) -> BenchSamples:
    """Seconds per call, one sample per repetition (each the mean over that repetition's runs).
    `batch_size`: a call runs each dispatch that many times (compile_module's dispatch_repeat);
    the times are per dispatch run, as iree-benchmark-module divides by it."""
    stdout = run_tool("iree-benchmark-module", [
        f"--module={vmfb_path}",
        f"--device={device}",
        f"--function={function}",
        *input_flags,
        *([f"--batch_size={batch_size}"] if batch_size > 1 else []),
        f"--benchmark_repetitions={repetitions}",
        f"--benchmark_min_time={min_time_s:g}s",
        "--benchmark_format=json",
    ], timeout_s)
    try:
        report = json.loads(stdout)
    except json.JSONDecodeError:
        raise ToolFailure("iree-benchmark-module printed no JSON report") from None
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    runs = [b for b in report.get("benchmarks", []) if b.get("run_type") == "iteration"]
    if not runs:
        raise ToolFailure("iree-benchmark-module reported no iterations")
    return BenchSamples(
        real_s=[b["real_time"] * scale[b["time_unit"]] for b in runs],
        cpu_s=[b["cpu_time"] * scale[b["time_unit"]] for b in runs],
    )
