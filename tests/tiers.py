"""The quick tier: `pytest -m quick` runs the tests that start none of the slow parts (no PostgreSQL, no Temporal
server, no OIDC provider, no browser, no guest, no process of Berth's; an in-process fake such as the Kubernetes
API server of tests/kube_fake.py is allowed), the inner loop's check, in under two minutes on two cores.

A test is in it by what it asks for, not by a list someone keeps: one whose fixtures reach none of the session's
servers, and that carries none of the markers of slow kinds, is marked `quick` at collection. So a new pure test is
quick without a word, and one that gains a database fixture leaves the tier by itself. The README's test command
still runs everything.
"""

from __future__ import annotations

import pytest

# Fixtures that start a slow part: any test reaching one is not quick.
SERVERS = frozenset({"postgres", "temporal_env", "oidc_provider", "real_libvirt", "browser"})
# Markers of kinds that start processes of their own.
SLOW_MARKERS = frozenset({"real_vm", "slow"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "quick: starts no slow part (database, Temporal, guest, stack): `pytest -m quick`"
    )
    config.addinivalue_line(
        "markers", "slow: starts processes of its own (a stack, a CLI run); never in the quick tier"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        markers = {mark.name for mark in item.iter_markers()}
        if not fixtures & SERVERS and not markers & SLOW_MARKERS:
            item.add_marker(pytest.mark.quick)
