"""Test-only transports for ctl: the real API in-process, and a fake of the gateway piece's endpoints."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import httpx


class DjangoTransport(httpx.BaseTransport):
    """Hands ctl's requests to Django's test client, so ctl drives the real API without a server."""

    def __init__(self) -> None:
        from django.test import Client

        self.client = Client()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        headers = {
            "HTTP_" + k.upper().replace("-", "_"): v
            for k, v in request.headers.items()
            if k.lower() not in ("content-type", "content-length", "host")
        }
        body = request.read()
        answer = self.client.generic(
            request.method,
            request.url.raw_path.decode(),
            data=body,
            content_type=request.headers.get("content-type", "application/json"),
            **headers,
        )
        return httpx.Response(answer.status_code, headers=dict(answer.items()), content=answer.content)


def run(argv: list[str], transport: httpx.BaseTransport) -> tuple[int, str, str]:
    """Run ``llmgw ctl ARGV`` against a transport; (exit status, stdout, stderr)."""
    from llmgw.ctl.main import main

    out, err = io.StringIO(), io.StringIO()
    code = main(["--server", "http://llmgw.test", *argv], transport=transport, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def fake_gateway(routes: dict[tuple[str, str], Callable[[httpx.Request], tuple[int, object]]]) -> httpx.MockTransport:
    """A stand-in for the gateway piece's /api/v1/keys, /budgets and /usage, answering the contract's shapes."""

    def handle(request: httpx.Request) -> httpx.Response:
        route = routes.get((request.method, request.url.path))
        if route is None:
            return httpx.Response(404, json={"error": f"no {request.url.path} in this fake"})
        status, body = route(request)
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handle)


def body(request: httpx.Request) -> dict:
    return json.loads(request.read() or b"{}")
