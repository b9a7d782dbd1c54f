"""The dev stack's long-running services: the control-plane worker, one simulated node agent per host and the HTTP
API, in one background thread with its own event loop, so `berth up` stays a single process that Ctrl-C stops
completely.

Hosts whose fleet entry says `simulation.agentDown: true` get no agent: their task queue has no poller and no report
ever arrives, exactly like a host whose agent crashed, so the scheduler counts them `agent_down`.

Each agent reports its (simulated) host through the API with its own node token, as a real agent does; the stack
waits for every first report before it calls itself ready, so the first request finds every live node validated.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import uvicorn
from temporalio.runtime import LogForwardingConfig, LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.worker import Worker

import worker
from activities.node.reporter import HttpReportSink, NodeReporter
from api.app import create_app
from config.settings import Settings
from config.temporal import connect
from fleet.loader import load_fleet
from store.db import create_engine, session_factory


def log_sdk_to(log_file: Path) -> None:
    """Send the Temporal SDK core's log lines to `log_file` rather than the terminal the stack was started from.

    Its warnings are for whoever debugs a worker (say, an activity that finished after its workflow was cancelled,
    which the demo does on purpose); printed between `berth up`'s own lines they read like failures."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("berth.temporal-sdk")
    if not logger.handlers:
        handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    telemetry = TelemetryConfig(
        logging=LoggingConfig(
            filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
            forwarding=LogForwardingConfig(logger=logger),
        )
    )
    Runtime.set_default(Runtime(telemetry=telemetry), error_if_already_set=False)


class WorkerHost:
    def __init__(self, settings: Settings, fleet_file: Path) -> None:
        self.settings = settings
        self.fleet_file = fleet_file
        self.agents: list[str] = []
        self._node_agents: list[worker.NodeAgent] = []
        self.skipped: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="berth-workers", daemon=True)
        self._workers: list[Worker] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="agent")
        self._api: uvicorn.Server | None = None

    def start(self, database_url: str, timeout: float = 60.0) -> None:
        log_sdk_to(self.settings.state_dir / "logs" / "workers.log")
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(database_url), self._loop).result(timeout)

    def start_api(self, port: int, timeout: float = 30.0) -> str:
        """Serve the HTTP API on 127.0.0.1:`port`; returns its URL once it accepts connections."""
        asyncio.run_coroutine_threadsafe(self._start_api(port), self._loop).result(timeout)
        return f"http://127.0.0.1:{port}"

    async def _start_api(self, port: int) -> None:
        app = create_app(self.settings, sessions=session_factory(self._engine))
        self._api = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
        self._tasks.append(asyncio.create_task(self._api.serve()))
        while not self._api.started:  # noqa: ASYNC110 - uvicorn offers a flag, not an event to await
            await asyncio.sleep(0.05)

    async def _start(self, database_url: str) -> None:
        client = await connect(self.settings)
        await worker.check_search_attributes(client)
        self._engine = create_engine(database_url)
        self._workers.append(
            worker.control_worker(
                client,
                session_factory(self._engine),
                self.settings.control_task_queue,
                clusters=worker.simulated_clusters(self.settings.state_dir),
            )
        )
        fleet = load_fleet([self.fleet_file])
        for pool in fleet.host_pools():
            for node in pool.nodes:
                if node.simulation.agent_down:
                    self.skipped.append(node.name)
                    continue
                agent = worker.simulated_agent(self.fleet_file, node.name, self.settings.state_dir)
                queue = f"{self.settings.node_task_queue_prefix}{node.name}"
                self._workers.append(worker.node_worker(client, agent, self._executor, queue))
                self._tasks.append(asyncio.create_task(worker.reap_leases(agent)))
                self.agents.append(node.name)
                self._node_agents.append(agent)
        self._tasks.extend(asyncio.create_task(w.run()) for w in self._workers)

    def start_reporting(self, api_url: str, node_tokens: dict[str, str], timeout: float = 60.0) -> None:
        """Every agent reports its host once (waited for), then every interval in the background."""
        asyncio.run_coroutine_threadsafe(self._start_reporting(api_url, node_tokens), self._loop).result(timeout)

    async def _start_reporting(self, api_url: str, node_tokens: dict[str, str]) -> None:
        reporters = [
            NodeReporter(agent, HttpReportSink(api_url, node_tokens[agent.node]), self.settings.report_interval_seconds)
            for agent in self._node_agents
        ]
        await asyncio.gather(*(reporter.report_once() for reporter in reporters))
        self._tasks.extend(asyncio.create_task(reporter.run()) for reporter in reporters)

    def stop(self, timeout: float = 30.0) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _stop(self) -> None:
        if self._api is not None:
            self._api.should_exit = True
        await asyncio.gather(*(w.shutdown() for w in self._workers), return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._engine.dispose()
