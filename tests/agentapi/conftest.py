"""A join token, and one registered node's credential, for the agent protocol's tests."""

from __future__ import annotations

import pytest

from llmgw.bootstrap import issue_join_token
from tests.agentapi.agenthttp import register
from tests.agentapi.reports import report


@pytest.fixture
def join():
    return issue_join_token()


@pytest.fixture
def node(client, join):
    answer = register(client, join, report=report())
    assert answer.status_code == 201, answer.content
    return answer.json()["credential"]
