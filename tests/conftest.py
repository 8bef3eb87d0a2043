"""Shared fixtures."""

from __future__ import annotations

import pytest

from tests.github_server import FakeGitHub

REPO = "octo/repo"


@pytest.fixture
def gh():
    """A strict loopback GitHub for one test; it must have seen no invalid request."""
    fake = FakeGitHub(REPO).start()
    yield fake
    fake.stop()
    assert fake.errors == [], fake.errors
