"""A small typed client for the tilesearch HTTP API (httpx).

    with TilesearchClient("http://127.0.0.1:8000") as client:
        decision = client.tile(open("model.mlir").read(), hardware="host-cpu", budget=64)
        print(decision.cache, decision.plan, decision.predicted_cost["latency_s"])
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx

from service.api.schemas import (DecisionOut, DecisionPage, DecisionSummary, HardwareDetail, HardwareList, HardwareOut,
                                 TrialOut, TrialPage)
from service.hardware.model import HardwareModel


class TilesearchError(Exception):
    """A non-2xx answer; `detail` is the server's error body (error, message, diagnostics...),
    `message` the server's explanation in one line."""

    def __init__(self, status_code: int, detail: Any) -> None:
        self.status_code = status_code
        self.detail = detail
        self.message = _one_line(detail)
        super().__init__(f"HTTP {status_code}: {self.message}")


class ServerUnreachable(ConnectionError):
    """No HTTP answer at all: nothing listens at the URL, the name does not resolve, or it timed out."""

    def __init__(self, base_url: str, cause: httpx.TransportError) -> None:
        self.base_url = base_url
        reason = str(cause) or type(cause).__name__
        if isinstance(cause, httpx.TimeoutException):
            super().__init__(f"no answer from {base_url} in time ({reason})")
        else:
            super().__init__(f"cannot reach {base_url}: {reason}")


def _one_line(detail: Any) -> str:
    """The message of our {error, message} bodies, or FastAPI's validation list as `where: what`."""
    if isinstance(detail, dict):
        return str(detail.get("message", detail))
    if isinstance(detail, list):
        return "; ".join(_validation_line(d) for d in detail)
    return str(detail).strip() or "no message"


def _validation_line(error: Any) -> str:
    if not isinstance(error, dict):
        return str(error)
    where = ".".join(str(p) for p in error.get("loc", [])[1:])  # past "body" / "query" / "path"
    return f"{where}: {error.get('msg')}" if where else str(error.get("msg"))


class TilesearchClient:
    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 300.0,
                 retries_when_busy: int = 3) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)
        self.retries_when_busy = retries_when_busy

    def tile(
        self,
        module: str,
        hardware: str | HardwareModel = "host-cpu",
        *,
        budget: int = 64,
        seconds: float | None = None,
        strategy: str = "tpe",
        seed: int = 0,
        shape_hints: dict[str, list[int] | str] | None = None,
        buckets: dict[str, list[int]] | None = None,
        reuse: bool = True,
        measure_top: int = 0,
    ) -> DecisionOut:
        """The decision for `module` (stored, or searched now). 503s are retried after Retry-After.
        `measure_top` K: the server times the K best plans with IREE on its CPU (host-cpu only)."""
        body = {
            "module": module,
            "hardware": hardware.model_dump(mode="json") if isinstance(hardware, HardwareModel) else hardware,
            "budget": budget, "seconds": seconds, "strategy": strategy, "seed": seed,
            "shape_hints": shape_hints, "buckets": buckets, "reuse": reuse, "measure_top": measure_top,
        }
        for attempt in range(self.retries_when_busy + 1):
            response = self._request("POST", "/v1/tilings", json=body)
            if response.status_code != 503 or attempt == self.retries_when_busy:
                break
            time.sleep(float(response.headers.get("Retry-After", "1")))
        return DecisionOut.model_validate(self._ok(response))

    def get(self, decision_id: int) -> DecisionOut:
        return DecisionOut.model_validate(self._ok(self._request("GET", f"/v1/tilings/{decision_id}")))

    def list(self, *, fingerprint: str | None = None, hardware: str | None = None, limit: int = 50,
             cursor: str | None = None) -> DecisionPage:
        params = {k: v for k, v in {"fingerprint": fingerprint, "hardware": hardware, "limit": limit,
                                     "cursor": cursor}.items() if v is not None}
        return DecisionPage.model_validate(self._ok(self._request("GET", "/v1/tilings", params=params)))

    def iter_decisions(self, **filters: Any) -> Iterator[DecisionSummary]:
        """Every decision matching the filters, following the cursors."""
        cursor = None
        while True:
            page = self.list(cursor=cursor, **filters)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def trials(self, decision_id: int, *, limit: int = 100, cursor: str | None = None) -> TrialPage:
        params = {"limit": limit} | ({"cursor": cursor} if cursor else {})
        return TrialPage.model_validate(self._ok(self._request("GET", f"/v1/tilings/{decision_id}/trials", params=params)))

    def all_trials(self, decision_id: int) -> list[TrialOut]:
        out, cursor = [], None
        while True:
            page = self.trials(decision_id, limit=500, cursor=cursor)
            out.extend(page.items)
            if page.next_cursor is None:
                return out
            cursor = page.next_cursor

    def hardware(self, name: str | None = None) -> list[HardwareOut] | HardwareDetail:
        """All hardware models, or the one named with its fidelity on the server host's
        measurements and its calibration."""
        if name is not None:
            return HardwareDetail.model_validate(self._ok(self._request("GET", f"/v1/hardware/{name}")))
        return HardwareList.model_validate(self._ok(self._request("GET", "/v1/hardware"))).items

    def add_hardware(self, model: HardwareModel) -> HardwareOut:
        return HardwareOut.model_validate(self._ok(self._request("POST", "/v1/hardware", json=model.model_dump(mode="json"))))

    # Jobs: plain JSON (the bodies are service.api.job_schemas.JobAccepted / JobOut).
    def submit_job(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._ok(self._request("POST", "/v1/jobs", json=body))

    def job(self, job_id: int) -> dict[str, Any]:
        return self._ok(self._request("GET", f"/v1/jobs/{job_id}"))

    def job_items(self, job_id: int, state: str | None = None) -> list[dict[str, Any]]:
        """Every item of the job (of one state: queued, running, done, failed, cancelled), all pages."""
        out: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 500, **({"state": state} if state else {})}
        while True:
            page = self._ok(self._request("GET", f"/v1/jobs/{job_id}/items", params=params))
            out.extend(page["items"])
            if page["next_cursor"] is None:
                return out
            params["cursor"] = page["next_cursor"]

    def cancel_job(self, job_id: int) -> dict[str, Any]:
        return self._ok(self._request("POST", f"/v1/jobs/{job_id}/cancel"))

    def job_spec(self, job_id: int) -> str:
        response = self._request("GET", f"/v1/jobs/{job_id}/spec")
        if response.status_code >= 400:
            self._ok(response)
        return response.text

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerUnreachable(str(self._http.base_url).rstrip("/"), exc) from exc

    def _ok(self, response: httpx.Response) -> Any:
        if response.is_success:
            try:
                return response.json()
            except ValueError:  # another web server at that address
                raise TilesearchError(response.status_code, f"{response.url} answered with no JSON: "
                                                            "is it a tilesearch server?") from None
        try:
            detail = response.json().get("detail")
        except (ValueError, AttributeError):  # a proxy's page, say
            detail = response.text[:200] or response.reason_phrase
        raise TilesearchError(response.status_code, detail)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "TilesearchClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

