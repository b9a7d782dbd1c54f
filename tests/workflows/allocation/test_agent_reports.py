"""Node agents' reports against real Temporal and real PostgreSQL: a report decides what the scheduler ranks, and a
node whose agent is gone is not ranked."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import yaml

from agent.reporter import NodeReporter
from agent.serve import host_agent
from contracts.placement import PlacementRequest
from devstack.reports import report_hosts
from fleet.loader import load_fleet
from scheduler.placement.schedule import schedule
from store.models import SlotRow
from store.snapshot import load_snapshot
from tests.hosts import sysfs_tree
from tests.workflows.lab import FAST, StoreSink, lab_fleet, running_lab
from workflows.allocation import client as allocation_client


def _fleet_with(node: dict) -> str:
    documents = list(yaml.safe_load_all(lab_fleet({})))
    cluster = next(d for d in documents if d["kind"] == "InferenceCluster")
    cluster["spec"]["nodePools"][0]["nodes"] = [node]
    return yaml.safe_dump_all(documents, sort_keys=False)


async def test_a_report_decides_what_is_ranked_and_a_fixed_slot_comes_back(
    temporal_client, sessions, tmp_path: Path
) -> None:
    broken = sysfs_tree.missing_gpu()  # the fleet approves 8 GPUs; slot 5's GPU is not on the host
    root = broken.write(tmp_path / "host")
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path / "lab", _fleet_with(broken.node), agents=[]
    ) as lab:
        agent = host_agent(broken.name, lab.home, root)
        await lab.start_agent(broken.name, activities=agent.activities(), report=False)
        reporter = NodeReporter(agent, StoreSink(sessions))
        reply = await reporter.report_once()
        assert reply.slots is not None and len(reply.slots) == 8  # the agent learned its approved slots

        async with sessions() as session:
            slot5 = (
                await session.execute(
                    SlotRow.__table__.select().where(SlotRow.node_id == broken.name, SlotRow.slot_index == 5)
                )
            ).one()
        assert (slot5.validation, slot5.validation_reason) == ("invalid", "gpu_absent")

        whole = await lab.allocate("whole-1", gpus=8)
        failed = await lab.wait_for_state(whole, "failed", timeout=30)
        assert failed.failure_reason.startswith("no_compatible_bundles"), failed.failure_reason
        assert "fewer than 8 slots that validate" in failed.failure_reason

        four = await lab.allocate("numa1-1", gpus=3, numa_policy="required")
        active = await lab.wait_for_state(four, "active", timeout=30)
        assert 5 not in [bundle.slot_index for bundle in active.bundles]
        await allocation_client.release(temporal_client, "numa1-1")
        await lab.wait_for_state(four, "released", timeout=30)  # its slots free before the whole host is asked for

        # The operator reseats the GPU: the next report brings slot 5 back.
        shutil.rmtree(root)
        sysfs_tree.hgx_h200().write(root)
        reply = await reporter.report_once()
        assert reply.validation is not None and all(v.state == "valid" for v in reply.validation.slots)
        whole = await lab.allocate("whole-2", gpus=8)
        active = await lab.wait_for_state(whole, "active", timeout=30)
        assert sorted(bundle.slot_index for bundle in active.bundles) == list(range(8))


async def test_ten_allocations_in_a_row_pay_no_pickup_timeout_for_a_dead_agent(
    temporal_client, sessions, tmp_path: Path, examples_dir: Path
) -> None:
    """The example fleet's j22u11 is best fit for 2 H200 GPUs, and its agent is down. Every allocation skips it."""
    fleet = load_fleet([examples_dir / "fleet.yaml"])
    alive = [n.name for pool in fleet.host_pools() for n in pool.nodes if not n.simulation.agent_down]
    async with running_lab(
        temporal_client, temporal_client, sessions, tmp_path, (examples_dir / "fleet.yaml").read_text(), agents=alive
    ) as lab:
        async with sessions() as session:
            explained = schedule(
                await load_snapshot(session),
                PlacementRequest(gpu_count=2, gpu_product="H200", region="us-east", tenant="acme"),
                detail=True,
            )
        node_level = next(level for level in explained.explanation.levels if level.level == "node")
        verdicts = {item.name: item.reason for item in node_level.items}
        assert verdicts["j22u11"] == "agent_down"

        timeouts, started = 0, time.monotonic()
        for n in range(10):
            handle = await lab.allocate(f"reports-seq-{n}", gpus=2, gpu_product="H200", region="us-east", timing=FAST)
            status = await lab.wait_for_state(handle, "active", timeout=30)
            timeouts += sum(1 for a in status.attempts if (a.reason or "").startswith("agent_unreachable"))
            assert "j22u11" not in [a.node for a in status.attempts]
            await allocation_client.release(temporal_client, f"reports-seq-{n}")
        elapsed = time.monotonic() - started
        assert timeouts <= 1
        print(f"10 sequential allocations past a dead agent: {timeouts} pickup timeouts, {elapsed:.1f} s")
        assert await report_hosts(sessions, fleet) == alive  # a report changes nothing about j22u11
