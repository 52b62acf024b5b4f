"""Running the node's command-line tools, with every failure told apart.

A missing tool, a tool that failed and a tool that hung are different facts
for an operator ("nvidia-smi not found" is an install problem, a non-zero exit
is usually a driver problem), so each gets its own sentence.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ToolOutput:
    """What a tool printed, or why there is nothing: exactly one of the two is set."""

    stdout: str | None = None
    error: str | None = None
    exit_code: int | None = None


def run_tool(argv: list[str], timeout: float = DEFAULT_TIMEOUT_S) -> ToolOutput:
    exe = shutil.which(argv[0])
    if exe is None:
        return ToolOutput(error=f"{argv[0]} not found")
    try:
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        return ToolOutput(error=f"{argv[0]} did not answer within {timeout:g} s")
    except OSError as exc:
        return ToolOutput(error=f"{argv[0]} could not be run: {exc.strerror}")
    if proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        reason = detail[-1] if detail else "no message"
        # Some tools (ibstat) print useful output and then fail: keep both.
        return ToolOutput(
            stdout=proc.stdout or None,
            exit_code=proc.returncode,
            error=f"{argv[0]} exited with status {proc.returncode}: {reason}",
        )
    return ToolOutput(stdout=proc.stdout, exit_code=0)
