"""docs/install.md's "Three control hosts" uses exactly the files in deploy/: each one it names, and no other."""

from __future__ import annotations

import re
import subprocess

from tests.deploy.tools import DEPLOY, ROOT

INSTALL = ROOT / "docs" / "install.md"
NAMED = re.compile(r"(?<![\w/])deploy/[\w./-]*\w")


def section() -> str:
    text = INSTALL.read_text()
    start = text.index("## Three control hosts")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def shipped() -> set[str]:
    """The files in deploy/ that git knows of (tracked or about to be), not editor leftovers."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "deploy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return set(listed) or {str(p.relative_to(ROOT)) for p in DEPLOY.rglob("*") if p.is_file()}


def test_every_deploy_path_the_section_names_exists():
    named = set(NAMED.findall(section()))
    assert named, "the section names the deploy/ files it uses"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/install.md names {missing}, which deploy/ does not have"


def test_every_deploy_file_is_named_by_the_section():
    named = set(NAMED.findall(section()))
    unnamed = sorted(shipped() - named)
    assert not unnamed, f"deploy/ ships {unnamed}, which the three-hosts section never uses"
