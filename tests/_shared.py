"""Where the shared inputs live: ../shared beside the repo (CI clones it there too)."""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.hardware.model import HardwareModel
from service.hardware.profiles import detect_host_cpu
from service.search import guard
from service.search import engine

SHARED = Path(os.environ.get("TILESEARCH_SHARED_DIR", Path(__file__).resolve().parents[2] / "shared"))
WORKLOADS = SHARED / "workloads"
CORPUS = SHARED / "corpus" / "upstream-mlir"


def workload(name: str) -> str:
    return (WORKLOADS / f"{name}.mlir").read_text()


# A transformer head merge: transpose -> collapse_shape -> matmul (uids: 0 transpose, 1 fill,
# 2 matmul). Fusing the transpose into the matmul's tiles goes through the collapse_shape.
HEAD_MERGE = """
func.func @f(%x: tensor<12x128x64xf32>, %w: tensor<768x768xf32>) -> tensor<128x768xf32> {
  %zero = arith.constant 0.0 : f32
  %te = tensor.empty() : tensor<128x12x64xf32>
  %t = linalg.transpose ins(%x : tensor<12x128x64xf32>) outs(%te : tensor<128x12x64xf32>) permutation = [1, 0, 2]
  %c = tensor.collapse_shape %t [[0], [1, 2]] : tensor<128x12x64xf32> into tensor<128x768xf32>
  %e = tensor.empty() : tensor<128x768xf32>
  %a = linalg.fill ins(%zero : f32) outs(%e : tensor<128x768xf32>) -> tensor<128x768xf32>
  %m = linalg.matmul ins(%c, %w : tensor<128x768xf32>, tensor<768x768xf32>) outs(%a : tensor<128x768xf32>) -> tensor<128x768xf32>
  return %m : tensor<128x768xf32>
}"""


# Two conv + bias + relu layers with a residual add, each conv initialised by its own fill.
RESNET_BLOCK = """#id4 = affine_map<(n, h, w, c) -> (n, h, w, c)>
#ch4 = affine_map<(n, h, w, c) -> (c)>
func.func @resnet_block_2fills(%x: tensor<1x56x56x64xf32>, %w1: tensor<3x3x64x64xf32>, %b1: tensor<64xf32>,
                        %w2: tensor<3x3x64x64xf32>, %b2: tensor<64xf32>) -> tensor<1x56x56x64xf32> {
  %zero = arith.constant 0.0 : f32
  %p1 = tensor.pad %x low[0, 1, 1, 0] high[0, 1, 1, 0] {
  ^bb0(%i: index, %j: index, %k: index, %l: index):
    tensor.yield %zero : f32
  } : tensor<1x56x56x64xf32> to tensor<1x58x58x64xf32>
  %e = tensor.empty() : tensor<1x56x56x64xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<1x56x56x64xf32>) -> tensor<1x56x56x64xf32>
  %c1 = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%p1, %w1 : tensor<1x58x58x64xf32>, tensor<3x3x64x64xf32>) outs(%f : tensor<1x56x56x64xf32>) -> tensor<1x56x56x64xf32>
  %r1 = linalg.generic {indexing_maps = [#id4, #ch4, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%c1, %b1 : tensor<1x56x56x64xf32>, tensor<64xf32>) outs(%e : tensor<1x56x56x64xf32>) {
  ^bb0(%v: f32, %b: f32, %o: f32):
    %a = arith.addf %v, %b : f32
    %r = arith.maximumf %a, %zero : f32
    linalg.yield %r : f32
  } -> tensor<1x56x56x64xf32>
  %p2 = tensor.pad %r1 low[0, 1, 1, 0] high[0, 1, 1, 0] {
  ^bb0(%i: index, %j: index, %k: index, %l: index):
    tensor.yield %zero : f32
  } : tensor<1x56x56x64xf32> to tensor<1x58x58x64xf32>
  %e2 = tensor.empty() : tensor<1x56x56x64xf32>
  %f2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<1x56x56x64xf32>) -> tensor<1x56x56x64xf32>
  %c2 = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%p2, %w2 : tensor<1x58x58x64xf32>, tensor<3x3x64x64xf32>) outs(%f2 : tensor<1x56x56x64xf32>) -> tensor<1x56x56x64xf32>
  %r2 = linalg.generic {indexing_maps = [#id4, #ch4, #id4, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%c2, %b2, %x : tensor<1x56x56x64xf32>, tensor<64xf32>, tensor<1x56x56x64xf32>) outs(%e : tensor<1x56x56x64xf32>) {
  ^bb0(%v: f32, %b: f32, %res: f32, %o: f32):
    %a = arith.addf %v, %b : f32
    %a2 = arith.addf %a, %res : f32
    %r = arith.maximumf %a2, %zero : f32
    linalg.yield %r : f32
  } -> tensor<1x56x56x64xf32>
  return %r2 : tensor<1x56x56x64xf32>
}
"""


# One broadcast bias initialising both convs: the super-tiling baseline's plan (the whole block
# fused into one scf.for) segfaults MLIR on it. A fill shared the same way did too, until shared
# fills were given a copy per reader.
RESNET_SHARED_BIAS_INIT = RESNET_BLOCK.replace("outs(%f2 :", "outs(%f :").replace(
    "%f = linalg.fill ins(%zero : f32) outs(%e : tensor<1x56x56x64xf32>) -> tensor<1x56x56x64xf32>",
    "%f = linalg.broadcast ins(%b1 : tensor<64xf32>) outs(%e : tensor<1x56x56x64xf32>) dimensions = [0, 1, 2]")


# A 1024^3 matmul (group g1) and a row sum over its result (group g3).
MATMUL_THEN_ROW_SUM = """
func.func @f(%a: tensor<1024x1024xf32>, %b: tensor<1024x1024xf32>) -> tensor<1024xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1024x1024xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
  %mm = linalg.matmul ins(%a, %b : tensor<1024x1024xf32>, tensor<1024x1024xf32>) outs(%acc : tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
  %er = tensor.empty() : tensor<1024xf32>
  %z = linalg.fill ins(%zero : f32) outs(%er : tensor<1024xf32>) -> tensor<1024xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]}
      ins(%mm : tensor<1024x1024xf32>) outs(%z : tensor<1024xf32>) {
  ^bb0(%v: f32, %o: f32):
    %r = arith.addf %v, %o : f32
    linalg.yield %r : f32
  } -> tensor<1024xf32>
  return %s : tensor<1024xf32>
}"""


# Two stacked 256x1024x1024 matmuls (an MLP without activations): two contractions.
TWO_STACKED_MATMULS = """
func.func @mlp2(%x: tensor<256x1024xf32>, %w0: tensor<1024x1024xf32>, %w1: tensor<1024x1024xf32>) -> tensor<256x1024xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<256x1024xf32>
  %a0 = linalg.fill ins(%zero : f32) outs(%e : tensor<256x1024xf32>) -> tensor<256x1024xf32>
  %m0 = linalg.matmul ins(%x, %w0 : tensor<256x1024xf32>, tensor<1024x1024xf32>) outs(%a0 : tensor<256x1024xf32>) -> tensor<256x1024xf32>
  %a1 = linalg.fill ins(%zero : f32) outs(%e : tensor<256x1024xf32>) -> tensor<256x1024xf32>
  %m1 = linalg.matmul ins(%m0, %w1 : tensor<256x1024xf32>, tensor<1024x1024xf32>) outs(%a1 : tensor<256x1024xf32>) -> tensor<256x1024xf32>
  return %m1 : tensor<256x1024xf32>
}"""

# A 64x64x64 matmul: small enough for IREE to compile and time in about a second.
TINY_MATMUL = """
func.func @mm(%a: tensor<64x64xf32>, %b: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<64x64xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<64x64xf32>) -> tensor<64x64xf32>
  %mm = linalg.matmul ins(%a, %b : tensor<64x64xf32>, tensor<64x64xf32>)
                      outs(%acc : tensor<64x64xf32>) -> tensor<64x64xf32>
  return %mm : tensor<64x64xf32>
}
"""


def write_cpu_sysfs(root: Path, caches: list[tuple[int, str, str, str, str | None]], cpuinfo: str) -> tuple[Path, Path]:
    """A fake /sys/devices/system/cpu/cpu0 and /proc/cpuinfo under root, for detect_host_cpu:
    caches are (level, type, size, shared_cpu_list, ways or None), lines of 64 B."""
    cache = root / "cpu0" / "cache"
    for i, (level, kind, size, shared, ways) in enumerate(caches):
        d = cache / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
        (d / "shared_cpu_list").write_text(shared + "\n")
        (d / "coherency_line_size").write_text("64\n")
        if ways is not None:  # some sysfs lack it: the level then has no set-conflict term
            (d / "ways_of_associativity").write_text(ways + "\n")
    (root / "cpuinfo").write_text(cpuinfo)
    return root / "cpu0", root / "cpuinfo"


# The host the tests' expectations were measured on and last passed on (session 6's Intel Xeon:
# Sapphire Rapids class, AVX-512, L1d 48 KiB / 12 ways, L2 2 MiB, L3 shared), pinned as the
# tests' `host-cpu` so that a CI machine with other caches or vectors checks the same model.
REFERENCE_HOST_CACHES = [
    (1, "Data", "48K", "0", "12"),
    (1, "Instruction", "32K", "0", "8"),
    (2, "Unified", "2048K", "0", "16"),
    (3, "Unified", "307200K", "0-1", "15"),
]
REFERENCE_HOST_CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse sse2 avx avx2 fma avx512f\n"


@functools.cache
def reference_host() -> HardwareModel:
    """The reference host's profile (AVX-512, the caches above, 2 cores): what conftest pins
    `host-cpu` to, and what the register-tile tests price on whatever machine runs them."""
    with tempfile.TemporaryDirectory(prefix="tilesearch-reference-host-") as tmp:
        return detect_host_cpu(*write_cpu_sysfs(Path(tmp), REFERENCE_HOST_CACHES, REFERENCE_HOST_CPUINFO), cores=2)


# Session 8's machine: an AMD EPYC, Zen 3 (family 25, model 1), AVX2 with 16 ymm registers,
# L1d 32 KiB / 8 ways, L2 512 KiB, L3 32 MiB shared. The spilling-register-tile terms of the
# cost model were measured on it.
ZEN3_HOST_CACHES = [
    (1, "Data", "32K", "0", "8"),
    (1, "Instruction", "32K", "0", "8"),
    (2, "Unified", "512K", "0", "8"),
    (3, "Unified", "32768K", "0-1", "16"),
]
ZEN3_HOST_CPUINFO = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
                     "flags\t\t: fpu sse sse2 avx avx2 fma\n")

@contextlib.contextmanager
def tuning_every_dispatch() -> Iterator[None]:
    """For tests of the whole-model pipeline (spec, proof, numerics, store), not of its caution:
    the search answers with its best predicted plan and the guard ships it, so a small model
    whose matmuls IREE's default already serves well still has dispatches to tune."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "KEEP_START_MARGIN", 0.0)
        mp.setattr(guard, "PREDICTED_MARGIN", -1.0)
        yield


# Plans a search of mlp_chain needs on the reference host before it finds one the guard ships
# over IREE's default (at 16 it keeps IREE's): tests that need a decision that tiles use it.
MLP_CHAIN_BUDGET = 32


def matmul_module(layout: str, m: int = 128, n: int = 768, k: int = 3072) -> str:
    """An f32 matmul with B stored [k, n] ("kn") or [n, k] ("nk", nn.Linear's weight layout)."""
    b_t, b_map = ((f"tensor<{k}x{n}xf32>", "affine_map<(d0, d1, d2) -> (d2, d1)>") if layout == "kn"
                  else (f"tensor<{n}x{k}xf32>", "affine_map<(d0, d1, d2) -> (d1, d2)>"))
    return f"""
func.func @f(%a: tensor<{m}x{k}xf32>, %b: {b_t}) -> tensor<{m}x{n}xf32> {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{m}x{n}xf32>
  %c = linalg.fill ins(%z : f32) outs(%e : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  %r = linalg.matmul indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, {b_map}, affine_map<(d0, d1, d2) -> (d0, d1)>]
       ins(%a, %b : tensor<{m}x{k}xf32>, {b_t}) outs(%c : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  return %r : tensor<{m}x{n}xf32>
}}"""



# A 100^3 matmul: no tile of IREE's default divides 100, and plans the search finds at any budget
# are predicted well ahead of it, so its decision tiles and has a tuning spec (on the reference
# host a 1024^2 matmul, say, is left to IREE's own config: service.search.guard).
MATMUL_100 = matmul_module("kn", 100, 100, 100)


def nchw_conv_module(batch: int, c_in: int = 16, c_out: int = 32, size: int = 16, compilation_info: str | None = None,
                     kernel: int = 3) -> str:
    """A `kernel` x `kernel` (3x3) `linalg.conv_2d_nchw_fchw` as torch exports it, `compilation_info`
    forced on it if given."""
    x, y, w = (f"tensor<{batch}x{c_in}x{size + kernel - 1}x{size + kernel - 1}xf32>",
               f"tensor<{batch}x{c_out}x{size}x{size}xf32>", f"tensor<{c_out}x{c_in}x{kernel}x{kernel}xf32>")
    forced = f"compilation_info = {compilation_info}, " if compilation_info else ""
    return f"""
func.func @main(%x: {x}, %w: {w}) -> {y} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {y}
  %c = linalg.fill ins(%z : f32) outs(%e : {y}) -> {y}
  %r = linalg.conv_2d_nchw_fchw {{{forced}dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}}
       ins(%x, %w : {x}, {w}) outs(%c : {y}) -> {y}
  return %r : {y}
}}"""

def nchw_1x1_module(c_in: int, c_out: int, size: int, stride: int = 1) -> str:
    """A 1x1 `linalg.conv_2d_nchw_fchw` at batch 1 on a size x size image (ResNet's downsample
    projection at stride 2), which IREE forms as a matmul_like dispatch."""
    out = size // stride
    x, w, y = (f"tensor<1x{c_in}x{size}x{size}xf32>", f"tensor<{c_out}x{c_in}x1x1xf32>", f"tensor<1x{c_out}x{out}x{out}xf32>")
    return f"""
func.func @main(%x: {x}, %w: {w}) -> {y} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {y}
  %c = linalg.fill ins(%z : f32) outs(%e : {y}) -> {y}
  %r = linalg.conv_2d_nchw_fchw {{dilations = dense<1> : tensor<2xi64>, strides = dense<{stride}> : tensor<2xi64>}}
       ins(%x, %w : {x}, {w}) outs(%c : {y}) -> {y}
  return %r : {y}
}}"""


def pointwise_then_depthwise_module(c_in: int = 64, c_out: int = 256, size: int = 14) -> str:
    """MobileNet's expand-then-depthwise at batch 1, NCHW: a 1x1 convolution and ReLU whose output
    is padded for a 3x3 depthwise convolution. IREE keeps the 1x1's pixel dims apart
    (matmul_like_{c_out}x{size}x{size}x{c_in}: out[co, h, w] = W[co, ci] x X[ci, h, w])."""
    x, w, y = f"tensor<1x{c_in}x{size}x{size}xf32>", f"tensor<{c_out}x{c_in}x1x1xf32>", f"tensor<1x{c_out}x{size}x{size}xf32>"
    padded = f"tensor<1x{c_out}x{size + 2}x{size + 2}xf32>"
    return f"""
#id = affine_map<(n, c, h, w) -> (n, c, h, w)>
func.func @main(%x: {x}, %w: {w}, %dw: tensor<{c_out}x3x3xf32>) -> {y} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {y}
  %f = linalg.fill ins(%z : f32) outs(%e : {y}) -> {y}
  %c = linalg.conv_2d_nchw_fchw {{dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}}
       ins(%x, %w : {x}, {w}) outs(%f : {y}) -> {y}
  %r = linalg.generic {{indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%c : {y}) outs(%e : {y}) {{
  ^bb0(%v: f32, %o: f32):
    %m = arith.maximumf %v, %z : f32
    linalg.yield %m : f32
  }} -> {y}
  %p = tensor.pad %r low[0, 0, 1, 1] high[0, 0, 1, 1] {{
  ^bb0(%i: index, %j: index, %k: index, %l: index):
    tensor.yield %z : f32
  }} : {y} to {padded}
  %d = linalg.depthwise_conv_2d_nchw_chw {{dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}}
       ins(%p, %dw : {padded}, tensor<{c_out}x3x3xf32>) outs(%f : {y}) -> {y}
  return %d : {y}
}}"""


def _multiply_add(result_type: str) -> str:
    """A contraction generic's region (a x b added to the accumulator), its end and the return."""
    return f"""    ^bb0(%a: f32, %b: f32, %acc: f32):
      %m = arith.mulf %a, %b : f32
      %s = arith.addf %acc, %m : f32
      linalg.yield %s : f32
  }} -> {result_type}
  return %c : {result_type}
}}"""


def nchw_1x1_generic(c_in: int, c_out: int, out: int, stride: int | None = None) -> str:
    """That convolution as IREE's dispatch computes it, out[co, h, w] = W[co, ci] x X[ci, h, w]
    on an out x out output. With `stride`, X is what service.ir.dispatch writes for a load that
    steps over elements: a strided slice of the whole input."""
    x = f"tensor<{c_in}x{out}x{out}xf32>"
    if stride is None:
        arg, slice_ = f"%x: {x}", ""
    else:
        whole = f"tensor<{c_in}x{out * stride}x{out * stride}xf32>"
        arg = f"%input: {whole}"
        slice_ = (f"  %x = tensor.extract_slice %input[0, 0, 0] [{c_in}, {out}, {out}] [1, {stride}, {stride}]"
                  f" : {whole} to {x}\n")
    y, w = f"tensor<{c_out}x{out}x{out}xf32>", f"tensor<{c_out}x{c_in}xf32>"
    return f"""
#x = affine_map<(co, h, w, ci) -> (ci, h, w)>
#w = affine_map<(co, h, w, ci) -> (co, ci)>
#o = affine_map<(co, h, w, ci) -> (co, h, w)>
func.func @conv1x1({arg}, %wt: {w}) -> {y} {{
  %zero = arith.constant 0.0 : f32
{slice_}  %e = tensor.empty() : {y}
  %f = linalg.fill ins(%zero : f32) outs(%e : {y}) -> {y}
  %c = linalg.generic {{indexing_maps = [#x, #w, #o], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}}
      ins(%x, %wt : {x}, {w}) outs(%f : {y}) {{
{_multiply_add(y)}"""


def nhwc_depthwise_module(batch: int, size: int = 16, channels: int = 32) -> str:
    """A 3x3 `linalg.depthwise_conv_2d_nhwc_hwc` (MobileNet's), input pre-padded."""
    x, w, y = (f"tensor<{batch}x{size + 2}x{size + 2}x{channels}xf32>", f"tensor<3x3x{channels}xf32>",
               f"tensor<{batch}x{size}x{size}x{channels}xf32>")
    return f"""
func.func @dw(%x: {x}, %w: {w}) -> {y} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {y}
  %c = linalg.fill ins(%z : f32) outs(%e : {y}) -> {y}
  %r = linalg.depthwise_conv_2d_nhwc_hwc {{dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}}
       ins(%x, %w : {x}, {w}) outs(%c : {y}) -> {y}
  return %r : {y}
}}"""


def nchw_max_pool_module(batch: int, channels: int = 16, size: int = 16) -> str:
    """A 3x3 `linalg.pooling_nchw_max`: a convolution to MLIR, with a window and no filter."""
    x, y = f"tensor<{batch}x{channels}x{size + 2}x{size + 2}xf32>", f"tensor<{batch}x{channels}x{size}x{size}xf32>"
    return f"""
func.func @main(%x: {x}) -> {y} {{
  %low = arith.constant -3.4e38 : f32
  %e = tensor.empty() : {y}
  %c = linalg.fill ins(%low : f32) outs(%e : {y}) -> {y}
  %k = tensor.empty() : tensor<3x3xf32>
  %r = linalg.pooling_nchw_max {{dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}}
       ins(%x, %k : {x}, tensor<3x3xf32>) outs(%c : {y}) -> {y}
  return %r : {y}
}}"""

# A small matmul with three distinct dims IREE compiles in a second or two, for the tests that
# store real IREE measurements.
MATMUL_64X96X80 = """
func.func @mm(%a: tensor<64x96xf32>, %b: tensor<96x80xf32>) -> tensor<64x80xf32> {
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<64x80xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<64x80xf32>) -> tensor<64x80xf32>
  %r = linalg.matmul ins(%a, %b : tensor<64x96xf32>, tensor<96x80xf32>) outs(%acc : tensor<64x80xf32>) -> tensor<64x80xf32>
  return %r : tensor<64x80xf32>
}
"""

needs_avx512 = pytest.mark.skipif("avx512f" not in Path("/proc/cpuinfo").read_text(),
                                  reason="host-cpu is pinned to an AVX-512 reference host; IREE compiles for this CPU")


def first_input_vectors_matmul(m: int, n: int, k: int, image_first: bool = True) -> str:
    """A 1x1 convolution over NCHW with its pixels collapsed, as IREE's dispatch computes it:
    out[co, p] = X[ci, p] x W[co, ci], the image first as linalg.conv_2d_nchw_fchw has it (or,
    with `image_first=False`, the same product with its inputs the other way round)."""
    x, w, y = f"tensor<{k}x{n}xf32>", f"tensor<{m}x{k}xf32>", f"tensor<{m}x{n}xf32>"
    ins = f"%x, %w : {x}, {w}" if image_first else f"%w, %x : {w}, {x}"
    maps = "[#x, #w, #o]" if image_first else "[#w, #x, #o]"
    return f"""
#x = affine_map<(co, p, ci) -> (ci, p)>
#w = affine_map<(co, p, ci) -> (co, ci)>
#o = affine_map<(co, p, ci) -> (co, p)>
func.func @conv1x1(%x: {x}, %w: {w}) -> {y} {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : {y}
  %f = linalg.fill ins(%zero : f32) outs(%e : {y}) -> {y}
  %c = linalg.generic {{indexing_maps = {maps}, iterator_types = ["parallel", "parallel", "reduction"]}}
      ins({ins}) outs(%f : {y}) {{
{_multiply_add(y)}"""


# A contraction over three contiguous reduction dims: IREE collapses them into one before it
# configures the op, so a matcher of the module's dims (k = 8 x 16 x 4) matches nothing.
THREE_REDUCTION_DIMS = """
#a = affine_map<(i, j, k, l, m) -> (i, k, l, m)>
#b = affine_map<(i, j, k, l, m) -> (k, l, m, j)>
#c = affine_map<(i, j, k, l, m) -> (i, j)>
func.func @main(%x: tensor<32x8x16x4xf32>, %w: tensor<8x16x4x96xf32>) -> tensor<32x96xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<32x96xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<32x96xf32>) -> tensor<32x96xf32>
  %r = linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction", "reduction", "reduction"]}
      ins(%x, %w : tensor<32x8x16x4xf32>, tensor<8x16x4x96xf32>) outs(%f : tensor<32x96xf32>) {
  ^bb0(%p: f32, %q: f32, %o: f32):
    %m = arith.mulf %p, %q : f32
    %s = arith.addf %o, %m : f32
    linalg.yield %s : f32
  } -> tensor<32x96xf32>
  return %r : tensor<32x96xf32>
}"""
