"""Simulated node agents' start reports, taken in without an API server: for tests and benchmarks that apply a
fleet and run its agents (or none) without the HTTP API.

A node is placed on only once its agent has reported its host (live, slots validated). This says what the fleet's
simulated agents would say on start:
each host as its fleet entry describes it (`agent.simulated.simulated_host`), taken in through the same
`store.node_reports.record_report` the API's report route calls. Nodes the fleet simulates as `agentDown` report
nothing, as on the dev stack.
"""

from __future__ import annotations

from agent.simulated import simulated_host
from fleet.fleet import Fleet
from fleet.node import Node
from scheduler.host.report import AgentInfo, NodeReport
from store.db import AsyncSession, async_sessionmaker
from store.node_reports import record_report


def simulated_report(node: Node, interval: float = 30.0) -> NodeReport:
    """The start report of the node's simulated agent: its whole host."""
    host = simulated_host(node)
    return NodeReport(
        agent=AgentInfo(version="simulated", interval_seconds=interval), topology=host.topology_hash(), host=host
    )


async def report_hosts(sessions: async_sessionmaker[AsyncSession], fleet: Fleet, interval: float = 30.0) -> list[str]:
    """Report every host of the fleet whose agent is not simulated down; returns the nodes reported."""
    reported = []
    async with sessions.begin() as session:
        for pool in fleet.host_pools():
            for node in pool.nodes:
                if not node.simulation.agent_down:
                    await record_report(session, node.name, simulated_report(node, interval))
                    reported.append(node.name)
    return reported
