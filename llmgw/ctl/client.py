"""The admin API over HTTP: JSON in and out, and the server's own sentence when it refuses."""

from __future__ import annotations

from typing import Any

import httpx

from llmgw.ctl.config import Settings

TIMEOUT_S = 30.0


class CtlError(Exception):
    """Something ctl cannot do, in a sentence; ``status`` is the HTTP status when the server answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class Client:
    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Accept": "application/json", "User-Agent": "llmgw-ctl"}
        if settings.token:
            headers["Authorization"] = f"Bearer {settings.token}"
        if settings.actor:
            headers["X-Llmgw-Actor"] = settings.actor
        self.settings = settings
        self.http = httpx.Client(base_url=settings.server, headers=headers, timeout=TIMEOUT_S, transport=transport)
        self.last_headers: httpx.Headers = httpx.Headers()

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body if body is not None else {})

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, json=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            answer = self.http.request(method, "/api/v1/" + path.lstrip("/"), **kwargs)
        except httpx.TransportError as exc:
            raise CtlError(f"cannot reach {self.settings.server}: {exc or type(exc).__name__}") from None
        self.last_headers = answer.headers
        if answer.status_code >= 400:
            raise CtlError(_refusal(answer), answer.status_code)
        try:
            return answer.json()
        except ValueError:
            raise CtlError(f"{self.settings.server} answered {path} with something that is not JSON") from None


def _refusal(answer: httpx.Response) -> str:
    """The server's sentence as it wrote it; a status line when it sent none (a proxy, an old server)."""
    try:
        body = answer.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        message = body["error"]
    else:
        message = f"the server answered {answer.status_code} {answer.reason_phrase}"
    if answer.status_code == 401 and "token" not in message.lower():
        message += " (set a token with --token, LLMGW_TOKEN or ~/.config/llmgw/ctl.yaml)"
    return message
