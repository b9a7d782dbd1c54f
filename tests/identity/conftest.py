from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.identity.provider import Provider, running_provider


@pytest.fixture(scope="session")
def oidc_provider() -> Iterator[Provider]:
    """The company's identity provider, as far as Berth can tell: a real OIDC provider process."""
    with running_provider() as provider:
        yield provider


@pytest.fixture(scope="session")
def other_provider() -> Iterator[Provider]:
    """Another issuer with keys of its own (say, a different company's provider, or a forged one)."""
    with running_provider() as provider:
        yield provider
