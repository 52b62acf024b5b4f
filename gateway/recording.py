"""What the gateway records of each request: its tokens (the engine's count, else its own), cost, outcome, timing.

Whatever happened (an answer, a refusal, a client that left) a request is
recorded once, from a background task, and the budget reservations and the
tokens per minute it held are settled at what it used. :class:`Recording`
is a part of gateway.proxy.Gateway, which it is mixed into.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from core import tracing
from gateway import (
    tokens,
)
from gateway.writes import budgets
from gateway.writes.usage import CLIENT_CLOSED, MAX_COST, MAX_TOKENS, Finished, engine_count, engine_usage

if TYPE_CHECKING:
    from gateway.proxy import Ticket

log = logging.getLogger("llmgw.gateway")


class Recording:
    """Gateway's methods that record a finished request."""

    def _finish(
        self,
        ticket: Ticket,
        *,
        status: int,
        outcome: str,
        model=None,
        replica=None,
        usage=None,
        completion_guess: int = 0,
        ttfb: float | None = None,
    ) -> None:
        if ticket.done:
            return
        ticket.done = True
        task = asyncio.ensure_future(
            self._record(ticket, status, outcome, model, replica, usage, completion_guess, ttfb, time.monotonic())
        )
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _record(self, ticket, status, outcome, model, replica, usage, completion_guess, ttfb, ended) -> None:
        with tracing.span("gateway.usage_write", {"llmgw.outcome": outcome}, parent=ticket.trace):
            await self._write_usage(ticket, status, outcome, model, replica, usage, completion_guess, ttfb, ended)

    async def _write_usage(self, ticket, status, outcome, model, replica, usage, completion_guess, ttfb, ended) -> None:
        if ticket.holding is not None:
            # A hop's reservation may still be landing: settle what it holds (see _hold).
            await asyncio.gather(ticket.holding, return_exceptions=True)
        counted_by = "engine"
        usage = engine_usage(usage)
        if usage is None:
            prompt = completion = 0
            # An engine that refused the request (4xx: a bad body, a context too long) generated
            # nothing and read nothing it will bill for: the request costs nothing. A client
            # that hung up (CLIENT_CLOSED) is another matter: the engine worked until then.
            refused_by_engine = 400 <= status < 500 and status != CLIENT_CLOSED
            if replica is not None and not refused_by_engine:
                counted_by = "llmgw"
                completion = min(completion_guess, MAX_TOKENS)
                counted = await tokens.count_prompt(self.client, replica.endpoint, model.name, ticket.prompt)
                prompt = engine_count(counted)
                if prompt is None:
                    prompt = min(tokens.estimate(ticket.prompt), MAX_TOKENS)
        else:
            prompt, completion = usage
        reported = (prompt, completion)
        (prompt, completion), clamped = tokens.within(reported, ticket.bounds)
        if clamped:
            log.warning(
                "gateway: replica %s counted %s tokens (prompt, completion) past the request's bounds %s; "
                "recorded at the bounds",
                replica.id if replica else "-",
                reported,
                ticket.bounds,
            )
        cost = min(budgets.cost_micros(prompt, completion, model.price if model else None), MAX_COST)
        if model is not None:
            self.load.finished(model.name, completion, None if ttfb is None else (ttfb - ticket.started) * 1000)
        self.writer.add(
            Finished(
                at=ticket.at,
                caller=ticket.caller,
                requested=ticket.requested,
                model=model.name if model else "",
                replica_id=replica.id if replica else "",
                endpoint=ticket.endpoint,
                stream=ticket.stream,
                prompt_tokens=prompt,
                completion_tokens=completion,
                counted_by=counted_by,
                cost_micros=cost,
                status=status,
                outcome=outcome,
                latency_ms=(ended - ticket.started) * 1000,
                ttfb_ms=None if ttfb is None else (ttfb - ticket.started) * 1000,
                reserved=ticket.reserved,
                clamped=clamped,
            )
        )
        await self.limiter.settle(ticket.tokens_held, prompt + completion)
