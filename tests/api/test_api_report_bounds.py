"""Node reports are bounded: a node token once stored a 5.2 MB host, and `GET /v1/nodes` grew to 5.25 MB.

Every reported string and list has a bound taken from what a real host has (`scheduler/host/inventory.py`), lists
nested in lists are counted over the whole host, and the whole inventory is at most `MAX_HOST_BYTES` of JSON. A
report over any of them is a 422 in the house shape and stores nothing; the largest real host, a host at the bounds
and a host whose discovery met more problems than a report may carry are all accepted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import update

from agent.host.sysfs import discover_host
from scheduler.host.inventory import (
    MAX_CPUS,
    MAX_GPUS,
    MAX_HOST_BYTES,
    MAX_MESSAGE,
    MAX_NUMA_CELLS,
    MAX_PROBLEMS,
    MAX_TEXT,
    FabricDevice,
    FabricRole,
    Gpu,
    HostInventory,
    HostProblem,
    NumaCell,
    NvmeNamespace,
    PciFunction,
)
from scheduler.host.report import AgentInfo, NodeReport
from store.models import NodeAgentRow
from store.tokens import create_token
from tests.api.stack import Stack, api_fleet, bearer
from tests.hosts import sysfs_tree

JSON = {"Content-Type": "application/json"}
AGENT = AgentInfo(version="test", interval_seconds=30)


def _address(number: int) -> str:
    return f"{number // 8192:04x}:{(number // 32) % 256:02x}:{number % 32:02x}.0"


def _largest_real_host() -> HostInventory:
    """16 GPUs (each with its audio function), 16 fabric PFs with every VF mlx5 allows (127), 600 other functions
    (bridges, NVSwitches, management), 36 NVMe namespaces, 8 NUMA cells of 56 CPUs: more than any host Berth runs."""
    numbers = iter(range(1, 1 << 20))
    gpus = [
        Gpu(
            address=_address(next(numbers)),
            vendor_id="10de",
            device_id="2335",
            class_code="030200",
            driver="vfio-pci",
            numa_node=index % 8,
            iommu_group=index,
            product="NVIDIA H200",
            memory_mib=143771,
            functions=[_address(next(numbers))],
        )
        for index in range(16)
    ]
    fabric = []
    for index in range(16):
        pf, vfs = _address(next(numbers)), [_address(next(numbers)) for _ in range(127)]
        fabric.append(
            FabricDevice(
                address=pf,
                vendor_id="15b3",
                device_id="1021",
                class_code="020700",
                driver="mlx5_core",
                numa_node=index % 8,
                role=FabricRole.PF,
                vfs=vfs,
                sriov_totalvfs=127,
                sriov_numvfs=127,
                netdevs=[f"ibp{index}s0"],
                rdma_devices=[f"mlx5_{index}"],
            )
        )
        fabric += [
            FabricDevice(
                address=vf,
                vendor_id="15b3",
                device_id="101e",
                class_code="020700",
                driver="vfio-pci",
                numa_node=index % 8,
                role=FabricRole.VF,
                parent=pf,
                netdevs=[f"ibp{index}s0v{n}"],
                rdma_devices=[f"mlx5_{16 + 127 * index + n}"],
            )
            for n, vf in enumerate(vfs)
        ]
    addresses = [*(g.address for g in gpus), *(g.functions[0] for g in gpus), *(f.address for f in fabric)]
    addresses += [_address(next(numbers)) for _ in range(600)]
    nvme = [
        NvmeNamespace(
            name=f"nvme{n}n1",
            wwid=f"eui.{n:032x}",
            serial=f"S{n:019d}",
            size_bytes=3840755982336,
            by_id=[f"/dev/disk/by-id/nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S{n:019d}", f"/dev/disk/by-id/nvme-eui.{n:032x}"],
            controller_pci=_address(next(numbers)),
        )
        for n in range(36)
    ]
    return HostInventory(
        hostname="gpu-host-001.example.internal",
        gpus=gpus,
        fabric=fabric,
        nvme=nvme,
        numa=[NumaCell(id=cell, cpus=list(range(cell * 56, cell * 56 + 56)), memory_mib=257000) for cell in range(8)],
        iommu_groups={group: [address] for group, address in enumerate(addresses)},
        pci_functions={
            address: PciFunction(
                address=address, vendor_id="8086", device_id="1234", class_code="060400", iommu_group=group
            )
            for group, address in enumerate(addresses)
        },
    )


def _at_the_bounds() -> HostInventory:
    """Every count and text bound a report has, reached and not passed."""
    gpus = [
        Gpu(address=_address(n), vendor_id="10de", device_id="2335", class_code="030200", product="N" * MAX_TEXT)
        for n in range(MAX_GPUS)
    ]
    cpus_per_cell = MAX_CPUS // MAX_NUMA_CELLS
    return HostInventory(
        hostname="h" * MAX_TEXT,
        gpus=gpus,
        numa=[NumaCell(id=c, cpus=list(range(c * cpus_per_cell, (c + 1) * cpus_per_cell))) for c in range(64)],
        problems=[HostProblem(path=f"/sys/{n}", message="m" * MAX_MESSAGE) for n in range(MAX_PROBLEMS)],
    )


def _report(host: HostInventory) -> str:
    return NodeReport(agent=AGENT, topology=host.topology_hash(), host=host).model_dump_json(exclude_none=True)


def _oversize(host: dict[str, Any]) -> str:
    """A report of `host`, in JSON built without the models (which would refuse it)."""
    return json.dumps({"agent": AGENT.model_dump(), "topology": "0" * 16, "host": host})


async def _small_token(stack: Stack) -> dict[str, str]:
    async with stack.lab.sessions.begin() as session:
        return bearer(await create_token(session, "node", node="small", label="test")) | JSON


def _gpu(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "address": _address(n),
        "vendor_id": "10de",
        "device_id": "2335",
        "class_code": "030200",
        "product": "NVIDIA H200",
        **extra,
    }


def _pf(n: int, vfs: int) -> dict[str, Any]:
    return {
        "address": _address(n),
        "vendor_id": "15b3",
        "device_id": "1021",
        "class_code": "020700",
        "role": "pf",
        "vfs": [_address(1000 + n)] * vfs,
    }


OVERSIZE = {
    "a host name longer than an FQDN": ({"hostname": "x" * (MAX_TEXT + 1)}, "host.hostname"),
    "one GPU more than a host has": ({"gpus": [_gpu(n) for n in range(MAX_GPUS + 1)]}, "host.gpus"),
    "one problem more than a report carries": (
        {"problems": [{"path": "/sys", "message": "m"} for _ in range(MAX_PROBLEMS + 1)]},
        "host.problems",
    ),
    "a problem message past PATH_MAX": (
        {"problems": [{"path": "/sys", "message": "[bold red]FAKE: node healthy[/]" * 200}]},
        "host.problems[0].message",
    ),
    "two PFs of 4,096 VFs each": ({"fabric": [_pf(n, vfs=4096) for n in range(2)]}, "host"),
}


@pytest.mark.parametrize("case", OVERSIZE)
async def test_an_oversize_report_is_refused_and_nothing_is_stored(stack: Stack, case: str) -> None:
    small = await _small_token(stack)
    first = await stack.http.post("/v1/nodes/small/report", content=_report(_largest_real_host()), headers=small)
    assert first.status_code == 200, first.text
    before = (await stack.http.get("/v1/nodes", headers=stack.admin)).json()

    host, field = OVERSIZE[case]
    refused = await stack.http.post("/v1/nodes/small/report", content=_oversize(host), headers=small)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_request" and error["details"][0]["field"] == f"body.{field}", error
    assert (await stack.http.get("/v1/nodes", headers=stack.admin)).json() == before


async def test_an_inventory_past_the_whole_host_bound_is_report_too_large(stack: Stack) -> None:
    """Every list within its bound, and the strings in them too, but more than a host's JSON altogether."""
    small = await _small_token(stack)
    before = (await stack.http.get("/v1/nodes", headers=stack.admin)).json()
    links = [f"/dev/disk/by-id/{'l' * 2100}{n}" for n in range(4)]  # 2.2 MB in all: just past the bound
    host = HostInventory(nvme=[NvmeNamespace(name=f"nvme{n}n1", by_id=links) for n in range(256)])
    refused = await stack.http.post("/v1/nodes/small/report", content=_report(host), headers=small)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "report_too_large", error
    assert f"a host's is at most {MAX_HOST_BYTES}" in error["message"]
    assert (await stack.http.get("/v1/nodes", headers=stack.admin)).json() == before


@pytest.mark.parametrize("host", [_largest_real_host, _at_the_bounds], ids=["largest real host", "at the bounds"])
async def test_a_host_within_the_bounds_is_accepted(stack: Stack, host: Any) -> None:
    inventory = host()
    body = _report(inventory)
    assert len(inventory.model_dump_json()) <= MAX_HOST_BYTES
    answer = await stack.http.post("/v1/nodes/small/report", content=body, headers=await _small_token(stack))
    assert answer.status_code == 200, answer.text
    shown = (await stack.http.get("/v1/nodes/small", headers=stack.admin)).json()
    assert shown["agent"]["state"] == "live" and shown["agent"]["topology"] == inventory.topology_hash()


async def test_discovery_keeps_its_problems_within_what_a_report_carries(stack: Stack, tmp_path: Path) -> None:
    """A broken host can have any number of unreadable entries: discovery lists MAX_PROBLEMS, the last saying how
    many more there were, so the agent's report is still taken in."""
    root = sysfs_tree.hgx_h200().write(tmp_path)
    for n in range(MAX_PROBLEMS + 50):
        (root / "sys/kernel/iommu_groups" / f"bogus{n:03d}").mkdir()
    host = discover_host(root)
    assert len(host.problems) == MAX_PROBLEMS
    assert host.problems[-1].message == "51 more problems not listed"
    answer = await stack.http.post("/v1/nodes/small/report", content=_report(host), headers=await _small_token(stack))
    assert answer.status_code == 200, answer.text


async def test_a_host_kept_before_the_bounds_is_forgotten_when_the_fleet_changes(stack: Stack) -> None:
    """A host stored before reports were bounded no longer validates: re-checking the node's slots after an apply
    forgets it (slots unvalidated, the agent asked for its host again) instead of failing the apply."""
    small = await _small_token(stack)
    host = _largest_real_host()
    assert (await stack.http.post("/v1/nodes/small/report", content=_report(host), headers=small)).status_code == 200
    kept = {**host.model_dump(mode="json"), "problems": [{"path": "/sys", "message": "m"}] * (MAX_PROBLEMS + 1)}
    async with stack.lab.sessions.begin() as session:
        await session.execute(update(NodeAgentRow).where(NodeAgentRow.node == "small").values(host=kept))

    documents = list(yaml.safe_load_all(api_fleet()))
    cluster = next(d for d in documents if d["kind"] == "InferenceCluster")
    next(n for n in cluster["spec"]["nodePools"][0]["nodes"] if n["name"] == "small")["slots"][1]["vcpus"] = 8
    applied = await stack.http.put(
        "/v1/fleet", content=json.dumps({"kind": "List", "items": documents}), headers=stack.admin
    )
    assert applied.status_code == 200, applied.text
    shown = (await stack.http.get("/v1/nodes/small", headers=stack.admin)).json()
    assert shown["agent"]["topology"] is None
    assert [slot["validation"] for slot in shown["invalid_slots"]] == ["unvalidated", "unvalidated"]
    beat = NodeReport(agent=AGENT, topology=host.topology_hash()).model_dump_json(exclude_none=True)
    asked = await stack.http.post("/v1/nodes/small/report", content=beat, headers=small)
    assert asked.status_code == 200 and asked.json()["send_host"] is True
