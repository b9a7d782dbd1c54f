"""The console's fleet, pool, node and health pages against the real API (in-process, over the lab's three hosts),
signed in with a token as a person pasting it would: what each role sees, actions confirmed and posted with the
CSRF token, the API's refusals shown as text. The fleet of 10,000 nodes is tests/console/test_console_big_fleet.py's."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator

import httpx

from tests.api import conftest as api_fixtures
from tests.api.stack import Stack

stack = api_fixtures.stack  # the API over the lab's three hosts, as tests/api has it


@contextlib.asynccontextmanager
async def signed_in(http: httpx.AsyncClient, headers: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the same app as `http` with a console session of the token in `headers`."""
    token = headers["Authorization"].removeprefix("Bearer ")
    async with httpx.AsyncClient(transport=http._transport, base_url="http://berth.test") as signed:  # noqa: SLF001
        answer = await signed.post("/console/login/token", data={"token": token, "next": "/console/fleet"})
        assert answer.status_code == 303 and answer.headers["location"] == "/console/fleet", answer.text
        yield signed


def csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, html
    return found.group(1)


async def test_an_operator_sees_the_fleet_a_pool_a_node_and_cordons_it(stack: Stack) -> None:
    mine = await stack.create(2, who=stack.acme)
    await stack.wait_for(mine, "active")
    async with signed_in(stack.http, stack.admin) as admin:
        fleet = await admin.get("/console/fleet")
        assert fleet.status_code == 200, fleet.text
        assert 'href="/console/fleet/pools/lab-1/slices"' in fleet.text and "Region lab" in fleet.text
        assert '<svg class="chart stack"' in fleet.text and "2 held" in fleet.text
        assert "H200 (7 GPUs)" in fleet.text  # the product filter, with its count
        live = await admin.get("/console/fleet?live=1")
        assert live.status_code == 200 and "<h1>" not in live.text and "lab-1/slices" in live.text
        assert "No pool matches" in (await admin.get("/console/fleet?product=B200")).text

        pool = await admin.get("/console/fleet/pools/lab-1/slices")
        assert pool.status_code == 200, pool.text
        assert f'href="/console/allocations/{mine}"' in pool.text  # an operator sees whose GPUs are held
        assert re.search(r'class="gpu free" role="img" title="GPU \d of \w+: free" aria-label="[^"]+">F<', pool.text)
        assert 'aria-current="page"' in pool.text
        assert (await admin.get("/console/fleet/pools/lab-1/none")).status_code == 404

        node = await admin.get("/console/nodes/small")
        assert node.status_code == 200 and "Cordon" in node.text and "<caption" in node.text
        confirm = await admin.get("/console/nodes/small/cordon")
        assert "Cordon node small?" in confirm.text
        forged = await admin.post("/console/nodes/small/cordon", data={"csrf": "nope"})
        assert forged.status_code == 403
        done = await admin.post("/console/nodes/small/cordon", data={"csrf": csrf(confirm.text)})
        assert done.status_code == 303 and done.headers["location"] == "/console/nodes/small?done=cordon"
        after = await admin.get("/console/nodes/small")
        assert "CORDONED" in after.text and "node-off" in after.text and "Uncordon" in after.text
        assert (await admin.get("/console/nodes/nowhere")).status_code == 404

        health = await admin.get("/console/health")
        assert health.status_code == 200 and "Every GPU you may see is healthy" in health.text
        assert "No node is draining" in health.text
        drain = await admin.get("/console/nodes/big/drain")
        await admin.post("/console/nodes/big/drain", data={"csrf": csrf(drain.text)})
        draining = await admin.get("/console/health?live=1")
        assert 'href="/console/nodes/big"' in draining.text


async def test_a_tenant_sees_its_own_by_id_others_as_in_use_and_is_refused_a_cordon(stack: Stack) -> None:
    mine = await stack.create(2, who=stack.acme)
    await stack.wait_for(mine, "active")
    async with signed_in(stack.http, stack.acme) as acme:
        assert mine in (await acme.get("/console/fleet/pools/lab-1/slices")).text
    async with signed_in(stack.http, stack.globex) as globex:
        pool = await globex.get("/console/fleet/pools/lab-1/slices")
        assert pool.status_code == 200 and mine not in pool.text and ", in use" in pool.text
        node = (await stack.get(mine))["node"]
        page = await globex.get(f"/console/nodes/{node}")
        assert page.status_code == 200 and mine not in page.text and "in use" in page.text and "Cordon" not in page.text
        confirm = await globex.get(f"/console/nodes/{node}/cordon")
        refused = await globex.post(f"/console/nodes/{node}/cordon", data={"csrf": csrf(confirm.text)})
        assert refused.status_code == 200 and "The API refused it" in refused.text and "forbidden" in refused.text
        health = await globex.get("/console/health")
        assert health.status_code == 200 and "problem" not in health.text
