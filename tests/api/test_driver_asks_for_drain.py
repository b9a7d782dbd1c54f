"""A GPU's driver that asks for what only a drain repairs, end to end through the API: the guest's `nvidia-smi -q`
says `GPU Recovery Action: Node Reboot Required` for one slot, the agent's real report loop judges it (one verdict
function, scheduler/host/health.py) and reports it with its node token; the node goes DRAINING with the action as
its reason, every allocation on it is told (`drain_notice`), and `berth nodes get`'s data names the action (a
DRAINING node takes no new work: tests/api/test_gpu_health_api.py). A driver that advises a GPU reset degrades the slot and drains nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from agent.reporter import NodeReporter
from scheduler.host.health import DriverSignals, RecoveryAction, SlotSignals
from tests.api.stack import Stack
from tests.api.test_gpu_health_api import ApiSink, _node


class AdvisedReporter(NodeReporter):
    """The agent's report loop, with one slot's guest driver giving `advice` (as agent/guest_health.py reads it from
    the guest's `nvidia-smi -q`): the only part of the host this test cannot have for real."""

    def __init__(self, *args: Any, slot: int, advice: RecoveryAction, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slot, self.advice = slot, advice

    def with_agent_signals(self, signals: list[SlotSignals]) -> list[SlotSignals]:
        guest = DriverSignals(answered=True, recovery_action=self.advice)
        return [
            s.model_copy(update={"guest": guest}) if s.index == self.slot else s
            for s in super().with_agent_signals(signals)
        ]


async def _drain_notices(stack: Stack, allocation_id: str) -> list[dict[str, Any]]:
    for _ in range(300):
        told = [e for e in (await stack.get(allocation_id))["events"] if e["step"] == "drain_notice"]
        if told:
            return told
        await asyncio.sleep(0.1)
    raise AssertionError(f"{allocation_id} was never told of the drain")


async def test_a_node_reboot_the_driver_asks_for_drains_the_node_and_tells_its_allocations(stack: Stack) -> None:
    held = await stack.create(4)
    assert (await stack.wait_for(held, "active"))["node"] == "big"  # the only node with 4 GPUs
    sink = ApiSink(stack, await stack.lab.node_token("big"))
    reporter = AdvisedReporter(stack.lab.agent("big"), sink, slot=1, advice=RecoveryAction.NODE_REBOOT)

    reply = await reporter.report_once()

    assert reply.drained == "slot 1: the GPU driver's recovery action is node reboot"
    node = await _node(stack, "big")
    assert node["status"] == "DRAINING"
    [sick] = node["unhealthy"]
    assert (sick["index"], sick["health"]) == (1, "failed")
    assert "recovery action is node reboot" in sick["reasons"][0] and "drain the node" in sick["reasons"][0]
    [notice] = await _drain_notices(stack, held)
    assert "node reboot" in (notice["reason"] or "")
    # The same advice again drains nothing twice.
    assert (await reporter.report_once()).drained is None


async def test_a_gpu_reset_the_driver_asks_for_degrades_the_slot_and_drains_nothing(stack: Stack) -> None:
    reporter = AdvisedReporter(
        stack.lab.agent("big"),
        ApiSink(stack, await stack.lab.node_token("big")),
        slot=2,
        advice=RecoveryAction.GPU_RESET,
    )
    reply = await reporter.report_once()
    assert reply.drained is None
    node = await _node(stack, "big")
    assert node["status"] == "READY"
    [sick] = node["unhealthy"]
    assert (sick["index"], sick["health"]) == (2, "degraded")
    assert "recovery action is GPU reset" in sick["reasons"][0]
