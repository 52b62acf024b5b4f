"""A request that waits for a cold start, through the real gateway: kept alive, told where the start stands,
and turned away with ``Retry-After`` when the start will not be done in time (gateway.coldwait).

The start is played as the node's agent would report it: a replica placed on
a node, its shard's heartbeat entries (fetching, then starting, then ready
with a fake engine's address) written by placement's own
``shard_status.follow`` from a thread, on a clock (``start``). The fake
engine answers once the replica is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
import time

import anthropic
import httpx
import openai
import pytest
from django.db import connections

from gateway.asgi import GatewayApp
from gateway.models import UsageRecord
from gateway.proxy import Gateway
from inventory.models import Node
from placement.models import ColdStart, Replica, ReplicaState, Shard
from placement.writes import shard_status
from tests.asgiserver import asgi_live_server
from tests.gateway.harness import FAST, call, key, model

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = dataclasses.replace(FAST, cold_keepalive_s=0.3, cold_start_timeout_s=4.0)
CHAT = "/v1/chat/completions"


def hello(stream: bool = True) -> dict:
    return {"model": "cold", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


@dataclasses.dataclass
class Start:
    replica: Replica
    node: Node

    def report(self, state: str, **extra) -> None:
        """What the node's agent says of rank 0 in its next heartbeat, as the heartbeat flush applies it."""
        entry = {"id": f"{self.replica.id}-0", "replica": self.replica.id, "rank": 0, "state": state, **extra}
        try:
            shard_status.follow([(self.node.pk, self.node.name, [entry])])
        finally:
            connections.close_all()

    def play(self, engine_url: str | None, fetch_s: float, load_s: float) -> threading.Thread:
        """Fetching now, loading after ``fetch_s``, ready at ``engine_url`` after ``load_s`` more (None: never)."""

        def run() -> None:
            self.report("fetching", phases={"fetch_s": 0.0}, fetch={"source": "file:///w", "bytes_done": 0})
            time.sleep(fetch_s)
            self.report("starting", phases={"fetch_s": fetch_s, "load_s": 0.0, "weights_local": True})
            if engine_url is None:
                return
            time.sleep(load_s)
            phases = {"fetch_s": fetch_s, "load_s": load_s, "weights_local": True}
            self.report("ready", endpoint=engine_url, phases=phases)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread


@pytest.fixture
def start():
    """A model scaled to zero whose one replica is placed on node cpu-a and has not started yet."""
    m = model("cold", min_replicas=0)
    node = Node.objects.create(name="cpu-a", hostname="cpu-a", mgmt_addr="127.0.0.1")
    r = Replica.objects.create(model=m, profile_name="cpu", state=ReplicaState.STARTING)
    Shard.objects.create(replica=r, node=node, rank=0)
    return Start(r, node)


def measured(start: Start, load_s: float, n: int = 3, fetch_s: float = 0.5) -> None:
    """``n`` earlier starts of the model on cpu-a, each downloading for ``fetch_s`` and loading for ``load_s``."""
    for i in range(n):
        ColdStart.objects.create(
            model=start.replica.model, profile_name="cpu", node="cpu-a", replica_id=f"old{i}", fetch_s=fetch_s,
            load_s=load_s, weights_local=False,
        )  # fmt: skip


def run(scenario, settings=WAIT):
    async def main():
        app = GatewayApp(lambda: Gateway(settings))
        try:
            return await scenario(app)
        finally:
            await app.gateway.close() if app.gateway else None

    return asyncio.run(main())


def comments(body: bytes) -> list[str]:
    return [line[2:] for line in body.decode().splitlines() if line.startswith(": ")]


def test_a_streaming_request_waiting_for_a_cold_start_is_kept_alive_with_comments(start, engines):
    engine = engines(tokens=3)
    measured(start, load_s=1.5)
    start.play(engine.url, fetch_s=0.5, load_s=1.5)
    secret = key()
    answer = run(lambda app: call(app, CHAT, hello(), key=secret))

    assert answer.status == 200 and answer.headers["content-type"] == "text/event-stream"
    said = comments(answer.body)
    assert len(said) >= 3, said
    assert said[0].startswith("waiting for cold: replica starting on cpu-a, ")
    loading = [c for c in said if "loading the engine" in c]
    assert loading and loading[-1].endswith(" s left"), said
    # The comments go out every keepalive interval, the first after one.
    first = next(t for t, c in answer.chunks if c.startswith(b": "))
    assert 0.25 <= first < 2.5
    events = answer.events()
    assert [e["choices"][0]["delta"].get("content") for e in events if e.get("choices")][:3] == ["w0 ", "w1 ", "w2 "]
    assert answer.body.rstrip().endswith(b"data: [DONE]")
    record = UsageRecord.objects.get()
    assert record.status == 200 and record.replica_id == start.replica.id


def test_a_replica_ready_within_the_first_keepalive_is_answered_as_if_nothing_waited(start, engines):
    engine = engines(tokens=2)
    start.play(engine.url, fetch_s=0.1, load_s=0.2)
    slow_keepalive = dataclasses.replace(WAIT, cold_keepalive_s=20.0, cold_start_timeout_s=20.0)
    secret = key()
    answer = run(lambda app: call(app, CHAT, hello(), key=secret), slow_keepalive)
    assert answer.status == 200 and answer.headers["x-llmgw-replica"] == start.replica.id
    assert comments(answer.body) == []


def test_a_start_measured_longer_than_the_wait_is_503_at_once_with_retry_after(start):
    measured(start, load_s=100)
    start.report("starting", phases={"fetch_s": 1.0, "load_s": 10.0, "weights_local": True})
    secret = key()

    async def scenario(app):
        chat = await call(app, CHAT, hello(), key=secret)
        plain = await call(app, CHAT, hello(stream=False), key=secret)
        body = {"model": "cold", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        messages = await call(app, "/v1/messages", body, key=secret)
        return chat, plain, messages

    t0 = time.monotonic()
    chat, plain, messages = run(scenario, dataclasses.replace(WAIT, cold_start_timeout_s=30.0))
    assert time.monotonic() - t0 < 15, "refused up front, not after the wait"
    for answer in (chat, plain, messages):
        assert answer.status == 503
        assert 85 <= int(answer.headers["retry-after"]) <= 95, "100 s of load, 10 done"
    error = chat.json()["error"]
    assert error["code"] == "cold_start_timeout" and error["type"] == "service_unavailable"
    assert error["message"].startswith(
        "cold: replica starting on cpu-a, loading the engine, about 90 s left, longer than this gateway waits, 30 s"
    )
    assert "LLMGW_COLD_START_TIMEOUT_S" in error["message"] and "median of 3 start(s) on cpu-a" in error["message"]
    assert messages.json()["type"] == "error" and messages.json()["error"]["type"] == "overloaded_error"
    assert "about 90 s left" in messages.json()["error"]["message"]


def test_a_wait_that_passes_the_bound_is_503_with_retry_after_and_where_the_start_stands(start):
    start.report("fetching", phases={"fetch_s": 2.0}, fetch={"source": "file:///w", "bytes_done": 10**9})
    short = dataclasses.replace(WAIT, cold_start_timeout_s=1.0)
    secret = key()
    answer = run(lambda app: call(app, CHAT, hello(stream=False), key=secret), short)
    assert answer.status == 503 and int(answer.headers["retry-after"]) >= 1
    message = answer.json()["error"]["message"]
    assert message.startswith("no replica was ready within 1 s (LLMGW_COLD_START_TIMEOUT_S): cold: replica starting")
    assert "fetching the weights (1.0 GB so far)" in message and "the defaults" in message


@pytest.mark.parametrize("endpoint", ["chat/completions", "messages", "responses"])
def test_a_committed_stream_whose_wait_passes_the_bound_ends_with_its_protocols_error_event(start, endpoint):
    start.report("starting", phases={"fetch_s": 0.0, "load_s": 1.0, "weights_local": True})
    short = dataclasses.replace(WAIT, cold_start_timeout_s=1.2)
    body = {**hello(), "max_tokens": 5}
    if endpoint == "responses":
        body = {"model": "cold", "stream": True, "input": "hi"}
    secret = key()
    answer = run(lambda app: call(app, f"/v1/{endpoint}", body, key=secret), short)
    assert answer.status == 200 and comments(answer.body), "committed: the status line went out with the comments"
    last = answer.body.decode().strip().split("\n\n")[-1]
    if endpoint == "chat/completions":
        error = json.loads(last.removeprefix("data: "))["error"]
        assert error["code"] == "cold_start_timeout"
    elif endpoint == "messages":
        assert last.startswith("event: error\n")
        error = json.loads(last.split("data: ", 1)[1])["error"]
        assert error["type"] == "overloaded_error"
    else:
        assert last.startswith("event: error\n")
        error = json.loads(last.split("data: ", 1)[1])
        assert error["type"] == "error" and error["code"] == "cold_start_timeout"
    assert "no replica was ready within 1.2 s" in error["message"] and "loading the engine" in error["message"]
    assert UsageRecord.objects.get().status == 503


@contextlib.contextmanager
def gateway_server(settings):
    """The gateway's ASGI app on a real socket (uvicorn in a thread), closed on its own loop at the end."""
    loops: list[asyncio.AbstractEventLoop] = []

    def factory() -> Gateway:
        loops.append(asyncio.get_running_loop())
        return Gateway(settings)

    app = GatewayApp(factory)
    with asgi_live_server(app=app) as url:
        try:
            yield url
        finally:
            if loops:
                asyncio.run_coroutine_threadsafe(app.close(), loops[0]).result(10)


def test_clients_over_http_see_the_comments_and_the_official_clients_ignore_them(start, engines):
    engine = engines(tokens=3, messages=True)
    secret = key()
    with gateway_server(WAIT) as url:
        start.play(engine.url, fetch_s=0.2, load_s=1.0)
        # What curl -N prints: the comment lines, as they come.
        with httpx.stream("POST", f"{url}{CHAT}", json=hello(), headers={"authorization": f"Bearer {secret}"}) as raw:
            lines = [line for line in raw.iter_lines() if line]
        assert raw.status_code == 200 and any(line.startswith(": waiting for cold: ") for line in lines), lines
        Replica.objects.filter(pk=start.replica.pk).update(state=ReplicaState.STARTING)
        start.play(engine.url, fetch_s=0.2, load_s=1.0)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0)
        stream = client.chat.completions.create(model="cold", messages=[{"role": "user", "content": "hi"}], stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "w0 w1 w2 "

        # A committed stream that ends in the error event: the official clients raise it, with the sentence.
        Replica.objects.filter(pk=start.replica.pk).update(state=ReplicaState.STARTING)
        start.play(None, fetch_s=0.1, load_s=0)
    with gateway_server(dataclasses.replace(WAIT, cold_start_timeout_s=1.2)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0)
        with pytest.raises(openai.APIError, match=r"no replica was ready within 1\.2 s"):
            for _ in client.chat.completions.create(
                model="cold", messages=[{"role": "user", "content": "hi"}], stream=True
            ):
                pass
        claude = anthropic.Anthropic(base_url=url, api_key=secret, max_retries=0)
        hello_claude = {"model": "cold", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        with (
            pytest.raises(anthropic.APIStatusError, match=r"no replica was ready within 1\.2 s"),
            claude.messages.stream(**hello_claude) as events,
        ):
            for _ in events:
                pass
