"""The gateway's overhead: llmgw and LiteLLM's proxy against the same fast fake engine.

In one go, on this machine:

1. a fast fake OpenAI-compatible engine (tests/gateway/fake_engine.py, asyncio,
   a subprocess);
2. clients straight to it: the floor;
3. through llmgw: ``llmgw serve --no-worker`` on PostgreSQL (a fresh
   ``llmgw_bench_gateway`` database), with a key, a price, a team budget and
   a ready replica row pointing at the fake engine, so every request pays
   for authentication, budget reservation, routing and usage records; its
   gateway listener is ``--workers`` uvicorn processes (default 1);
3b. the same gateway application under daphne (the admin listener's
   server), the alternative measured (``--no-alternatives`` leaves it out);
4. through LiteLLM's proxy, installed in its own virtual environment under
   ``--litellm-venv`` (made when missing; if that fails the reason is printed
   and the rest goes on), pointed at the same engine;
4b. Anthropic's ``/v1/messages``, plain and streamed, through llmgw (the
   key as ``x-api-key``) and through LiteLLM's own ``/v1/messages``, both
   translating for the same fake engine, which speaks chat completions only
   (llmgw's replica has no engine that serves Messages natively, and
   LiteLLM's model is an ``openai/`` one, which LiteLLM would send to the
   Responses API unless told to use chat completions, as it is here with
   ``LITELLM_USE_CHAT_COMPLETIONS_URL_FOR_ANTHROPIC_MESSAGES``; the fake
   engine has no ``/v1/responses``); printed against LiteLLM and
   against the direct chat path, in the same run (``--no-messages`` leaves
   it out);
5. with ``--tracing``, what traces cost: ``llmgw-traced`` is the same server
   with OTEL_EXPORTER_OTLP_ENDPOINT at a collector that discards
   (bench/otlp_sink.py), every request traced; ``llmgw-untraced`` the
   gateway as it was before tracing was added (``git archive`` of
   ``--untraced-rev``, by default the parent of the commit that added
   core/tracing.py), the baseline. ``llmgw`` is tracing off (no endpoint):
   its ratio to the baseline is what off costs.

For each path, plain and streaming: requests per second at ``--concurrency``
for ``--seconds``; latency p50/p99 one request at a time, and what the path
adds to the direct one; time to first byte of a stream. Each is printed as a
ratio to the direct path and to LiteLLM. The load generator is a minimal
keep-alive HTTP/1.1 client so it costs every path the same, little CPU.

    python bench/gateway.py --seconds 10 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core import tracing  # noqa: E402
from gateway import tracing as gateway_tracing  # noqa: E402

PG = "postgresql://postgres@127.0.0.1:5432"
DB = os.environ.get("LLMGW_BENCH_GATEWAY_DB", "llmgw_bench_gateway")  # dropped and made again on each run
# 1.107.0 was a compromised release: pinned to one before it.
LITELLM = "litellm[proxy]==1.106.12"
MODEL = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"exited with {proc.returncode} before answering {url}\n{tail}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f}s")


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# --- the load generator -------------------------------------------------------


class Conn:
    """One keep-alive HTTP/1.1 connection; just enough of the protocol for these answers."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, float, float]:
        """Status, seconds to the first body byte, seconds to the end."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\ncontent-length: {len(body)}\r\n"
        head += "content-type: application/json\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        started = time.perf_counter()
        self.writer.write(head.encode() + b"\r\n" + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        first = None
        if "content-length" in fields:
            await self.reader.readexactly(int(fields["content-length"]))
            first = time.perf_counter()
        else:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                await self.reader.readexactly(size + 2)
                if first is None:
                    first = time.perf_counter()
                if size == 0:
                    break
        if fields.get("connection", "").lower() == "close":
            self.writer.close()
            self.writer = None
        end = time.perf_counter()
        return status, first - started, end - started


@dataclass
class Target:
    name: str
    port: int
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    protocol: str = "chat"
    """``chat`` (OpenAI's chat completions) or ``messages`` (Anthropic's Messages): the body it is sent."""


@dataclass
class Result:
    rps: float = 0.0
    p50: float = 0.0
    p99: float = 0.0
    ttfb50: float = 0.0
    errors: int = 0


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def body(stream: bool, i: int, protocol: str = "chat") -> bytes:
    # Each request its own prompt, as clients send, so no path can cache an answer.
    if protocol == "messages":
        # The same request in Anthropic's shape: the system prompt beside the turns, max_tokens required.
        turns = [{"role": "user", "content": f"question {i}"}]
        return json.dumps(
            {"model": MODEL, "system": "You are terse.", "messages": turns, "stream": stream, "max_tokens": 16}
        ).encode()
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": f"question {i}"}]
    return json.dumps({"model": MODEL, "messages": messages, "stream": stream, "max_tokens": 16}).encode()


async def measure(target: Target, stream: bool, seconds: float, concurrency: int, serial: int) -> Result:
    result = Result()
    conn = Conn("127.0.0.1", target.port)
    latencies, firsts = [], []
    for i in range(serial + 20):
        status, first, total = await conn.post(target.path, body(stream, i, target.protocol), target.headers)
        if i >= 20:  # the first ones warm the path up
            latencies.append(total)
            firsts.append(first)
        result.errors += status != 200
    result.p50, result.p99, result.ttfb50 = (
        percentile(latencies, 0.5),
        percentile(latencies, 0.99),
        percentile(firsts, 0.5),
    )
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        nonlocal done
        c = Conn("127.0.0.1", target.port)
        i = 0
        while time.perf_counter() < deadline:
            status, _, _ = await c.post(target.path, body(stream, w * 1_000_000 + i, target.protocol), target.headers)
            i += 1
            done += 1
            result.errors += status != 200

    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    result.rps = done / (time.perf_counter() - started)
    return result


# --- the three paths ------------------------------------------------------------


def start_engine(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.gateway.fake_engine", "--port", str(port), "--tokens", "16"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_http(f"http://127.0.0.1:{port}/v1/models", 20, proc)
    return proc


def prepare_llmgw(engine_url: str, data: Path) -> tuple[dict[str, str], str]:
    """A fresh database with a model, a price, a budget, a ready replica and a key; the env and the key."""
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    env = {
        "LLMGW_DATA_DIR": str(data),
        "LLMGW_DATABASE_URL": f"{PG}/{DB}",
    }
    script = f"""
from django.core.management import call_command
call_command("migrate", verbosity=0)
from catalog.models import CatalogModel
from placement.models import Replica
from gateway.writes import keys
from gateway.models import Budget, Price
m = CatalogModel.objects.create(name={MODEL!r}, min_replicas=1, max_replicas=1)
Price.objects.create(model=m, prompt_micros_per_million=100_000, completion_micros_per_million=300_000)
Replica.objects.create(model=m, profile_name="bench", state="ready", endpoint={engine_url!r})
issued = keys.issue(team="bench", org="bench")
Budget.objects.create(scope="team", team=issued.key.team, amount_micros=10**15, period="month")
print(issued.secret)
"""
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return env, out.stdout.strip().splitlines()[-1]


def launch(cmd: list[str], env: dict[str, str], log: Path, ready_url: str, cwd: Path = ROOT) -> subprocess.Popen:
    """Start one of llmgw's servers with ``env`` over a clean environment; return once ``ready_url`` answers."""
    # Traced only where ``env`` asks: an OTEL_* of the bench's own shell would trace every path.
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGW_", "OTEL_"))}
    full.update(env, DJANGO_SETTINGS_MODULE="llmgw.settings")
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=full, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )
    wait_http(ready_url, 60, proc, log)
    return proc


def start_llmgw(
    env: dict[str, str], admin: int, gateway: int, log: Path, workers: int = 1, tree: Path = ROOT
) -> subprocess.Popen:
    """``llmgw serve --no-worker`` with the code in ``tree`` (this checkout, or an older one for a baseline)."""
    addrs = {
        "LLMGW_ADMIN_ADDR": f"127.0.0.1:{admin}",
        "LLMGW_GATEWAY_ADDR": f"127.0.0.1:{gateway}",
        "LLMGW_GATEWAY_WORKERS": str(workers),
    }
    if tree != ROOT:
        addrs["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, "-m", "llmgw.cli", "serve", "--no-worker"]
    return launch(cmd, {**env, **addrs}, log, f"http://127.0.0.1:{admin}/healthz", cwd=tree)


# --- what traces cost ---------------------------------------------------------------


def untraced_rev() -> str:
    """The commit before the one that added core/tracing.py: the gateway without any tracing code."""
    added = subprocess.run(
        ["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%H", "-1", "--", "core/tracing.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not added:
        raise RuntimeError("no commit adds core/tracing.py here: name the baseline with --untraced-rev")
    return f"{added}^"


def checkout(rev: str, into: Path) -> Path:
    """``rev``'s files (``git archive``), to run the baseline from."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def start_sink(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.otlp_sink", "--port", str(port)], cwd=ROOT, start_new_session=True
    )
    wait_http(f"http://127.0.0.1:{port}/count", 20, proc)
    return proc


def tracing_targets(args, env: dict[str, str], key: str, work: Path, procs: list) -> list[Target]:
    """``llmgw-traced`` (every request traced, to a discarding collector) and ``llmgw-untraced`` (the baseline)."""
    auth = {"authorization": f"Bearer {key}"}
    sink = free_port()
    procs.append(start_sink(sink))
    traced_env = {
        **env,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink}",
        "OTEL_SERVICE_NAME": "llmgw-bench",
        "OTEL_TRACES_SAMPLER": "always_on",
    }
    traced = free_port()
    procs.append(start_llmgw(traced_env, free_port(), traced, work / "traced.log", args.workers))
    rev = args.untraced_rev or untraced_rev()
    tree = checkout(rev, work / "untraced")
    untraced = free_port()
    procs.append(start_llmgw(env, free_port(), untraced, work / "untraced.log", args.workers, tree))
    short = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True, text=True)
    print(f"untraced baseline: {rev} ({short.stdout.strip()})")
    return [
        Target("llmgw-traced", traced, "/v1/chat/completions", auth),
        Target("llmgw-untraced", untraced, "/v1/chat/completions", auth),
    ]


def hooks_off_ns(rounds: int = 200_000) -> float:
    """Nanoseconds one request spends in the tracing hooks with tracing off (this process has no endpoint)."""
    tracing.shutdown()
    url = "http://127.0.0.1:1/v1/chat/completions"

    def one_request() -> None:
        # The calls gateway/proxy.py makes on one request, attributes built as it builds them.
        with tracing.span("gateway.admission", {"llmgw.requested": MODEL, "llmgw.endpoint": "chat/completions"}):
            pass
        tracing.context()
        with tracing.span("gateway.route", {"llmgw.model": MODEL}), gateway_tracing.exchange("r1", MODEL, url) as ex:
            ex.headers()
            ex.first_byte()
            ex.end(200, "ok", True)
        with tracing.span("gateway.usage_write", {"llmgw.outcome": "ok"}, parent=None):
            pass

    started = time.perf_counter_ns()
    for _ in range(rounds):
        one_request()
    return (time.perf_counter_ns() - started) / rounds


def measure_tracing(args, targets: list[Target]) -> dict[str, dict[bool, Result]]:
    """Each of llmgw (off), traced (on) and untraced in turn, ``--tracing-rounds`` times: the medians.

    In turns, the order rotating, so that a neighbour's load on a shared
    machine falls on all three alike rather than on whichever ran then.
    """
    runs: dict[str, dict[bool, list[Result]]] = {t.name: {False: [], True: []} for t in targets}
    seconds = max(1.0, args.seconds / 2)
    for i in range(args.tracing_rounds):
        turn = targets[i % len(targets) :] + targets[: i % len(targets)]
        for stream in (False, True):
            for target in turn:
                result = asyncio.run(measure(target, stream, seconds, args.concurrency, args.serial // 2))
                runs[target.name][stream].append(result)
        print(f"  measured tracing round {i + 1} of {args.tracing_rounds}", flush=True)
    return {name: {stream: median_of(results) for stream, results in by.items()} for name, by in runs.items()}


def median_of(results: list[Result]) -> Result:
    def mid(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    return Result(
        rps=mid([r.rps for r in results]),
        p50=mid([r.p50 for r in results]),
        p99=mid([r.p99 for r in results]),
        ttfb50=mid([r.ttfb50 for r in results]),
        errors=sum(r.errors for r in results),
    )


def report_tracing(results: dict[str, dict[bool, Result]], off_ns: float) -> None:
    base = results["llmgw-untraced"]
    rounds = "median of the rounds, each path in turn"
    print(f"\ntraces: each path against the untraced baseline (llmgw before tracing), in this run ({rounds})")
    print("path           kind       req/s ×base |  p50 ms ×base |  p99 ms ×base | ttfb p50 ms ×base")
    labels = {"llmgw-untraced": "untraced", "llmgw": "llmgw (off)", "llmgw-traced": "llmgw (on)"}
    for name, label in labels.items():
        for stream in (False, True):
            r, b = results[name][stream], base[stream]
            print(
                f"{label:14} {'streaming' if stream else 'plain':9} {r.rps:6.0f} {ratio(r.rps, b.rps)} |"
                f" {ms(r.p50)} {ratio(r.p50, b.p50)} | {ms(r.p99)} {ratio(r.p99, b.p99)} |"
                f"     {ms(r.ttfb50)} {ratio(r.ttfb50, b.ttfb50)}"
            )
    plain = base[False].p50 * 1e9
    print(
        f"off, the hooks one request runs cost {off_ns:.0f} ns"
        f" ({off_ns / plain * 100:.3f} % of the baseline's plain p50 of {plain / 1e6:.2f} ms)"
    )


def start_llmgw_daphne(env: dict[str, str], gateway: int, log: Path) -> subprocess.Popen:
    """The same gateway application under daphne, the admin listener's server: the alternative, measured."""
    addrs = {"LLMGW_ADMIN_ADDR": f"127.0.0.1:{free_port()}", "LLMGW_GATEWAY_ADDR": f"127.0.0.1:{gateway}"}
    cmd = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(gateway), "llmgw.asgi_gateway:application"]
    return launch(cmd, {**env, **addrs}, log, f"http://127.0.0.1:{gateway}/healthz")


def litellm_bin(venv: Path) -> Path | None:
    """LiteLLM's proxy command, installed when missing; None (with the reason printed) when it cannot be."""
    exe = venv / "bin" / "litellm"
    if exe.exists():
        return exe
    print(f"installing {LITELLM} into {venv} (once; a few minutes) …", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", LITELLM], check=True, capture_output=True, text=True
        )
    except subprocess.CalledProcessError as exc:
        print(f"LiteLLM could not be installed, so it is left out: {(exc.stderr or str(exc)).strip()[-500:]}")
        return None
    return exe if exe.exists() else None


def start_litellm(exe: Path, engine_url: str, port: int, work: Path, master_key: str) -> subprocess.Popen:
    config = work / "litellm.yaml"
    config.write_text(
        json.dumps(
            {
                "model_list": [
                    {
                        "model_name": MODEL,
                        "litellm_params": {"model": f"openai/{MODEL}", "api_base": f"{engine_url}/v1", "api_key": "x"},
                    }
                ],
                "litellm_settings": {"telemetry": False, "set_verbose": False},
            }
        )
    )
    log = work / "litellm.log"
    # A master key, as LiteLLM insists: without a database it is the only key,
    # compared on every request, which is LiteLLM's cheapest authentication.
    env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "LITELLM_MASTER_KEY": master_key}
    # Its /v1/messages translated to chat completions, as llmgw's is for this engine (see 4b.).
    env["LITELLM_USE_CHAT_COMPLETIONS_URL_FOR_ANTHROPIC_MESSAGES"] = "true"
    proc = subprocess.Popen(
        [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
        cwd=work,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_http(f"http://127.0.0.1:{port}/health/liveliness", 180, proc, log)
    return proc


# --- the report -------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.2f}"


def ratio(a: float, b: float | None) -> str:
    return f"{a / b:5.2f}×" if b else "    -"


def report(results: dict[str, dict[bool, Result]], direct: dict[bool, Result] | None = None, what: str = "") -> None:
    """One table per kind; ``direct`` is what ×direct and +p50 compare with (the results' own, else given:
    Messages are compared with direct chat, the same engine work)."""
    direct = direct or results["direct"]
    litellm = results.get("litellm")
    for stream in (False, True):
        kind = "streaming" if stream else "plain"
        print(f"\n{what}{kind} (16 completion tokens{', one event each' if stream else ''})")
        print(
            "path        req/s  ×direct ×litellm |  p50 ms  p99 ms | +p50 ms +p99 ms | ttfb p50 ms  ×direct ×litellm"
            " | errors"
        )
        for name, by_kind in results.items():
            r, d = by_kind[stream], direct[stream]
            lit = litellm[stream] if litellm else None
            print(
                f"{name:13} {r.rps:6.0f}  {ratio(r.rps, d.rps)}   {ratio(r.rps, lit.rps if lit else None)} |"
                f" {ms(r.p50)} {ms(r.p99)} | {ms(r.p50 - d.p50)} {ms(r.p99 - d.p99)} |"
                f"     {ms(r.ttfb50)}   {ratio(r.ttfb50, d.ttfb50)}   {ratio(r.ttfb50, lit.ttfb50 if lit else None)}"
                f" | {r.errors}"
            )


def measure_all(targets: list[Target], args, what: str = "") -> dict[str, dict[bool, Result]]:
    """Each target plain and streamed, one after the other, by name."""
    results: dict[str, dict[bool, Result]] = {}
    for target in targets:
        results[target.name] = {}
        for stream in (False, True):
            results[target.name][stream] = asyncio.run(
                measure(target, stream, args.seconds, args.concurrency, args.serial)
            )
            print(f"  measured {target.name} {what}{'streaming' if stream else 'plain'}", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="load per path and kind")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--serial", type=int, default=300, help="requests one at a time, for latency")
    parser.add_argument(
        "--litellm-venv", type=Path, default=Path(tempfile.gettempdir()) / "llmgw-bench" / "litellm-venv"
    )
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--no-messages", action="store_true", help="leave out /v1/messages (4b.)")
    parser.add_argument("--workers", type=int, default=1, help="LLMGW_GATEWAY_WORKERS for llmgw's path")
    parser.add_argument("--no-alternatives", action="store_true", help="leave out llmgw's app under daphne")
    parser.add_argument(
        "--tracing", action="store_true", help="also llmgw traced and llmgw before tracing, the baseline (see 5.)"
    )
    parser.add_argument("--tracing-rounds", type=int, default=5, help="turns of off, on and the baseline")
    parser.add_argument("--untraced-rev", help="the baseline's commit (default: the one before core/tracing.py)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-gateway-"))
    procs: list[subprocess.Popen] = []
    try:
        engine_port = free_port()
        procs.append(start_engine(engine_port))
        engine_url = f"http://127.0.0.1:{engine_port}"
        env, key = prepare_llmgw(engine_url, work / "data")
        gateway_port = free_port()
        procs.append(start_llmgw(env, free_port(), gateway_port, work / "serve.log", args.workers))
        targets = [
            Target("direct", engine_port, "/v1/chat/completions"),
            Target("llmgw", gateway_port, "/v1/chat/completions", {"authorization": f"Bearer {key}"}),
        ]
        if not args.no_alternatives:
            daphne_port = free_port()
            procs.append(start_llmgw_daphne(env, daphne_port, work / "daphne.log"))
            targets.append(
                Target("llmgw-daphne", daphne_port, "/v1/chat/completions", {"authorization": f"Bearer {key}"})
            )

        traces = tracing_targets(args, env, key, work, procs) if args.tracing else []

        messages = (
            [] if args.no_messages else [Target("llmgw", gateway_port, "/v1/messages", {"x-api-key": key}, "messages")]
        )
        exe = None if args.no_litellm else litellm_bin(args.litellm_venv)
        if exe is not None:
            litellm_port = free_port()
            master = "sk-bench-" + os.urandom(12).hex()
            try:
                procs.append(start_litellm(exe, engine_url, litellm_port, work, master))
                bearer = {"authorization": f"Bearer {master}"}
                targets.append(Target("litellm", litellm_port, "/v1/chat/completions", bearer))
                if not args.no_messages:
                    messages.append(Target("litellm", litellm_port, "/v1/messages", bearer, "messages"))
            except RuntimeError as exc:
                print(f"LiteLLM's proxy did not start, so it is left out: {str(exc)[-800:]}")
        print(f"cores: {os.cpu_count()}; every process shares them (engine, llmgw, LiteLLM, PostgreSQL, this client)")
        print(f"load: {args.concurrency} connections for {args.seconds:g}s; latency: {args.serial} requests one by one")
        results = measure_all(targets, args)
        message_results = measure_all(messages, args, "/v1/messages ")
        report(results)
        if message_results:
            what = "/v1/messages, translated to chat for the engine; ×direct and + against direct chat: "
            report(message_results, results["direct"], what)
        if traces:
            report_tracing(measure_tracing(args, [targets[1], *traces]), hooks_off_ns())
        usage = subprocess.run(
            ["psql", f"{PG}/{DB}", "-Atc", "select count(*), sum(completion_tokens) from gateway_usagerecord"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        print(f"\nllmgw recorded (requests|completion tokens): {usage}")
    finally:
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
