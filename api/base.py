"""What every admin API view shares: who may call it, how bodies are read, who made a change.

- Authentication is the project's (a bearer token, or an admin session).
  Nothing here answers without one.
- Each endpoint and method needs the Django model permissions core.access
  names, held by the user behind the token or session at this request;
  only active staff get anywhere, and a read-only token only reads.
- A JSON body is at most 1 MiB (413 past it), must be valid JSON nested at
  most 64 levels (400; read by core.jsonbody, the reader every listener
  shares) and may not carry strings the store cannot hold (a NUL, a lone
  surrogate): a client must never be able to provoke a 500.
- Every change is written to the audit log with its actor: ``X-Llmgw-Actor``
  when the caller names one (ctl sends the operator's login), else the
  token owner's username; the entry also names the account and token behind
  it. The header is checked before the view runs, so a header the log cannot
  hold is refused before anything is written, never after.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import orjson
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse, StreamingHttpResponse
from rest_framework import exceptions, permissions
from rest_framework.parsers import JSONParser
from rest_framework.utils.encoders import JSONEncoder
from rest_framework.views import APIView

from core import jsonbody, storable
from core.auth import DoorPermission
from core.models import ACTOR_MAX, ApiToken, AuditEntry, audited_as, fit_audit_text

JSON_BODY_LIMIT = 1024 * 1024
ACTOR_HEADER = "HTTP_X_LLMGW_ACTOR"

__all__ = [
    "ACTOR_MAX",
    "JSON_BODY_LIMIT",
    "ApiView",
    "DoorPermission",
    "Refused",
    "TooLarge",
    "dumps",
    "streamed_list",
    "unstorable",
]


class Refused(exceptions.APIException):
    """A refusal with its status and the sentence that says what to fix."""

    def __init__(self, status: int, message: str) -> None:
        self.status_code = status
        super().__init__(detail=message)


class TooLarge(Refused):
    def __init__(self, size: int | None = None) -> None:
        got = f"the body is {size} bytes" if size is not None else "the body is too large"
        super().__init__(413, f"{got}; at most {JSON_BODY_LIMIT} bytes (1 MiB) of JSON are accepted here")


class LimitedJSONParser(JSONParser):
    """JSON of at most 1 MiB, with nothing in it the database would refuse."""

    def parse(self, stream, media_type=None, parser_context=None):
        request = (parser_context or {}).get("request")
        length = request.META.get("CONTENT_LENGTH") if request is not None else None
        if length and str(length).isdigit() and int(length) > JSON_BODY_LIMIT:
            raise TooLarge(int(length))
        raw = stream.read(JSON_BODY_LIMIT + 1) if stream is not None else b""
        if len(raw) > JSON_BODY_LIMIT:
            raise TooLarge()
        try:
            data = jsonbody.loads(raw) if raw.strip() else {}
        except jsonbody.BodyError as exc:
            raise Refused(400, str(exc)) from None
        if problem := unstorable(data):
            raise Refused(400, problem)
        return data


def unstorable(value: Any, where: str = "the body") -> str | None:
    """Why a value cannot be stored (core.storable: NUL characters, lone surrogates, NaN or infinity), or None."""
    problem = next(storable.problems(value, where), None)
    return None if problem is None else _UNSTORABLE[problem.kind].format(where=where)


_UNSTORABLE = {
    storable.NUL: "{where} contains a NUL character, which no name, path or setting may hold",
    storable.SURROGATE: "{where} contains an unpaired surrogate (\\ud800-\\udfff), which is not valid text",
    # Python's reader accepts NaN and Infinity; JSON (and PostgreSQL's jsonb) has neither.
    storable.NOT_FINITE: "{where} contains NaN or Infinity, which is not a JSON number; send a finite number",
}


class ApiView(APIView):
    """The base of every admin API view."""

    permission_classes = [DoorPermission]
    parser_classes = [LimitedJSONParser]

    def dispatch(self, request, *args, **kwargs):
        # Every audit row written while this request is served — by the view, the
        # catalog's service, node states — names the account and token behind it.
        with audited_as({}) as self._who:
            return super().dispatch(request, *args, **kwargs)

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        self._who.update(self.caller(request))
        if request.method not in permissions.SAFE_METHODS:
            # Read now, whether or not the view uses it: a body this base refuses (too large,
            # too deep, not JSON) is refused on every write endpoint alike, before any change.
            request.data  # noqa: B018
        # Path and query text reaches database queries; refuse what PostgreSQL would fail on.
        for name, value in [*kwargs.items(), *request.query_params.items()]:
            if problem := unstorable(value, f"{name!r}"):
                raise Refused(400, problem)
        if problem := unstorable(request.META.get(ACTOR_HEADER, ""), "the X-Llmgw-Actor header"):
            raise Refused(400, problem)

    def body(self, request) -> dict[str, Any]:
        """The JSON body, which must be an object."""
        data = request.data
        if not isinstance(data, dict):
            raise Refused(400, f"the body must be a JSON object, not {type(data).__name__}")
        return data

    @staticmethod
    def actor(request) -> str:
        """Who made a change: the X-Llmgw-Actor header when sent, else the token owner's username.

        Fitted by the audit log's one rule (one line, at most ACTOR_MAX characters), so what a
        view records elsewhere (``measured_by``, ``requested_by``) is what the log says.
        """
        named = fit_audit_text(request.META.get(ACTOR_HEADER, ""), ACTOR_MAX)
        return named or request.user.get_username()

    @staticmethod
    def caller(request) -> dict[str, str]:
        """The account and token behind a request, as every audit row of the API records them."""
        who = {"via": "api", "user": request.user.get_username()}
        if isinstance(request.auth, ApiToken):
            who["token"] = request.auth.hint
        return who

    def audit(self, request, action: str, target: str, **detail: Any) -> AuditEntry:
        """Write one change to the audit log, with the account and token behind it."""
        return AuditEntry.record(self.actor(request), action, target, detail)


# What json.dumps(item, cls=JSONEncoder, ensure_ascii=False, separators=(",", ":")) builds for every
# call; built once, since the node listing encodes one item per node.
_ENCODER = JSONEncoder(ensure_ascii=False, separators=(",", ":"))
# Types orjson would encode its own way are handed to DRF's encoder's default instead, which
# writes them as DRF does (a datetime in UTC ends in Z, say); a str or int subclass (an enum)
# is one DRF's default does not know, so that item is encoded by DRF's encoder whole.
_ORJSON = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


def dumps(item: Any) -> str:
    """One item's JSON as DRF's renderer encodes an answer (compact; UTF-8 once encoded).

    By orjson, which the node listing's ten thousand items took a fifth of
    the time of json's C encoder to encode (bench/nodes_listing.py). The text
    is json's, byte for byte, for strings, ints, booleans, None, lists, dicts
    with string keys and every float but those between 1e-9 and 1e-4 in size,
    which it writes in another form with the same value (``0.0000999``
    where json writes ``9.99e-05``). A NaN or an infinity is ``null``, where
    json writes ``NaN``, which no strict JSON parser reads. What orjson
    refuses (an int past 64 bits, a key that is not a string) is encoded by
    DRF's encoder. Tested against DRF's encoder over any such value
    (tests/api/test_dumps.py, hypothesis).
    """
    try:
        return orjson.dumps(item, default=_ENCODER.default, option=_ORJSON).decode()
    except orjson.JSONEncodeError:
        return _ENCODER.encode(item)


def _array_chunks(pages: Iterable[list[Any]], encoded: bool = False) -> Iterator[bytes]:
    """A JSON array's bytes, one chunk a page; each item :func:`dumps`'d, or (``encoded``) already its JSON text."""
    yield b"["
    first = True
    for page in pages:
        if not page:
            continue
        text = ",".join(page if encoded else map(dumps, page))
        yield (text if first else "," + text).encode()
        first = False
    yield b"]"


async def _in_thread(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Each chunk built in the request's thread (the pages read the database), handed to the server as it is."""
    while (chunk := await sync_to_async(next, thread_sensitive=True)(chunks, None)) is not None:
        yield chunk


def streamed_list(request, pages: Iterable[list[Any]], encoded: bool = False) -> HttpResponse | StreamingHttpResponse:
    """A JSON array answered page by page as ``pages`` reads them, so memory holds one page, not the list.

    Streamed under ASGI, which every server llmgw runs, through an async
    iterator (Django reads a sync one whole before sending any of it). Once
    the first chunk is out the status is sent, so a page that fails later
    cuts the answer short: the client sees JSON that does not parse. Under
    WSGI (Django's test client) the same chunks are joined into one answer.
    ``encoded``: each page's items are already their JSON text (by :func:`dumps`).
    """
    chunks = _array_chunks(pages, encoded)
    if isinstance(getattr(request, "_request", request), ASGIRequest):
        return StreamingHttpResponse(_in_thread(chunks), content_type="application/json")
    return HttpResponse(b"".join(chunks), content_type="application/json")
