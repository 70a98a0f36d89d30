"""Where the shared inputs live: ../shared beside the repo (CI clones it there too)."""

from __future__ import annotations

import os
from pathlib import Path

SHARED = Path(os.environ.get("TILESEARCH_SHARED_DIR", Path(__file__).resolve().parents[2] / "shared"))
WORKLOADS = SHARED / "workloads"
CORPUS = SHARED / "corpus" / "upstream-mlir"


def workload(name: str) -> str:
    return (WORKLOADS / f"{name}.mlir").read_text()
