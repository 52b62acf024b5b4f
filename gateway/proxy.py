"""The gateway's request path: admit, route, relay, record.

1. Parse the body and find the model in the cached directory (a miss
   refreshes it; an unknown name is 404 once the key is known good).
2. Admit in one database round trip for most requests: key (401), model
   allowed (403), rate limits without Redis (429), budgets reserved (429) —
   one statement from the event loop (gateway.pgpath), which hands the
   uncommon cases to the ORM's rule on a thread. With Redis the rate limits
   are one Lua call after that.
3. Route: the model's ready replicas by least load and prompt-prefix
   affinity; a replica that fails before answering is passed over for the
   next; then the fallbacks in order. A model scaled to zero is asked for
   (``placement.writes.demand.request_replica``) and waited for, up to
   LLMGW_COLD_START_TIMEOUT_S, by a request that holds one of its key's and
   team's waiting places (``coldwait.Waiters``: LLMGW_COLD_WAIT_PER_KEY and
   _PER_TEAM; past them, 429 and no start asked for) and the reservation of
   the model it waits for; a streaming request is kept alive meanwhile
   with SSE comments saying where the start stands, and one that cannot be
   served in time gets 503 with ``Retry-After`` from the start's estimate
   (gateway.coldwait says when each happens).
4. Relay the engine's answer as it comes: each streamed event is passed on
   as soon as it is complete, those that arrived together in one piece.
5. Record usage and settle budgets whatever happened, a client that went
   away included (the ASGI app cancels this task, which closes the upstream
   request and lands here).

The waiting of step 3 for a model scaled to zero is gateway.coldstart's,
step 5 gateway.recording's (both parts of :class:`Gateway`), and the bodies'
parsing and translation gateway.bodies'.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from django.db import InterfaceError, OperationalError, close_old_connections, connection, connections
from django.utils import timezone

from core import tracing
from gateway import (
    anthropic,
    coldwait,
    conf,
    errors,
    fields,
    responses,
    router,
    rules,
    tokens,
    upstream,
)
from gateway import tracing as gateway_tracing
from gateway.bodies import (
    as_message,
    as_response,
    parse_body,
    upstream_body,
    upstream_path,
    usage_of_body,
    usage_of_message,
)
from gateway.coldstart import ColdStart
from gateway.directory import Directory, ModelEntry, ReplicaEntry, Snapshot
from gateway.load import LoadMeter, Publisher
from gateway.pgpath import PgPath
from gateway.ratelimit import Limiter
from gateway.recording import Recording
from gateway.rules import Caller
from gateway.writes import budgets, usage
from gateway.writes.usage import CLIENT_CLOSED, Writer

log = logging.getLogger("llmgw.gateway")

ENDPOINTS = {"chat/completions", "completions", "embeddings", "messages", "responses"}
# The protocols served as the chat request they ask for (translated where the engine does not speak them).
AS_CHAT = {"messages": anthropic.to_chat, "responses": responses.to_chat}
# How long past LLMGW_COLD_START_TIMEOUT_S a waiting place held in Redis outlives a process that died holding it.
WAIT_LAPSE_S = 60.0


_relaxed = threading.local()


def _relax(conn) -> None:
    """Let this connection's commits return before their WAL reaches the disk (PostgreSQL).

    Only the request path's threads do this: what they write is budget
    reservations and rate-limit counters, which live as long as a request.
    The commit's fsync cost 3 ms on the bench machine, more than the
    gateway's whole 2 ms budget; a crash that lost the last fraction of a
    second of reservations loses nothing a restart would not drop anyway.
    Locks and visibility are unchanged, so no two requests can ever take the
    last of a budget. Usage records and settlements keep full durability:
    they are written in a transaction that asks for it (gateway.pgpath.PgPath.write).
    """
    raw = conn.connection
    if getattr(_relaxed, "raw", None) is not raw:
        with conn.cursor() as cursor:
            cursor.execute("SET synchronous_commit TO OFF")
        _relaxed.raw = raw


def _call(fn, args, relax: bool):
    if relax:
        connection.ensure_connection()
        _relax(connection)
    return fn(*args)


def _run(fn, args, relax: bool = False):
    """Run ORM work on a gateway thread, reconnecting once if the connection went away."""
    try:
        return _call(fn, args, relax)
    except (OperationalError, InterfaceError):
        if connection.in_atomic_block or connection.is_usable():
            raise
        close_old_connections()
        connection.close()
        return _call(fn, args, relax)


@dataclass
class Ticket:
    """One admitted request, so that it is recorded exactly once however it ends."""

    caller: Caller
    requested: str
    endpoint: str
    stream: bool
    started: float
    prompt: tokens.Prompt
    reserved: tuple[tuple[int, int], ...] = ()
    """(budget id, micros) held on each budget over the key: the same micros on each."""
    bounds: tuple[int, int] = (0, 0)
    """The most prompt and completion tokens this request can cost, whichever model serves it."""
    tokens_held: rules.TokensHeld | None = None
    """Tokens held on the key's tpm limits since admission (gateway.ratelimit), settled when it ends."""
    per_choice: int = 0
    """The most tokens one choice may have: sent to the engine in every field it may read a length from
    (``tokens.bounded``), so that it cannot generate past ``bounds``."""
    holding: asyncio.Future | None = None
    """A hop's re-admission still under way when the client left: recorded once it has landed."""
    drop_usage_chunk: bool = False
    """llmgw asked the engine for usage on the client's behalf: the usage-only chunk is not passed on."""
    original: dict | None = None
    """The client's body when it spoke a protocol served as chat (``AS_CHAT``: Anthropic's Messages,
    OpenAI's Responses): sent as it is to an engine that serves it, translated for one that does not."""
    at: object = field(default_factory=timezone.now)
    done: bool = False
    trace: object = field(default_factory=tracing.context)
    """The request's trace context, for the usage write's span (None when tracing is off)."""


class Gateway(ColdStart, Recording):
    def __init__(self, settings=None, redis=None) -> None:
        self.conf = settings or conf.get()
        self.executor = ThreadPoolExecutor(self.conf.db_threads, thread_name_prefix="gateway-db")
        # Usage is written on a thread of its own: its commits keep full
        # durability (see _relax), and a slow batch never holds up admissions.
        self.record_executor = ThreadPoolExecutor(1, thread_name_prefix="gateway-usage")
        self.directory = Directory(self.run_db, self.conf.refresh_s)
        self.client = upstream.Client(
            connect_timeout_s=self.conf.upstream_connect_timeout_s,
            read_timeout_s=self.conf.upstream_read_timeout_s,
            keys=self.directory.engine_key,  # every engine wants its replica's key
        )
        self.pg = PgPath.for_database(self.conf.db_threads, self.run_db)
        self.limiter = Limiter(self.run_db, redis)
        self.writer = Writer(
            self.run_record,
            self.conf.flush_every_s,
            self.conf.touch_every_s,
            write_batch=self._write_on_loop,
            busy=lambda: [r for r, n in self.in_flight.items() if n > 0],
        )
        self.in_flight: Counter[str] = Counter()
        # Per model, for the autoscaler (gateway.load; placement.writes.load sums every worker's).
        self.load = LoadMeter()
        self.load_publisher = Publisher(self.load, self.run_db, redis)
        self.background: set[asyncio.Task] = set()
        # A waiting place lapses this long after the wait's own bound, should its process die holding it.
        lapse = self.conf.cold_start_timeout_s + WAIT_LAPSE_S
        self.waiters = coldwait.Waiters(self.conf.cold_wait_per_key, self.conf.cold_wait_per_team, lapse, redis)
        self._demanded: dict[str, float] = {}
        self._starts: dict[int, tuple[float, dict | None]] = {}

    async def run_db(self, fn, *args):
        """Run ``fn`` on a request-path database thread."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, _run, fn, args, True)

    async def run_record(self, fn, *args):
        """Run ``fn`` on the usage writer's thread."""
        return await asyncio.get_running_loop().run_in_executor(self.record_executor, _run, fn, args)

    async def _write_on_loop(self, batch) -> None:
        await self.pg.write(usage.statements(batch, timezone.now(), records=False), copy=usage.copy(batch))

    async def authenticate(self, secret: str) -> rules.Admission:
        return await self.pg.authenticate(secret)

    async def admit(self, secret: str, ask: rules.Ask) -> rules.Admission:
        """``admission.admit``'s answer, from the loop."""
        return await self.pg.admit(secret, ask)

    async def readmit(self, caller: Caller, held: int, estimate: int | None, now) -> tuple[int, errors.Refused | None]:
        """``admission.readmit``'s answer, from the loop."""
        return await self.pg.readmit(caller, held, estimate, now)

    async def close(self) -> None:
        """Write what is queued, then close the upstream client and every connection."""
        # Until none is left: finishing one may start another (an admission that
        # lands after its client left starts the task that records it).
        while self.background:
            await asyncio.gather(*list(self.background), return_exceptions=True)
        # Waits for a write the writer's own loop has under way: returning
        # before it, the loop's task was cancelled with the event loop,
        # the write cut off mid-command and its records lost.
        await self.writer.close()
        await self.load_publisher.close()
        await self.client.aclose()
        await self.pg.close()
        threads = self.conf.db_threads
        barrier = threading.Barrier(threads)

        def close_mine() -> None:
            # Each thread waits for the others, so every thread closes its own.
            connections.close_all()
            barrier.wait(timeout=10)

        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self.executor, close_mine) for _ in range(threads)))
        await loop.run_in_executor(self.record_executor, connections.close_all)
        self.executor.shutdown(wait=True)
        self.record_executor.shutdown(wait=True)

    # --- /v1/models ---------------------------------------------------------

    async def models(self, secret: str) -> dict:
        self.writer.start()
        result = await self.authenticate(secret)
        if result.refused:
            raise result.refused
        snapshot = await self.directory.current()
        data = []
        for entry in sorted(snapshot.models.values(), key=lambda m: m.name):
            if not rules.allowed(result.caller, entry.name, entry.name, entry.aliases):
                continue
            for name in (entry.name, *entry.aliases):
                item = {"id": name, "object": "model", "created": entry.created, "owned_by": "llmgw"}
                if name != entry.name:
                    item["root"] = entry.name
                data.append(item)
        for entry in sorted(snapshot.adapters.values(), key=lambda m: m.name):
            # Allowed by its own name only, and listed with its base as vLLM lists an adapter it serves.
            if rules.allowed(result.caller, entry.name, entry.name):
                item = {"id": entry.name, "object": "model", "created": entry.created, "owned_by": "llmgw"}
                data.append({**item, "parent": entry.base})
        return {"object": "list", "data": data}

    # --- completions and embeddings -------------------------------------------

    async def complete(self, endpoint: str, raw: bytes, secret: str, send) -> None:
        self.writer.start()
        self.load_publisher.start()
        started = time.monotonic()
        body = parse_body(raw, endpoint)
        original = None
        if endpoint in AS_CHAT:
            # Admitted, bounded and routed as the chat request it asks for: the same path as chat.
            original, body = body, AS_CHAT[endpoint](body)
        name = body["model"]
        snapshot = await self.directory.current()
        entry = snapshot.by_name.get(name)
        if entry is None:
            # Known-good keys only learn which models exist.
            known = await self.authenticate(secret)
            if known.refused:
                raise known.refused
            snapshot = await self.directory.refresh(newer_than=started)
            entry = snapshot.by_name.get(name)
            if entry is None:
                raise errors.unknown_model(name)
        stream = bool(body.get("stream")) and endpoint != "embeddings"
        prompt = tokens.prompt_of(body)
        default = self.conf.default_completion_tokens
        bounds = (prompt.bound(), tokens.completion_bound(body, prompt, endpoint, default))
        estimate = self._estimate(entry, bounds)
        db_limits = self.limiter.redis is None
        ask = rules.Ask(name, entry.name, entry.aliases, estimate, db_limits, timezone.now(), sum(bounds))
        admission_task = asyncio.ensure_future(self.admit(secret, ask))
        try:
            # Shielded: a client that hangs up while its budget is being reserved
            # must not leave the reservation held for ever (see _admitted_after_all).
            with tracing.span("gateway.admission", {"llmgw.requested": name, "llmgw.endpoint": endpoint}):
                admitted = await asyncio.shield(admission_task)
        except asyncio.CancelledError:
            # Kept among the background work close() waits for: a gateway closing
            # while this admission lands must still record it and give its
            # reservation back (its _finish adds one more task, waited for too).
            self.background.add(admission_task)
            admission_task.add_done_callback(self.background.discard)
            admission_task.add_done_callback(
                lambda task: self._admitted_after_all(task, name, endpoint, stream, started, prompt)
            )
            raise
        if admitted.caller is None:
            raise admitted.refused
        ticket = Ticket(admitted.caller, name, endpoint, stream, started, prompt, admitted.reserved, bounds)
        ticket.per_choice = tokens.per_choice(body, endpoint, default)
        ticket.tokens_held = admitted.tokens_held
        options = body.get("stream_options")
        ticket.drop_usage_chunk = stream and not (isinstance(options, dict) and options.get("include_usage"))
        ticket.original = original
        try:
            refused = admitted.refused
            if refused is None and self.limiter.redis is not None:
                with tracing.span("gateway.rate_limit"):
                    why, ticket.tokens_held = await self.limiter.admit(admitted.caller, sum(bounds))
                refused = errors.rate_limited(why) if why else None
            if refused is not None:
                self._finish(ticket, status=refused.status, outcome=refused.code)
                raise refused
            with tracing.span("gateway.route", {"llmgw.model": entry.name}):
                await self._route(ticket, entry, snapshot, body, send)
        except errors.Refused as refusal:
            self._finish(ticket, status=refusal.status, outcome=refusal.code)
            raise
        except asyncio.CancelledError:
            self._finish(ticket, status=CLIENT_CLOSED, outcome="client_disconnected")
            raise
        except Exception:
            self._finish(ticket, status=500, outcome="gateway_error")
            raise

    def _admitted_after_all(self, task: asyncio.Future, name, endpoint, stream, started, prompt) -> None:
        """The client left during admission: a request that was admitted anyway is recorded as given up.

        Recording it settles its reservation (at no cost), which would
        otherwise stay on its budgets.
        """
        if task.cancelled() or task.exception() is not None:
            return
        admitted = task.result()
        if admitted.caller is not None:
            ticket = Ticket(admitted.caller, name, endpoint, stream, started, prompt, admitted.reserved)
            ticket.tokens_held = admitted.tokens_held
            self._finish(ticket, status=CLIENT_CLOSED, outcome="client_disconnected")

    @staticmethod
    def _estimate(model: ModelEntry, bounds: tuple[int, int]) -> int | None:
        """What the request may cost at most on ``model``, for the budget reservation; None: the model is free."""
        if model.price is None:
            return None
        return budgets.cost_micros(bounds[0], bounds[1], model.price)

    async def _hold(self, ticket: Ticket, model: ModelEntry) -> None:
        """Reserve ``model``'s price for this request before its engine is asked (see gateway.admission).

        The first hop was reserved by admission; a fallback at another price
        moves the reservation. Shielded: a client that leaves meanwhile
        cannot leave a reservation the ticket does not know of; its record
        waits for this to land (``_record``).
        """
        held = ticket.reserved[0][1] if ticket.reserved else 0
        estimate = self._estimate(model, ticket.bounds)
        if not ticket.caller.budget_ids or rules.adjustment(held, estimate) == 0:
            return
        ticket.holding = asyncio.ensure_future(self._move_hold(ticket, held, estimate))
        refused = await asyncio.shield(ticket.holding)
        if refused is not None:
            raise refused

    async def _move_hold(self, ticket: Ticket, held: int, estimate: int | None) -> errors.Refused | None:
        now, budget_ids = timezone.now(), ticket.caller.budget_ids
        held, refused = await self.readmit(ticket.caller, held, estimate, now)
        ticket.reserved = rules.reservation(budget_ids, held) if held else ()
        return refused

    async def _route(self, ticket: Ticket, entry: ModelEntry, snapshot: Snapshot, body: dict, send) -> None:
        prefix = router.prompt_prefix(body, self.conf.affinity_prefix_chars)
        if not snapshot.replicas.get(entry.id):
            # A replica marked ready since the last read is served now, not a second later.
            snapshot = await self.directory.refresh(newer_than=ticket.started)
        slot = None
        if entry.on_demand and not snapshot.replicas.get(entry.id):
            # Only a request with a place among its key's and team's waiting ones asks for a start.
            slot = await self.waiters.take(ticket.caller, entry.name)
            if slot.refused is None:
                await self._demand(entry)
        tried: set[str] = set()
        failures: list[str] = []
        # A fallback the key may not use is skipped, and never named to it.
        fallbacks = [snapshot.models[n] for n in entry.fallbacks if n in snapshot.models]
        fallbacks = [m for m in fallbacks if rules.hop_allowed(ticket.caller, m.name, m.aliases)]
        try:
            for model in [entry, *fallbacks]:
                if await self._try_model(ticket, model, snapshot, body, prefix, tried, failures, send):
                    return
            if entry.on_demand:
                slot = slot or await self.waiters.take(ticket.caller, entry.name)
                await self._serve_cold(ticket, entry, fallbacks, body, prefix, (tried, failures), slot, send)
                return
        finally:
            self._give_back(slot)
        self._no_replica(entry, fallbacks, failures)

    @staticmethod
    def _no_replica(entry: ModelEntry, fallbacks: list[ModelEntry], failures: list[str]) -> None:
        """Raise why ``entry`` could not be served: every replica failed, or none was ready."""
        if failures:
            raise errors.upstream_failed(
                f"every replica tried for {entry.name!r} failed before answering: " + "; ".join(failures[-3:])
            )
        names = " or its fallbacks " + ", ".join(m.name for m in fallbacks) if fallbacks else ""
        if entry.base:
            raise errors.unavailable(
                f"adapter {entry.name!r}{names} is not loaded on a ready replica of {entry.base!r} now; "
                "its agents load it as they hear of it, try again shortly"
            )
        raise errors.unavailable(f"model {entry.name!r}{names} has no ready replica now; try again shortly")

    async def _try_model(self, ticket, model, snapshot, body, prefix, tried, failures, send) -> bool:
        replicas = {r.id: r for r in snapshot.replicas.get(model.id, ())}
        if model.base:
            # An adapter's request goes only to its base's replicas that report it loaded: one without it
            # answers 404 (vLLM) or, worse, answers as the base model (llama.cpp's server falls back to its
            # first name), which a client asking for the adapter must never get.
            replicas = {i: r for i, r in replicas.items() if model.name in r.adapters}
        if not replicas:
            return False
        await self._hold(ticket, model)
        # It names the adapter upstream (the name its engine serves it under), and goes first to the
        # replicas that hold it without cost, llama.cpp's last (each switch there reloads the model).
        payloads: dict[tuple[str, str], bytes] = {}
        preferred = {r.id for r in replicas.values() if not (model.base and r.switch_reloads)}
        reloading = set(replicas) - preferred
        while True:
            replica_id = router.choose_preferring(
                list(replicas),
                preferred,
                self.in_flight,
                prefix,
                load_factor=self.conf.load_factor,
                exclude=tried,
                then=reloading,
            )
            if replica_id is None:
                return False
            tried.add(replica_id)
            replica = replicas[replica_id]
            self.in_flight[replica_id] += 1
            self.load.enter(model.serving)
            try:
                upstream_name = replica.upstream_name(model)
                # What each kind of engine is sent differs (gateway.fields), so a body is made per name and kind.
                made_for = (upstream_name, replica.engine)
                if made_for not in payloads:
                    payloads[made_for] = upstream_body(body, upstream_name, ticket, replica.engine)
                path, payload = upstream_path(ticket, replica), payloads[made_for]
                data = payload
                if path != "chat/completions" and ticket.original is not None:
                    # The client's own body for an engine that speaks its protocol, with the engine's name
                    # and one length bound (tokens.bounded).
                    native = fields.forwarded(ticket.original, path, replica.engine)
                    data = json.dumps(
                        tokens.bounded({**native, "model": upstream_name}, path, ticket.per_choice)
                    ).encode()
                url = f"{replica.endpoint}/v1/{path}"
                with gateway_tracing.exchange(replica.id, model.name, url) as exchange:
                    response = await self._open(replica, url, data, failures, exchange.headers())
                    if (
                        response is not None
                        and ticket.original is not None
                        and path == ticket.endpoint
                        and response.status == 404
                    ):
                        # An engine older than its kind's own Messages (vLLM before 0.11): translated for instead.
                        await response.read()
                        path = "chat/completions"
                        url = f"{replica.endpoint}/v1/{path}"
                        response = await self._open(replica, url, payload, failures, exchange.headers())
                    if response is None:
                        exchange.failed(failures[-1])
                    else:
                        await self._relay(ticket, model, replica, response, path, send, exchange)
                        return True
            finally:
                self.load.leave(model.serving)
                self.in_flight[replica_id] -= 1
                if self.in_flight[replica_id] <= 0:
                    del self.in_flight[replica_id]

    async def _open(self, replica: ReplicaEntry, url: str, payload: bytes, failures: list[str], headers=None):
        """The engine's response, headers read; None when it failed before answering.

        ``headers`` go to the engine as well (the trace's ``traceparent``).
        """
        try:
            response = await self.client.post(url, payload, headers=headers)
            if response.status >= 500:
                detail = (await response.read())[:200].decode(errors="replace")
                failures.append(f"replica {replica.id} answered {response.status} {detail}".strip())
                return None
        except (upstream.UpstreamError, OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            failures.append(f"replica {replica.id}: {exc}")
            return None
        return response

    async def _relay(
        self, ticket, model: ModelEntry, replica: ReplicaEntry, response, path: str, send, exchange=None
    ) -> None:
        """Pass the engine's answer on as it comes, translated to Messages where the client spoke it and the
        engine did not (``path`` is the engine's endpoint); ``exchange`` times it for the trace."""
        exchange = exchange or gateway_tracing.NO_EXCHANGE
        self.writer.touch(replica.id, timezone.now())
        content_type = response.headers.get("content-type", "application/json")
        streaming = content_type.startswith("text/event-stream")
        translate = ticket.original is not None and path != ticket.endpoint
        if translate and not streaming:
            content_type = "application/json"
        headers = [
            (b"content-type", content_type.encode()),
            (b"x-llmgw-replica", replica.id.encode()),
            (b"x-llmgw-model", model.name.encode()),
        ]
        original = ticket.original or {}
        stops = list(original.get("stop_sequences") or [])
        if translate and streaming and ticket.endpoint == "responses":
            meter = responses.ChatStream(model.name, original)
        elif translate and streaming:
            meter = anthropic.ChatStream(model.name, stops)
        elif path == "messages":
            meter = anthropic.NativeStream()
        else:
            meter = tokens.StreamMeter(drop_usage_chunk=ticket.drop_usage_chunk)
        ttfb = None
        status, outcome, usage, text = response.status, "ok", None, ""
        if status >= 400:
            outcome = "engine_refused"
        try:
            if streaming:
                await send({"type": "http.response.start", "status": status, "headers": headers})
                async for chunk in response.stream():
                    if ttfb is None:
                        ttfb = time.monotonic()
                        exchange.first_byte()
                    out = meter.feed(chunk)
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                await send({"type": "http.response.body", "body": meter.tail(), "more_body": False})
                usage = meter.usage
            else:
                data = await response.read()
                ttfb = time.monotonic()
                exchange.first_byte()
                if path == "messages":
                    usage, text = usage_of_message(data)
                else:
                    usage, text = usage_of_body(data)
                if translate and ticket.endpoint == "responses":
                    data = as_response(status, data, model.name, original)
                elif translate:
                    data = as_message(status, data, model.name, stops)
                headers.append((b"content-length", str(len(data)).encode()))
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": data})
        except asyncio.CancelledError:
            status, outcome = CLIENT_CLOSED, "client_disconnected"
            raise
        except (upstream.UpstreamError, OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            # Headers are gone already: all that is left is to end the answer.
            status, outcome = 502, "upstream_broke"
            log.warning("gateway: replica %s broke off mid-answer: %s", replica.id, exc)
            ending = meter.broken(f"the engine broke off mid-answer: {exc}") if streaming else b""
            await send({"type": "http.response.body", "body": ending, "more_body": False})
        finally:
            await response.close()
            exchange.end(status, outcome, streaming)
            self._finish(
                ticket,
                status=status,
                outcome=outcome,
                model=model,
                replica=replica,
                usage=usage,
                completion_guess=meter.text_chunks if streaming else tokens.estimate(text),
                ttfb=ttfb,
            )
