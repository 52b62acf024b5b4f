"""Models declared in the configuration file (``LLMGW_CATALOG_FILE``), kept in step with it.

The file holds a list of model definitions (the shape ``catalog.definitions``
reads), either at the top level or under ``models:``. Each pass:

1. Read and parse the file. A file that cannot be read or parsed changes
   nothing: a typo must not remove every model it declares.
2. Each definition is created or redefined in place (``declared_in=file``),
   keeping its replicas; one that is refused is reported and skipped.
3. Models declared in the file earlier but no longer there are removed.

Models declared in the file are read-only in the admin and the API. The pass
is skipped when the file's bytes have not changed since the last good one.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from catalog import writes as service
from catalog.models import CatalogModel, DeclaredIn

log = logging.getLogger(__name__)
ACTOR = "catalog file"


@dataclass
class LoadResult:
    """What a pass did. ``problems`` are sentences naming the definition at fault."""

    digest: str = ""
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: bool = False


def read_definitions(path: Path) -> tuple[list | None, str, list[str]]:
    """(definitions, digest of the bytes, problems); definitions None when the file is unusable."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return None, "", [f"cannot read the catalog file {path}: {exc.strerror}"]
    digest = hashlib.sha256(raw).hexdigest()
    try:
        data = yaml.safe_load(raw) or []
    except yaml.YAMLError as exc:
        return None, digest, [f"the catalog file {path} is not valid YAML: {exc}"]
    if isinstance(data, dict):
        data = data.get("models", [])
    if not isinstance(data, list):
        return None, digest, [f"the catalog file {path} must hold a list of models, or one under 'models:'"]
    return data, digest, []


def load(path: Path, last_digest: str | None = None) -> LoadResult:
    """Bring the file-declared models in step with ``path``; unchanged bytes since ``last_digest`` do nothing."""
    definitions, digest, problems = read_definitions(path)
    result = LoadResult(digest=digest, problems=problems)
    if definitions is None:
        return result
    if digest == last_digest:
        result.skipped = True
        return result
    declared: set[str] = set()
    for i, data in enumerate(definitions):
        name = data.get("name") if isinstance(data, dict) else None
        where = f"model {name!r}" if isinstance(name, str) else f"entry {i + 1}"
        try:
            model, changed = service.upsert_model(data, actor=ACTOR, declared_in=DeclaredIn.FILE)
        except service.CatalogError as exc:
            result.problems.append(f"{path}: {where}: {exc.message}")
            if isinstance(name, str):
                declared.add(name)  # refused now, but still declared: not a removal
            continue
        declared.add(model.name)
        if changed:
            result.changed.append(model.name)
    for model in CatalogModel.objects.filter(declared_in=DeclaredIn.FILE).exclude(name__in=declared):
        try:
            service.remove_model(model.name, actor=ACTOR, allow_file=True)
            result.removed.append(model.name)
        except service.CatalogError as exc:
            result.problems.append(f"{path}: removing {model.name!r}: {exc.message}")
    for problem in result.problems:
        log.warning("%s", problem)
    return result
