"""A tenant's create limit holds whatever the number of API processes: two real API processes (uvicorn, as
production runs them) over one database take from the same bucket, and so does a person's own limit.

Tenant `initech` may create 3 at once and then one every 1,000 s: of ten creates sent to the two processes in turn,
three are accepted, whichever process they reach, and the other seven are 429 `rate_limited`. Each person (and each
service account) may create 3 at once too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import yaml
from temporalio.client import Client

from devstack.parts import api_command
from devstack.ports import free_port, port_open
from devstack.process import spawn, stop
from store.tokens import create_token, ensure_tenant_tokens, verify
from tests.api.stack import api_fleet, bearer
from tests.workflows.lab import running_lab

REPO = Path(__file__).resolve().parents[2]
INITECH = {
    "apiVersion": "berth.dev/v1alpha1",
    "kind": "Tenant",
    "metadata": {"name": "initech"},
    "spec": {"gpuQuota": 64, "rateLimit": {"createsPerSecond": 0.001, "burst": 3}},
}


@contextmanager
def api_process(env: dict[str, str], log: Path) -> Iterator[str]:
    """One API process, as the dev stack and the Kubernetes manifests run it; stopped and waited for."""
    port = free_port()
    process = spawn(api_command(port), log, env=env)  # ends with this test run whatever happens to it
    try:
        deadline = time.monotonic() + 60
        while not port_open("127.0.0.1", port):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the API process did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


def _env(database_url: str, client: Client, control: str, node_prefix: str, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    return env | {
        "BERTH_DATABASE_URL": database_url,
        "BERTH_TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "BERTH_TEMPORAL_NAMESPACE": client.namespace,
        "BERTH_CONTROL_TASK_QUEUE": control,
        "BERTH_NODE_TASK_QUEUE_PREFIX": node_prefix,
        "PYTHONPATH": str(REPO),
        **more,
    }


async def test_two_api_processes_share_a_tenants_bucket(
    database_url: str, temporal_client: Client, sessions, tmp_path: Path
) -> None:
    fleet = api_fleet() + "---\n" + yaml.safe_dump(INITECH, sort_keys=False)
    async with running_lab(temporal_client, temporal_client, sessions, tmp_path, fleet) as lab:
        async with sessions.begin() as session:
            initech = bearer((await ensure_tenant_tokens(session))["initech"])
            acme = bearer(await create_token(session, "member", "acme", label="one person"))
            found = await verify(session, acme["Authorization"].removeprefix("Bearer "))
            assert found is not None
            acme_id = found.token_id
        env = _env(
            database_url,
            temporal_client,
            lab.queues.control,
            lab.queues.node_prefix,
            BERTH_PERSON_CREATES_PER_SECOND="0.001",
            BERTH_PERSON_CREATE_BURST="3",
        )
        with ExitStack() as processes:
            apis = [processes.enter_context(api_process(env, tmp_path / f"api-{n}.log")) for n in range(2)]
            async with httpx.AsyncClient(timeout=60) as http:
                for api in apis:  # each process has a control worker in sight before the creates start
                    while (await http.get(f"{api}/healthz")).json()["control_workers"] == 0:
                        time.sleep(0.05)
                answers = [
                    await http.post(f"{apis[n % 2]}/v1/allocations", json={"gpu_count": 1}, headers=initech)
                    for n in range(10)
                ]
                statuses = [a.status_code for a in answers]
                assert statuses[:3] == [202, 202, 202] and statuses[3:] == [429] * 7, [a.text for a in answers]
                refused = answers[3].json()["error"]
                assert refused["code"] == "rate_limited" and refused["details"]["tenant"] == "initech"
                assert {a.url.port for a in answers[3:]} == {int(api.rsplit(":", 1)[1]) for api in apis}

                # One person's limit (three at once, here) holds across the processes as well.
                mine = [
                    await http.post(f"{apis[n % 2]}/v1/allocations", json={"gpu_count": 1}, headers=acme)
                    for n in range(5)
                ]
                assert [a.status_code for a in mine] == [202, 202, 202, 429, 429], [a.text for a in mine]
                assert mine[3].json()["error"]["details"]["actor"] == "token:" + str(acme_id) + " (one person)"
