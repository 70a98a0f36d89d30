"""Errors of the tiling use case that are neither the IR core's nor the search's."""

from __future__ import annotations


class PoolSaturated(Exception):
    """Every MLIR worker is busy and the queue is full: retry after `retry_after_s`."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"all MLIR workers are busy; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class TilingFailed(Exception):
    """An unexpected exception inside a sandbox worker while it worked on the client's module:
    a tilesearch bug, but like a worker crash it costs that request only. `error` is the type
    name of what the worker raised; the worker's traceback is this exception's cause chain."""

    def __init__(self, error: str, detail: str) -> None:
        super().__init__(
            f"tilesearch could not tile this module ({error}: {detail}); the module is kept out of the "
            "cache and the failure is logged for a fix"
        )
        self.error = error
        self.detail = detail


class ReservedHardwareName(Exception):
    """A custom model may not take the name of the machine the service runs on: requests naming
    it are measured on this CPU and its decisions shared by every client."""

    def __init__(self, name: str) -> None:
        super().__init__(f"'{name}' names the CPU this service runs on, detected at start; "
                         "store your model under another name and ask for that name")
        self.name = name
