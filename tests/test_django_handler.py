"""llmgw.django_handler: the servers' Django handler runs the middleware chain and the view in one hand-over
to the request's thread, and answers what Django's own handler answers.

Django's test client never reaches it (it is WSGI, or AsyncClient's own
handler), so these post through ``llmgw.asgi.application`` itself.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from asgiref.sync import SyncToAsync
from django.db import OperationalError
from django.http import JsonResponse
from django.test import override_settings
from django.urls import path

from core.models import ApiToken
from inventory.reads import nodes as node_reads
from llmgw.asgi import application
from llmgw.bootstrap import issue_join_token
from llmgw.django_handler import SyncChainASGIHandler
from tests import people
from tests.agentapi.reports import report
from tests.api.fleet import ingest_fleet
from tests.asgiserver import asgi_live_server

pytestmark = pytest.mark.django_db(transaction=True)


async def _async_view(request):
    await asyncio.sleep(0)
    return JsonResponse({"async": True, "thread": threading.current_thread().name})


# The URLconf of the async-view test (override_settings names this module).
urlpatterns = [path("async-view", _async_view)]


async def _post(url: str, body: dict, secret: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://control") as http:
        return await http.post(url, content=json.dumps(body).encode(), headers={"Authorization": f"Bearer {secret}"})


def _registration(name: str) -> dict:
    return {"name": name, "machine_id": name, "report": report(hostname=name)}


def test_the_servers_application_uses_this_handler():
    from llmgw import asgi, asgi_gateway

    assert isinstance(asgi.django_app, SyncChainASGIHandler)
    assert isinstance(asgi_gateway.django_app, SyncChainASGIHandler)


def test_a_request_crosses_to_its_thread_once_for_the_whole_chain(monkeypatch):
    """Django's own handler handed each MiddlewareMixin's hooks to the thread one by one: some twenty
    crossings for a registration. Here: the chain and view once, and the response's close once."""
    join = issue_join_token()
    crossings = []
    original = SyncToAsync.__call__

    def counted(self, *args, **kwargs):
        crossings.append(getattr(self.func, "__qualname__", repr(self.func)))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted)
    answer = asyncio.run(_post("/api/v1/agent/register", _registration("one-hop"), join))
    assert answer.status_code == 201, answer.text
    hops = [c for c in crossings if "asend" not in c]  # request_started's receivers, once, as before
    assert len(hops) <= 2, crossings


def test_the_registration_answers_as_through_django_s_own_handler(client):
    """Same status and body keys, and the node stored, as the test client (WSGI) registers it."""
    join = issue_join_token()
    answer = asyncio.run(_post("/api/v1/agent/register", _registration("via-asgi"), join))
    direct = client.post(
        "/api/v1/agent/register",
        data=json.dumps(_registration("via-wsgi")),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {join}",
    )
    assert answer.status_code == direct.status_code == 201
    assert answer.json().keys() == direct.json().keys()
    refused = asyncio.run(_post("/api/v1/agent/register", _registration("via-asgi"), "llmgw_join_wrong"))
    assert refused.status_code == 401 and "join token is unknown" in refused.json()["error"]


def test_a_database_that_does_not_answer_is_still_a_503_with_retry_after(monkeypatch):
    """core.errors.DatabaseDownMiddleware's process_exception runs in the sync chain as in the async one."""
    from agentapi import views

    def down(_secret):
        raise OperationalError("connection to server at 10.0.0.9, port 5432 failed: Connection refused")

    monkeypatch.setattr(views, "check_join_token", down)
    answer = asyncio.run(_post("/api/v1/agent/register", _registration("db-down"), "llmgw_join_x"))
    assert answer.status_code == 503
    assert answer.headers["retry-after"]
    assert answer.json()["error"].startswith("the database did not answer (connection to server at 10.0.0.9")


@override_settings(ROOT_URLCONF="tests.test_django_handler")
def test_an_async_view_still_answers():
    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://control") as http:
            return await http.get("/async-view")

    answer = asyncio.run(get())
    assert answer.status_code == 200 and answer.json()["async"] is True


def test_the_node_listing_still_goes_out_page_by_page_through_a_real_server(monkeypatch):
    """A streamed answer (api.base.streamed_list) is read by the server after the chain returned: chunked,
    each page read in the request's thread, and joined the same list the test client answers."""
    ingest_fleet("h100-hgx:5@south,cpu:2")
    monkeypatch.setattr(node_reads, "NODE_PAGE", 2)
    _, secret = ApiToken.issue(people.operator("stream"), "stream")
    headers = {"Authorization": f"Bearer {secret}"}
    with asgi_live_server() as url:
        with httpx.stream("GET", f"{url}/api/v1/nodes", headers=headers, timeout=30) as answer:
            assert answer.status_code == 200
            assert answer.headers.get("transfer-encoding") == "chunked"
            assert "content-length" not in answer.headers
            body = b"".join(answer.iter_bytes())
        whole = httpx.get(f"{url}/api/v1/nodes?fields=id", headers=headers, timeout=30).json()
    listed = json.loads(body)
    assert [n["id"] for n in listed] == sorted(n["id"] for n in whole) and len(listed) == 7


def test_a_request_thread_serves_the_next_request_instead_of_a_new_one():
    """Django's own handler starts and joins a thread per request; here the second request's view runs on
    the first one's thread, and its database connection works there."""
    join = issue_join_token()
    seen = []
    from agentapi import views

    original = views.check_join_token

    def noting(secret):
        seen.append(threading.current_thread())
        return original(secret)

    views.check_join_token = noting
    try:
        for name in ("first-thread", "second-thread"):
            assert asyncio.run(_post("/api/v1/agent/register", _registration(name), join)).status_code == 201
    finally:
        views.check_join_token = original
    assert seen[0] is seen[1] and seen[0].name.startswith("llmgw-request")


def test_a_thread_still_running_a_left_request_is_not_handed_to_the_next():
    from llmgw.django_handler import RequestThreads

    threads = RequestThreads(keep=4)
    first = threads.take()
    release = threading.Event()
    running = first.submit(release.wait, 10)
    threads.give_back(first)  # its request ended (the client left) with the view still running
    second = threads.take()
    assert second is not first
    assert second.submit(lambda: "at once").result(timeout=5) == "at once"
    release.set()
    running.result(timeout=5)
    threads.give_back(second)
    assert threads.take() is second, "an idle one is kept"
    second.shutdown()


def test_concurrent_requests_get_threads_of_their_own():
    from llmgw.django_handler import RequestThreads

    threads = RequestThreads(keep=1)
    a, b = threads.take(), threads.take()
    assert a is not b
    threads.give_back(a)
    threads.give_back(b)  # past the idle threads kept: it ends
    assert threads.take() is a
    assert b._shutdown
    a.shutdown()


def test_a_submit_refused_by_a_shut_thread_leaves_it_idle():
    from llmgw.django_handler import RequestThread

    thread = RequestThread()
    thread.shutdown()
    with pytest.raises(RuntimeError):
        thread.submit(print)
    assert thread.idle
