"""`berth apply` as an operator runs it, against a real API (`PUT /v1/fleet`) on a database that holds no fleet yet:
bad files are refused with a message that locates the problem, and the database is left exactly as it was; a good
one is in the API's request log under the admin who applied it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from cli.main import app
from store.models import NodeRow, SlotRow, TenantRow
from tests.api.served import Served

runner = CliRunner()

GOOD_CLUSTER = """
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: lab}
spec: {prices: {H200: 3.0}}
---
apiVersion: modelplane.ai/v1alpha1
kind: InferenceClass
metadata: {name: h200}
spec:
  devices:
  - {name: gpu, driver: gpu.nvidia.com, count: 2, capacity: {memory: {value: 141Gi}}}
---
apiVersion: berth.dev/v1alpha1
kind: InferenceCluster
metadata: {name: lab-1}
spec:
  region: lab
  nodePools:
  - name: slices
    className: h200
    shape: gpu_slice
    gpuProduct: H200
    nodes:
    - name: n1
      slots:
      - {index: 0, gpuPci: "0000:1b:00.0", fabricVfPci: "0000:1a:00.2", mac: "52:54:00:00:00:01"}
      - {index: 1, gpuPci: "0000:3c:00.0", fabricVfPci: "0000:3a:00.2", mac: "52:54:00:00:00:02"}
"""

# (what is wrong, how to break the good file, what the message must say)
BAD_INPUTS = [
    (
        "unknown kind",
        lambda t: t.replace("kind: Region", "kind: Regoin"),
        "document 1 Regoin/lab: kind: unknown kind 'Regoin'",
    ),
    (
        "missing field",
        lambda t: t.replace("    className: h200\n", ""),
        "document 3 InferenceCluster/lab-1: spec.nodePools[0].className: is required but missing",
    ),
    (
        "duplicate node",
        lambda t: t + "    - name: n1\n      slots: []\n",
        "spec.nodePools[0].nodes[1]: node 'n1' is already defined in pool lab-1/slices",
    ),
    (
        "duplicate slot",
        lambda t: t.replace("{index: 1,", "{index: 0,"),
        "spec.nodePools[0].nodes[0].slots[1].index: 0 is already used by slots[0] of node n1",
    ),
    (
        "duplicate fabric VF",
        lambda t: t.replace("0000:3a:00.2", "0000:1a:00.2"),
        "slots[1].fabricVfPci: '0000:1a:00.2' is already used by slots[0] of node n1",
    ),
    (
        "malformed PCI address",
        lambda t: t.replace('"0000:3c:00.0"', '"0000:3c:00"'),
        "slots[1].gpuPci: '0000:3c:00' is not a PCI address",
    ),
    (
        "malformed MAC",
        lambda t: t.replace("52:54:00:00:00:02", "52:54:00:00:02"),
        "slots[1].mac: '52:54:00:00:02' is not a MAC address",
    ),
    (
        "bad quantity",
        lambda t: t.replace("141Gi", "141Gx"),
        "document 2 InferenceClass/h200: spec.devices[0].capacity.memory.value: '141Gx' is not a Kubernetes quantity",
    ),
    (
        "pool with an unknown class",
        lambda t: t.replace("className: h200", "className: h100"),
        "spec.nodePools[0].className: InferenceClass 'h100' is not defined",
    ),
    (
        "cluster in an unknown region",
        lambda t: t.replace("region: lab", "region: mars"),
        "spec.region: region 'mars' is not defined",
    ),
    (
        "bad apiVersion",
        lambda t: t.replace("modelplane.ai/v1alpha1", "modelplane.ai/v9"),
        "apiVersion: must be berth.dev/v1alpha1 or modelplane.ai/v1alpha1",
    ),
    ("not YAML", lambda t: t + "\n  - : : [\n", "is not valid YAML or JSON at line"),
    (
        "not inventory",
        lambda t: (
            t + "---\napiVersion: berth.dev/v1alpha1\nkind: SlotState\nmetadata: {name: w}\n"
            "spec: {quarantined: [n1/0]}\n"
        ),
        "SlotState documents are not inventory",
    ),
]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


async def _snapshot(sessions) -> tuple[int, int, int]:
    async with sessions() as session:
        return (
            await session.scalar(select(func.count()).select_from(NodeRow)),
            await session.scalar(select(func.count()).select_from(SlotRow)),
            await session.scalar(select(func.count()).select_from(TenantRow)),
        )


def test_a_good_file_applies_and_reports_what_changed(tmp_path: Path, fleet_api: Served) -> None:
    env = fleet_api.admin_env()
    first = runner.invoke(app, ["apply", "-f", str(_write(tmp_path, GOOD_CLUSTER))], env=env)
    assert first.exit_code == 0, first.output
    assert "created InferenceCluster/lab-1" in first.output
    assert "applied: 7 created, 0 unchanged" in first.output
    second = runner.invoke(app, ["apply", "-f", str(tmp_path / "fleet.yaml"), "-o", "json"], env=env)
    assert second.exit_code == 0
    answer = json.loads(second.output)
    assert (answer["changes"], answer["unchanged"], answer["tenant_tokens"], answer["deployments_told"]) == (
        [],
        7,
        {},
        0,
    )
    # The API recorded both applies under the admin token that made them.
    headers = {"Authorization": f"Bearer {fleet_api.admin_token}"}
    log = httpx.get(f"{fleet_api.base_url}/v1/audit/requests", headers=headers).json()["requests"]
    applies = [r for r in log if (r["method"], r["route"]) == ("PUT", "/v1/fleet")]
    assert len(applies) == 2 and {r["actor"] for r in applies} == {applies[0]["actor"]}
    assert applies[0]["actor"].startswith("token:") and applies[0]["status"] == 200


def test_dry_run_checks_with_the_api_and_writes_nothing(tmp_path: Path, fleet_api: Served) -> None:
    env = fleet_api.admin_env()
    checked = runner.invoke(
        app, ["apply", "-f", str(_write(tmp_path, GOOD_CLUSTER)), "--dry-run", "-o", "json"], env=env
    )
    assert checked.exit_code == 0, checked.output
    assert json.loads(checked.output) == {
        "valid": True,
        "counts": {"regions": 1, "tenants": 0, "classes": 1, "clusters": 1, "nodes": 1},
    }
    applied = runner.invoke(app, ["apply", "-f", str(tmp_path / "fleet.yaml")], env=env)
    assert "applied: 7 created" in applied.output  # the dry run wrote nothing


def test_apply_gives_each_new_tenant_one_api_token(tmp_path: Path, fleet_api: Served) -> None:
    env = fleet_api.admin_env()
    with_tenant = (
        GOOD_CLUSTER + "---\napiVersion: berth.dev/v1alpha1\nkind: Tenant\nmetadata: {name: t1}\nspec: {gpuQuota: 4}\n"
    )
    first = runner.invoke(app, ["apply", "-f", str(_write(tmp_path, with_tenant)), "-o", "json"], env=env)
    tokens = json.loads(first.output)["tenant_tokens"]
    assert list(tokens) == ["t1"] and tokens["t1"].startswith("berth_")
    again = runner.invoke(app, ["apply", "-f", str(tmp_path / "fleet.yaml")], env=env)
    assert again.exit_code == 0 and "API token" not in again.output  # plaintext is shown once, never re-issued


@pytest.mark.parametrize(("case", "breaks", "message"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
async def test_bad_input_is_refused_with_its_location_and_writes_nothing(
    case: str, breaks, message: str, tmp_path: Path, fleet_api: Served, sessions
) -> None:
    env = fleet_api.admin_env()
    # The CLI runs its own event loop, so it runs beside the test's loop, as it would in a terminal.
    good = await asyncio.to_thread(runner.invoke, app, ["apply", "-f", str(_write(tmp_path, GOOD_CLUSTER))], env=env)
    assert good.exit_code == 0, good.output
    before = await _snapshot(sessions)

    # Append a tenant so a half-applied file would be visible as a new row.
    bad_text = (
        breaks(GOOD_CLUSTER)
        + "\n---\napiVersion: berth.dev/v1alpha1\nkind: Tenant\nmetadata: {name: t}\nspec: {gpuQuota: 1}\n"
    )
    if case == "not YAML":
        bad_text = breaks(GOOD_CLUSTER)
    result = await asyncio.to_thread(runner.invoke, app, ["apply", "-f", str(_write(tmp_path, bad_text))], env=env)

    assert result.exit_code == 1
    assert message in result.output.replace("\n", " ") or message in result.output
    assert "Traceback" not in result.output
    assert await _snapshot(sessions) == before


def test_missing_api_configuration_is_one_clear_line(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        ["apply", "-f", str(_write(tmp_path, GOOD_CLUSTER))],
        env={"BERTH_STATE_DIR": str(tmp_path / "none"), "BERTH_API_URL": None, "BERTH_TOKEN": None},
    )
    assert result.exit_code == 1
    assert "no Berth API configured: pass --api, set BERTH_API_URL, or start the dev stack with `berth up`" in (
        result.output
    )
    assert "Traceback" not in result.output
