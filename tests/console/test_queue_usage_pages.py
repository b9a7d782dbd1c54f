"""The console's queues, usage and reservations pages against the real API over the lab fleet (tests/api/stack.py:
hosts slow (1 GPU, never boots), small (2) and big (4) in pool lab-1/slices of region lab; tenants acme and globex,
quota 2), signed in with a Berth token at /console/login/token, read with httpx (no browser).

The usage page's totals are `client.usage(...)`'s for the same window, and its CSV is `berth usage -o csv`'s."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

import berth
from cli.main import app as cli
from tests.api.served import Served, served_api
from tests.api.stack import api_fleet


@pytest.fixture
def served(database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Served]:
    client = temporal_env.client
    target = client.service_client.config.target_host
    with served_api(database_url, target, client.namespace, api_fleet(), tmp_path / "lab") as served:
        deadline = time.monotonic() + 10
        while httpx.get(f"{served.base_url}/healthz").json()["control_workers"] == 0:
            assert time.monotonic() < deadline, "the control worker never polled"
            time.sleep(0.05)
        yield served


@contextlib.contextmanager
def signed_in(served: Served, token: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.base_url, follow_redirects=False, timeout=30) as http:
        answer = http.post("/console/login/token", data={"token": token, "next": "/console/queues"})
        assert answer.status_code == 303, answer.text
        yield http


def active(client: berth.Client, allocation_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while client.allocations.get(allocation_id).state != "active":
        assert time.monotonic() < deadline, f"{allocation_id} never became active"
        time.sleep(0.1)


def test_queue_page_says_why_and_what_would_let_it_through(served: Served) -> None:
    admin = berth.Client(served.base_url, served.admin_token)
    holder = admin.allocations.create(gpu_count=4, tenant="acme", duration="2h", nodes=["big"])
    active(admin, holder.id)
    waiting = admin.allocations.create(gpu_count=4, tenant="acme", queue={"timeout": "10m"})
    deadline = time.monotonic() + 20
    while not (item := _item(admin, waiting.id)) or item.reason is None:
        assert time.monotonic() < deadline, "no admission pass recorded a reason"
        time.sleep(0.2)
    kinds = {hint.kind for hint in item.unblock}
    assert "release" in kinds, item.unblock
    assert any(holder.id in hint.text and hint.at is not None for hint in item.unblock), item.unblock

    with signed_in(served, served.admin_token) as http:
        page = http.get("/console/queues")
        assert page.status_code == 200, page.text
        assert waiting.id in page.text and "What would let it through" in page.text
        assert "ends its lease" in page.text and item.status.split(";")[0] in page.text
        live = http.get("/console/queues?live=1")
        assert live.status_code == 200 and "<html" not in live.text and waiting.id in live.text
        refused = http.get("/console/queues?region=atlantis")
        assert refused.status_code == 200 and 'role="alert"' in refused.text, refused.text

    # globex sees acme's request counted at its place, never its id nor its tenant's allocations.
    with signed_in(served, served.tenant_tokens["globex"]) as http:
        page = http.get("/console/queues")
        assert page.status_code == 200, page.text
        assert waiting.id not in page.text and holder.id not in page.text
        assert "1 request of other tenants" in page.text and "none of them yours" in page.text


def _item(client: berth.Client, allocation_id: str):  # type: ignore[no-untyped-def]
    for region in client.queues.get().regions:
        for item in region.entries:
            if item.allocation_id == allocation_id:
                return item
    return None


def test_usage_page_and_csv_are_berth_usage(served: Served) -> None:
    admin = berth.Client(served.base_url, served.admin_token)
    first = admin.allocations.create(gpu_count=2, tenant="acme", duration="1h", nodes=["small"])
    other = admin.allocations.create(gpu_count=1, tenant="globex", duration="1h", nodes=["big"])
    active(admin, first.id)
    active(admin, other.id)
    time.sleep(2)
    end = datetime.now(UTC).replace(microsecond=0)
    start = end - timedelta(hours=3)
    since, until = start.strftime("%Y-%m-%dT%H:%M:%SZ"), end.strftime("%Y-%m-%dT%H:%M:%SZ")
    expected = admin.usage(start=start, end=end, by="tenant")
    assert {row.tenant for row in expected.rows} >= {"acme", "globex"}

    with signed_in(served, served.admin_token) as http:
        page = http.get("/console/usage", params={"from": since, "to": until, "by": "tenant", "bucket": "hour"})
        assert page.status_code == 200, page.text
        shown = {
            tenant: float(hours)
            for tenant, hours in re.findall(
                r'<th scope="row">([^<]+)</th>\s*<td class="number" data-gpu-hours="([^"]+)"', page.text
            )
        }
        assert shown == {row.tenant: row.gpu_hours for row in expected.rows}
        assert 'role="img"' in page.text and '<title id="usage-chart-t">' in page.text and "<desc" in page.text
        assert "Fair share now" in page.text

        for bucket in (None, "hour"):
            params = {"from": since, "to": until, "by": "tenant", **({"bucket": bucket} if bucket else {})}
            download = http.get("/console/usage.csv", params=params)
            assert download.status_code == 200 and download.headers["content-type"].startswith("text/csv")
            args = ["usage", "--from", since, "--to", until, "--by", "tenant", "-o", "csv"]
            ran = CliRunner().invoke(cli, [*args, *(["--bucket", bucket] if bucket else [])], env=served.admin_env())
            assert ran.exit_code == 0, ran.output
            assert download.text == ran.stdout

        bad = http.get("/console/usage", params={"from": "yesterday-ish"})
        assert bad.status_code == 200 and 'role="alert"' in bad.text and "From:" in bad.text
        wide = http.get("/console/usage", params={"from": "2020-01-01", "bucket": "hour"})
        assert wide.status_code == 200 and 'role="alert"' in wide.text and "at most" in wide.text

    with signed_in(served, served.tenant_tokens["globex"]) as http:
        page = http.get("/console/usage", params={"from": since, "to": until})
        assert page.status_code == 200, page.text
        assert ">globex</th>" in page.text and ">acme</th>" not in page.text


def test_reservations_timeline(served: Served) -> None:
    admin = berth.Client(served.base_url, served.admin_token)
    starts = datetime.now(UTC) + timedelta(hours=2)
    made = admin.reservations.create(gpu_count=1, region="lab", tenant="globex", starts_at=starts, duration="3h")
    listed = list(admin.reservations.list())
    assert [r.pools for r in listed if r.id == made.id] == [["lab-1/slices"]] or listed[0].pools, listed

    with signed_in(served, served.admin_token) as http:
        page = http.get("/console/reservations")
        assert page.status_code == 200, page.text
        assert made.id in page.text and 'role="img"' in page.text and ">now</text>" in page.text
        assert "globex 1 GPU" in page.text
        live = http.get("/console/reservations?live=1")
        assert live.status_code == 200 and made.id in live.text
    with signed_in(served, served.tenant_tokens["acme"]) as http:
        page = http.get("/console/reservations")
        assert page.status_code == 200 and made.id not in page.text
