"""Configuration read from the environment, checked before Django starts.

Every setting has a default that works on one machine, so a fresh clone runs
with no variables at all. A value that is set but cannot be used stops
start-up with :class:`ConfigError`, which names the variable and says why; the
command line prints that one sentence instead of a traceback.

This module imports nothing from Django: the settings module and the ``llmgw``
command both call :func:`load`, and the command must be able to report a bad
value before Django is configured.
"""

from __future__ import annotations

import ipaddress
import math
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

DEFAULT_ADMIN_ADDR = "127.0.0.1:8000"
DEFAULT_GATEWAY_ADDR = "127.0.0.1:8080"
SECRET_KEY_FILE = "secret-key"


class ConfigError(Exception):
    """A setting that was given but cannot be used.

    ``variable`` is the environment variable at fault, ``reason`` what is
    wrong with it in words an operator can act on.
    """

    def __init__(self, variable: str, reason: str) -> None:
        super().__init__(f"{variable}: {reason}")
        self.variable = variable
        self.reason = reason


@dataclass(frozen=True)
class Address:
    """A host and port to listen on."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url_host(self) -> str:
        """The address as a client would write it in a URL.

        A wildcard bind address is not somewhere a client can connect to, so
        the loopback address stands in for it.
        """
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


@dataclass(frozen=True)
class ListenerLimits:
    """What one connection may hold or take of a listener's process: the same for the admin and gateway listeners.

    uvicorn with httptools bounds none of these by itself (llmgw.listener_protocol
    says how each is held); docs/operations.md says what a client sees of each.
    """

    head_bytes: int = 32 * 1024
    """A request head (its request line and headers) larger than this is refused with a 431."""
    head_timeout_s: float = 10.0
    """From a connection's opening, or a request's first byte, to the end of its head."""
    body_timeout_s: float = 60.0
    """From the end of a request's head to the end of its body (8 MB, the gateway's largest, at 140 kB/s)."""
    keep_alive_s: float = 5.0
    """How long a connection may stay idle between an answer and its next request."""
    connections: int = 16_384
    """Connections one process serves at once (websockets included); requests on any past it get a 503."""


@dataclass(frozen=True)
class Config:
    """Everything llmgw reads from its environment.

    ``redis_url`` is ``None`` in the embedded configuration: the channel layer
    is in memory and Celery's broker is a folder in the data dir.
    """

    data_dir: Path
    database_url: str | None
    """LLMGW_DATABASE_URL; None: the PostgreSQL llmgw runs itself in the data dir (llmgw.embedded_db)."""
    redis_url: str | None
    admin_addr: Address
    gateway_addr: Address
    secret_key: str
    debug: bool
    catalog_file: Path | None
    allowed_hosts: tuple[str, ...]
    gateway_workers: int = 1
    """Processes serving the gateway listener; each uses about one core at full load."""
    admin_workers: int = 1
    """Processes serving the admin listener; 1 is ``llmgw serve`` itself, more are children on its socket."""
    admin_db_connections: int = 10
    """PostgreSQL connections each admin process keeps in its pool at most (core.dbpool)."""
    listener_limits: ListenerLimits = ListenerLimits()
    """What one connection may hold or take of a listener's process; read again by each listener process."""

    @property
    def embedded(self) -> bool:
        """True when no Redis is configured and llmgw runs on its own."""
        return self.redis_url is None


def parse_address(variable: str, value: str) -> Address:
    """Read ``host:port`` (``[v6]:port`` for IPv6) or raise ConfigError."""
    value = value.strip()
    if value.startswith("["):
        host, sep, port = value[1:].partition("]:")
        if not sep:
            raise ConfigError(variable, f"{value!r} is not [ipv6]:port")
    else:
        host, sep, port = value.rpartition(":")
        if not sep:
            raise ConfigError(variable, f"{value!r} has no port; write host:port, like 127.0.0.1:8000")
    if not host:
        raise ConfigError(variable, f"{value!r} has no host; write 0.0.0.0:PORT to listen everywhere")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(variable, f"port {port!r} is not a number between 1 and 65535")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(variable, f"{host!r} is not an IPv6 address") from None
    return Address(host=host, port=int(port))


def check_database_url(value: str) -> str:
    """Refuse a database URL llmgw cannot use, saying what is wrong with it."""
    parts = urlsplit(value)
    scheme = parts.scheme.lower()
    if scheme not in ("postgres", "postgresql", "pgsql", "postgis"):
        # SQLite included: llmgw's one database is PostgreSQL (an embedded one when none is given).
        raise ConfigError(
            "LLMGW_DATABASE_URL",
            f"scheme {parts.scheme or '(none)'!r} is not supported; use postgresql://user@host:5432/name, "
            "or leave it unset for the PostgreSQL llmgw runs itself in the data dir",
        )
    try:
        port = parts.port
    except ValueError:
        raise ConfigError("LLMGW_DATABASE_URL", "the port is not a number") from None
    if not parts.hostname and not parts.path.strip("/"):
        raise ConfigError("LLMGW_DATABASE_URL", "names neither a host nor a database")
    if port == 0:
        raise ConfigError("LLMGW_DATABASE_URL", "port 0 is not a port")
    for name, raw in parse_qsl(parts.query):
        if name == "prepare_threshold":
            prepare_threshold(raw)
    return value


def prepare_threshold(raw: str) -> int | None:
    """``?prepare_threshold=`` of a PostgreSQL URL: from which use a statement is prepared; None: never.

    None is for a PgBouncer older than 1.21 in transaction mode, which cannot
    keep prepared statements.
    """
    text = str(raw).strip().lower()
    if text in ("none", "null", "off", ""):
        return None
    if not text.isdigit():
        raise ConfigError("LLMGW_DATABASE_URL", f"prepare_threshold={raw!r} is not a whole number or none")
    return int(text)


def check_redis_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError("LLMGW_REDIS_URL", f"scheme {parts.scheme or '(none)'!r} is not redis:// or rediss://")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port lazily
    except ValueError:
        raise ConfigError("LLMGW_REDIS_URL", "the port is not a number") from None
    if parts.scheme != "unix" and not parts.hostname:
        raise ConfigError("LLMGW_REDIS_URL", "has no host; write redis://127.0.0.1:6379/0")
    return value


def secret_from_env_or_file(env: dict[str, str], name: str) -> str | None:
    """Read a secret from ``NAME`` or from the file named by ``NAME_FILE``.

    The ``_FILE`` form is for container secrets and systemd credentials, which
    arrive as files so they never show in the process environment.
    """
    if env.get(name):
        return env[name]
    path = env.get(f"{name}_FILE")
    if not path:
        return None
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{name}_FILE", f"cannot read {path}: {exc.strerror}") from None


def ensure_data_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ConfigError("LLMGW_DATA_DIR", f"cannot create {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK):
        raise ConfigError("LLMGW_DATA_DIR", f"{path} is not writable by this user")
    return path


def write_private_file(path: Path, text: str) -> None:
    """Write a secret so that only this user can read it (mode 0600).

    The file is created with that mode rather than chmod-ed afterwards, so the
    secret is never readable by others, not even for an instant.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text if text.endswith("\n") else text + "\n")
    os.chmod(path, 0o600)


def load_or_create_secret_key(data_dir: Path) -> str:
    """The key generated on first start and kept in the data dir.

    Kept rather than made anew on each start: sessions and signed values
    would otherwise break at every restart, and every host of a multi-host
    control plane must share it (set LLMGW_SECRET_KEY there).
    """
    path = data_dir / SECRET_KEY_FILE
    if path.exists():
        key = path.read_text().strip()
        if key:
            return key
    key = secrets.token_urlsafe(50)
    write_private_file(path, key)
    return key


def _bool(env: dict[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(name, f"{value!r} is not a yes/no value (use 1 or 0)")


def number(env: dict[str, str], name: str, default: float, *, low: float = 0.0, high: float | None = None) -> float:
    """A numeric setting: ``default`` when unset; a ConfigError naming it when it is not a finite number in range.

    The one reader of numeric settings, for the gateway's and placement's alike, so
    that every one refuses the same things in the same words (NaN and infinity
    included, which a plain comparison would let through).
    """
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(name, f"{raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(name, f"{raw!r} is not a finite number")
    if high is None and value < low:
        raise ConfigError(name, f"{raw} is below the least useful value, {low:g}")
    if high is not None and not low <= value <= high:
        raise ConfigError(name, f"{raw} is outside {low:g}..{high:g}")
    return value


def _count(env: dict[str, str], name: str, default: int, most: int, least: int = 1) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not least <= int(raw) <= most:
        raise ConfigError(name, f"{raw!r} is not a whole number from {least} to {most}")
    return int(raw)


def load(env: dict[str, str] | None = None) -> Config:
    """Read and check the configuration; raise ConfigError on the first bad value."""
    env = dict(os.environ if env is None else env)
    data_dir = ensure_data_dir(Path(env.get("LLMGW_DATA_DIR") or Path.cwd() / "data").expanduser().resolve())
    database_url = check_database_url(env["LLMGW_DATABASE_URL"]) if env.get("LLMGW_DATABASE_URL") else None
    redis_url = env.get("LLMGW_REDIS_URL") or None
    if redis_url:
        check_redis_url(redis_url)
    admin = parse_address("LLMGW_ADMIN_ADDR", env.get("LLMGW_ADMIN_ADDR") or DEFAULT_ADMIN_ADDR)
    gateway = parse_address("LLMGW_GATEWAY_ADDR", env.get("LLMGW_GATEWAY_ADDR") or DEFAULT_GATEWAY_ADDR)
    if admin.port == gateway.port:
        # The listener is told apart by the port a request arrived on, so two
        # listeners on one port would serve the admin to API-key holders.
        raise ConfigError("LLMGW_GATEWAY_ADDR", f"uses port {gateway.port}, the same as LLMGW_ADMIN_ADDR")
    secret_key = secret_from_env_or_file(env, "LLMGW_SECRET_KEY") or load_or_create_secret_key(data_dir)
    catalog = env.get("LLMGW_CATALOG_FILE")
    hosts = tuple(h.strip() for h in env.get("LLMGW_ALLOWED_HOSTS", "*").split(",") if h.strip())
    return Config(
        data_dir=data_dir,
        database_url=database_url,
        redis_url=redis_url,
        admin_addr=admin,
        gateway_addr=gateway,
        secret_key=secret_key,
        debug=_bool(env, "LLMGW_DEBUG"),
        catalog_file=Path(catalog).expanduser() if catalog else None,
        allowed_hosts=hosts or ("*",),
        gateway_workers=_count(env, "LLMGW_GATEWAY_WORKERS", 1, 256),
        admin_workers=admin_workers(env, redis_url),
        admin_db_connections=admin_db_connections(env),
        listener_limits=listener_limits(env),
    )


def admin_db_connections(env: Mapping[str, str]) -> int:
    """LLMGW_ADMIN_DB_CONNECTIONS: the most PostgreSQL connections one admin process keeps (core.dbpool).

    Each admin process (LLMGW_ADMIN_WORKERS of them, on each control host)
    may hold this many, on top of the gateway's and the worker's, all within
    PostgreSQL's max_connections.
    """
    return _count(dict(env), "LLMGW_ADMIN_DB_CONNECTIONS", 10, 1000)


def listener_limits(env: Mapping[str, str]) -> ListenerLimits:
    """The LLMGW_LISTENER_* settings: what one connection may hold or take of a listener's process.

    Read by ``llmgw serve`` to refuse a bad value at start, and again by each
    process serving a listener (the environment is the same).
    """
    env, default = dict(env), ListenerLimits()
    return ListenerLimits(
        head_bytes=_count(env, "LLMGW_LISTENER_HEAD_BYTES", default.head_bytes, 1 << 20, least=1024),
        head_timeout_s=number(env, "LLMGW_LISTENER_HEAD_TIMEOUT_S", default.head_timeout_s, low=0.1, high=3600),
        body_timeout_s=number(env, "LLMGW_LISTENER_BODY_TIMEOUT_S", default.body_timeout_s, low=0.1, high=3600),
        keep_alive_s=number(env, "LLMGW_LISTENER_KEEP_ALIVE_S", default.keep_alive_s, low=0.1, high=3600),
        connections=_count(env, "LLMGW_LISTENER_CONNECTIONS", default.connections, 1_000_000),
    )


def admin_workers(env: dict[str, str], redis_url: str | None) -> int:
    """LLMGW_ADMIN_WORKERS, refused above 1 where the processes could not share what the listener holds.

    A live page hears what its own process publishes through the in-memory
    channel layer, so without Redis a second process's registrations and
    heartbeats would never reach a page served by the first.
    """
    count = _count(env, "LLMGW_ADMIN_WORKERS", 1, 64)
    if count > 1 and redis_url is None:
        raise ConfigError(
            "LLMGW_ADMIN_WORKERS",
            f"is {count}, and more than one admin process needs LLMGW_REDIS_URL: without Redis a live page "
            "hears only the updates of the process that serves it",
        )
    return count
