"""Where the shared inputs live: ../shared beside the repo (CI clones it there too)."""

from __future__ import annotations

import os
from pathlib import Path

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
