"""GPU health: what the agent's health looks cost a host of 8 GPUs, and how long a failing GPU takes to
leave placement, on the 8x H200 HGX fixture host (tests/hosts) materialised on disk.

    python -m bench.health [--rounds 300] [--trials 5]

cost       one look: `read_signals` (sysfs: presence, driver, AER counters, link speed and width of each slot's GPU,
           fabric VF and NVMe controller) and `assess` for the 8 slots; the agent looks every `CHECK_SECONDS`, so its
           share of one core is (one look) / CHECK_SECONDS. Beside it, in the same rounds, discovery alone (what the
           agent already pays per look) as the baseline; and the whole look as the agent takes it on a host whose
           driver holds the GPUs (`HostTopology.signals`: sysfs, the SMART log within its minute, a recorded NVML
           reading for each GPU, and `assess` with the signals' descriptions). The SMART log itself is one process
           per NVMe per minute: its spawn is timed with `/bin/true` standing in for nvme-cli (whose own work is one
           admin command), 8 per 60 s.
detection  a real PostgreSQL (embedded, started here), the fleet applied, the agent's report loop running against
           it (as `StoreSink` takes a report in: `store.node_reports.record_report`); a GPU's AER fatal counter rises
           at t0; t1 is when the slot's row reads `failed`, which is when the next placement's snapshot stops
           choosing it (the row change is in `inventory_changes`). Between trials the slot is repaired.

The target: a look under 0.5% of one core, and detection within one report interval plus 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agent.host.health import read_signals
from agent.host.nvml_health import RecordedNvml
from agent.host.rootfs import HostRoot
from agent.host.sysfs import discover_host
from agent.host.topology import HostTopology
from agent.host.wipe import Ran, RecordingRunner, SubprocessRunner
from agent.reporter import CHECK_SECONDS, DEFAULT_INTERVAL_SECONDS, NodeReporter
from agent.serve import host_agent
from bench.database import embedded_database
from bench.polling import until
from bench.stats import interleaved_ms, percentile
from fleet.loader import load_fleet
from fleet.node import Node
from scheduler.host.health import assess
from store.apply import apply_fleet
from store.models import SlotRow
from store.nodes import repair_slots
from tests.hosts.materialise import fixture_fleet
from tests.hosts.sysfs_tree import hgx_h200, write_pcie_health
from tests.workflows.lab import StoreSink


def _clean(root: Path, node: Node) -> None:
    for slot in node.slots:
        for address in (slot.gpu_pci, slot.fabric_vf_pci):
            if address:
                write_pcie_health(root, address)


def cost(rounds: int) -> dict[str, list[float]]:
    fixture = hgx_h200()
    with tempfile.TemporaryDirectory(prefix="berth-health-") as directory:
        root = fixture.write(Path(directory))
        node = Node.model_validate(fixture.node)
        _clean(root, node)
        host, files = discover_host(root), HostRoot(root)

        def look() -> object:
            return [assess(s) for s in read_signals(files, node.slots, host)]

        smart = (
            Path(__file__).resolve().parent.parent / "tests" / "hosts" / "nvme" / "smart-log-clean.json"
        ).read_text()
        runner = RecordingRunner({f"nvme smart-log /dev/nvme{i}n1 -o json": Ran(0, smart) for i in range(8)})
        nvml = Path(directory) / "nvml.json"
        reading = {"answered": True, "xids": [], "ecc_uncorrectable": 0, "remap_pending": False, "remap_failed": False}
        nvml.write_text(json.dumps({"looks": [{s.gpu_pci: reading for s in node.slots}]}))
        topology = HostTopology(root, runner=runner, nvml=RecordedNvml(nvml))

        def whole_look() -> object:
            return [assess(s) for s in topology.signals(node.slots, host)]

        spawn = SubprocessRunner()
        return interleaved_ms(
            {
                "look": look,
                "discovery": lambda: discover_host(root),
                "whole look": whole_look,
                "one process": lambda: spawn.run(["true"]),
            },
            rounds,
        )


async def detection(trials: int) -> list[float]:
    fixture = hgx_h200()
    with tempfile.TemporaryDirectory(prefix="berth-health-") as directory:
        home = Path(directory)
        root = fixture.write(home / "host")
        node = Node.model_validate(fixture.node)
        _clean(root, node)
        async with embedded_database(home / "pg") as database:
            sessions = database.sessions
            (home / "fleet.yaml").write_text(fixture_fleet([fixture.node]))
            async with sessions.begin() as session:
                await apply_fleet(session, load_fleet([home / "fleet.yaml"]))
            agent = host_agent(fixture.name, home / "state", root)
            reporter = NodeReporter(agent, StoreSink(sessions), interval_seconds=DEFAULT_INTERVAL_SECONDS)
            running = asyncio.create_task(reporter.run())
            try:

                async def every_slot_reported() -> bool:
                    return reporter.sent_health is not None and len(reporter.sent_health) >= len(node.slots)

                await until(every_slot_reported, every=0.05)
                return [await _one(sessions, root, node, trial) for trial in range(trials)]
            finally:
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running


async def _one(sessions: async_sessionmaker[AsyncSession], root: Path, node: Node, trial: int) -> float:
    slot = node.slots[trial % len(node.slots)]
    await asyncio.sleep(CHECK_SECONDS * (trial % 3) / 3)  # the failure lands at different points of the agent's cycle
    started = time.time()
    write_pcie_health(root, slot.gpu_pci, fatal=trial + 1)

    async def failed() -> bool:
        async with sessions() as session:
            health = await session.scalar(
                select(SlotRow.health).where(SlotRow.node_id == node.name, SlotRow.slot_index == slot.index)
            )
        return health == "failed"

    await until(failed, every=0.02)
    taken = time.time() - started
    async with sessions.begin() as session:
        await repair_slots(session, node.name, [slot.index], datetime.now(UTC))
    return taken


def main(args: argparse.Namespace) -> None:
    samples = cost(args.rounds)
    look, discovery = statistics.median(samples["look"]), statistics.median(samples["discovery"])
    print(
        f"health look of 8 slots (read_signals + assess), {args.rounds} rounds, ms: median {look:.2f}, "
        f"p99 {percentile(samples['look'], 0.99):.2f}; share of one core at one look every {CHECK_SECONDS:g} s: "
        f"{100 * look / 1000 / CHECK_SECONDS:.3f}%"
    )
    print(
        f"baseline, discovery alone (what each look already pays), ms: median {discovery:.2f}, "
        f"p99 {percentile(samples['discovery'], 0.99):.2f}"
    )
    whole, spawn = statistics.median(samples["whole look"]), statistics.median(samples["one process"])
    print(
        f"whole look (sysfs + SMART within its minute + NVML + assess with descriptions), ms: median {whole:.2f}, "
        f"p99 {percentile(samples['whole look'], 0.99):.2f}; one process spawned (the SMART read's cost, 8 a minute), "
        f"ms: median {spawn:.2f}; share of one core: {100 * (whole / CHECK_SECONDS + 8 * spawn / 60) / 1000:.3f}%"
    )
    taken = asyncio.run(detection(args.trials))
    print(
        f"AER fatal rise -> slot row failed, {args.trials} trials, s: median {statistics.median(taken):.2f}, "
        f"max {max(taken):.2f} (the agent looks every {CHECK_SECONDS:g} s, reports every "
        f"{DEFAULT_INTERVAL_SECONDS:g} s)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=300, help="looks timed for the cost")
    parser.add_argument("--trials", type=int, default=5, help="failures timed for the detection")
    main(parser.parse_args())
