"""Where ctl finds its server and token: flags, then the environment, then ~/.config/llmgw/ctl.yaml.

# ~/.config/llmgw/ctl.yaml
server: https://llmgw-admin.example:8000
token: llmgw_adm_…
actor: ana          # optional: recorded in the audit log instead of the token's owner
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

DEFAULT_SERVER = "http://127.0.0.1:8000"


class ConfigError(Exception):
    """Configuration ctl cannot use, with what to do about it."""


@dataclass(frozen=True)
class Settings:
    server: str
    token: str | None
    actor: str | None = None


def config_path(env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "llmgw" / "ctl.yaml"


def read_file(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path} could not be read: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a mapping like 'server: http://host:8000' and 'token: …'")
    return data


def resolve(
    server: str | None = None,
    token: str | None = None,
    actor: str | None = None,
    env: dict[str, str] | None = None,
    path: Path | None = None,
) -> Settings:
    """Each setting from the first place that gives it: the flag, the environment, the file."""
    env = dict(os.environ if env is None else env)
    file = read_file(path or config_path(env))
    chosen_server = server or env.get("LLMGW_URL") or file.get("server") or DEFAULT_SERVER
    chosen_token = token or env.get("LLMGW_TOKEN") or file.get("token")
    chosen_actor = actor or env.get("LLMGW_ACTOR") or file.get("actor")
    if not isinstance(chosen_server, str) or not chosen_server.startswith(("http://", "https://")):
        raise ConfigError(f"the server must be an http:// or https:// address (got {chosen_server!r})")
    return Settings(
        server=chosen_server.rstrip("/"),
        token=str(chosen_token) if chosen_token else None,
        actor=str(chosen_actor) if chosen_actor else None,
    )
