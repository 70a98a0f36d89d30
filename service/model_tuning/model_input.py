"""A model file as IREE takes it, and the caller's mistakes about it (ModelInputError)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from service.measure.forcing import NotMeasurable
from service.measure.tools import ToolFailure
from service.measure.whole_model import iree_input


class ModelInputError(Exception):
    """The input is not a model IREE can form dispatches for; the message says what to fix."""


@contextmanager
def refused_as(message: str) -> Iterator[None]:
    """An IREE tool failing inside (or inputs it cannot be given) becomes the caller's
    ModelInputError: `message`: the tool's first error line (or why)."""
    try:
        yield
    except ToolFailure as failure:
        raise ModelInputError(f"{message}: {failure.line}") from None
    except NotMeasurable as refused:
        raise ModelInputError(f"{message}: {refused.reason}") from None


MODEL_SUFFIXES = (".mlir", ".mlirbc", ".onnx")


def check_model_file(model: Path) -> None:
    """ModelInputError for a file that cannot be a model, by its name and size."""
    if model.suffix.lower() not in MODEL_SUFFIXES:
        raise ModelInputError(f"{model.name}: a model is MLIR ({', '.join(MODEL_SUFFIXES[:2])}) or ONNX (.onnx), "
                              "by its file name's suffix")
    if model.stat().st_size == 0:
        raise ModelInputError(f"{model.name} is empty")


def importable_model(model: Path, workdir: Path) -> Path:
    """`model` as iree-compile takes it (ONNX imported into `workdir`); ModelInputError for a
    file that cannot be a model, or with the importer's reason when it refuses the file."""
    check_model_file(model)
    with refused_as(f"IREE cannot import {model.name}"):
        return iree_input(model, workdir)
