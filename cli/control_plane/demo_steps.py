"""`berth demo`: a narrated walk through Berth's main cases against a running stack, through the public HTTP API.

Each step says what should happen, makes it happen, and checks that it did; the demo succeeds only if every step
behaved as narrated. Every allocation's Temporal UI link is printed so its story can be followed there.

    capacity before -> slice to active and released -> agent down, not ranked -> cancelled while
    provisioning -> bare-metal host -> unplaceable request, explained -> capacity after -> a ModelDeployment,
    spread, scaled past capacity, deleted -> release everything -> what each tenant used (the usage ledger)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from rich.console import Console
from rich.text import Text

from cli.output import styled
from cli.placement import render_capacity  # the same table `berth capacity` prints
from cli.usage import render as render_usage  # the same table `berth usage` prints
from config.context import StackContext
from contracts.http import UsageReport
from contracts.placement import PoolCapacity

FINAL = ("active", "failed", "cancelled", "released", "expired", "preempted")


def _gang(count: int, selector: str) -> dict[str, Any]:
    return {"devices": [{"name": "gpu", "count": count, "selectors": [{"cel": selector}]}]}


# Modelplane's disaggregated serving, as in examples/modelplane/deployment.yaml: a prefill gang (a Leader and a
# Worker, each on a whole node of GPUs with at least 141Gi) and a decode engine on an H100 node, in tier=prod.
BIG_GPUS = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("141Gi")) >= 0'
H100 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA-H100-80GB-HBM3"'
DEMO_DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "modelplane.ai/v1alpha1",
    "kind": "ModelDeployment",
    "metadata": {"name": "demo-llama"},
    "spec": {
        "replicas": 3,
        "template": {
            "spec": {
                "clusterSelector": {"matchLabels": {"tier": "prod"}},
                "engines": [
                    {
                        "name": "prefill",
                        "members": [
                            {"role": "Leader", "nodeSelector": _gang(8, BIG_GPUS)},
                            {"role": "Worker", "worker": {"nodes": 1}, "nodeSelector": _gang(8, BIG_GPUS)},
                        ],
                    },
                    {"name": "decode", "members": [{"role": "Standalone", "nodeSelector": _gang(8, H100)}]},
                ],
            }
        },
    },
}


class StepFailed(AssertionError):
    pass


@dataclass
class Demo:
    context: StackContext
    console: Console
    timeout: float = 60.0
    held: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    started: datetime = field(default_factory=lambda: datetime.now(UTC))  # the usage step reports from here

    def __post_init__(self) -> None:
        assert self.context.api_url and self.context.admin_token
        self.http = httpx.Client(base_url=self.context.api_url, timeout=30.0)
        self.acme = {"Authorization": f"Bearer {self.context.tenant_tokens['acme']}"}
        self.admin = {"Authorization": f"Bearer {self.context.admin_token}"}

    # -- plumbing ---------------------------------------------------------------------------------------------------

    def ui_link(self, workflow_id: str) -> str:
        return self.context.workflow_link(workflow_id) or "-"

    def call(self, method: str, path: str, expect: int, **kwargs: Any) -> dict[str, Any]:
        kwargs.setdefault("headers", self.acme)
        response = self.http.request(method, path, **kwargs)
        if response.status_code != expect:
            raise StepFailed(
                f"{method} {path} answered {response.status_code}, expected {expect}: {response.text[:300]}"
            )
        return response.json() if response.content else {}

    def create(self, body: dict[str, Any]) -> str:
        created = self.call("POST", "/v1/allocations", 202, json=body)
        self.console.print(styled("  allocation [bold]{}[/]", created["id"]))
        self.console.print(f"  Temporal UI: {self.ui_link(created['workflow_id'])}", highlight=False, soft_wrap=True)
        return str(created["id"])

    def wait(self, allocation: str, until: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            current = self.call("GET", f"/v1/allocations/{allocation}", 200)
            if until(current):
                return current
            if time.monotonic() > deadline:
                raise StepFailed(f"{allocation} never {what} (state {current['state']})")
            time.sleep(0.2)

    def settle(self, allocation: str) -> dict[str, Any]:
        return self.wait(allocation, lambda a: a["state"] in FINAL, "settled")

    def expect(self, condition: bool, message: str) -> None:
        if not condition:
            raise StepFailed(message)

    def say(self, text: str | Text) -> None:
        """A line of the narration: a str prints as it is (it may quote the API), a `styled` Text with its styles."""
        self.console.print(text, highlight=False)

    # -- the walk ---------------------------------------------------------------------------------------------------

    def capacity(self, title: str) -> None:
        pools = self.call("GET", "/v1/capacity", 200)["pools"]
        render_capacity([PoolCapacity.model_validate(pool) for pool in pools], title=title)

    def slice_to_active_and_release(self) -> None:
        self.say(
            "A tenant asks for one L4 GPU as a VM slice in eu-west. The region, cluster and node schedulers place it, the node agent leases a bundle, the claim is recorded, the VM boots and passes its readiness gates."
        )
        allocation = self.create({"gpu_count": 1, "gpu_product": "L4", "shape": "gpu_slice", "region": "eu-west"})
        active = self.settle(allocation)
        self.expect(
            active["state"] == "active", f"expected active, got {active['state']}: {active.get('failure_reason')}"
        )
        self.say(
            f"  active on {active['node']} ({active['pool']}), slot {[b['slot_index'] for b in active['bundles']]}"
        )
        node = active["node"]
        self.say(
            f"  Its Temporal UI page (the link above) is one run from request to release: the timeline names "
            f"choose_placement, plan_bundles on {node}, create_vm on {node} and wait_ready on {node}; User Metadata, "
            "Current Details, says active, with its bundle and its attempt."
        )
        self.call("DELETE", f"/v1/allocations/{allocation}", 202)
        released = self.settle(allocation)
        self.expect(released["state"] == "released", f"expected released, got {released['state']}")
        self.say("  released: VM destroyed, slot wiped and back in the pool")

    def agent_down_is_not_ranked(self) -> None:
        self.say(
            "Two H200 slices in us-east. Best fit would rank j22u11 first, but its node agent has never reported: "
            "the scheduler counts it agent_down and places on a node whose agent is live, with no pickup timeout."
        )
        request = {"gpu_count": 2, "gpu_product": "H200", "shape": "gpu_slice", "region": "us-east"}
        explained = self.call("POST", "/v1/explain", 200, json=request, params={"detail": "true"})
        self.expect("agent_down" in json.dumps(explained), "expected explain to count j22u11 as agent_down")
        self.say("  explain: j22u11 agent_down (no live node agent)")
        allocation = self.create(request)
        active = self.settle(allocation)
        self.expect(
            active["state"] == "active", f"expected active, got {active['state']}: {active.get('failure_reason')}"
        )
        attempts = active["attempts"]
        self.expect(
            [a["node"] for a in attempts] == [active["node"]] and active["node"] != "j22u11",
            f"expected one attempt, not on j22u11, got {attempts}",
        )
        for attempt in attempts:
            self.say(f"  attempt on {attempt['node']}: {attempt['outcome']} {attempt.get('reason') or ''}")
        self.held.append(allocation)

    def cancel_while_provisioning(self) -> None:
        self.say(
            "Two L4 slices; the operator cancels while the VM is still booting. Compensation destroys the VM, "
            "wipes the slots, releases the claims: nothing is left behind."
        )
        allocation = self.create({"gpu_count": 2, "gpu_product": "L4", "shape": "gpu_slice", "region": "eu-west"})
        self.wait(allocation, lambda a: a["state"] in ("provisioning", "waiting_ready", *FINAL), "started provisioning")
        self.call("POST", f"/v1/allocations/{allocation}/cancel", 202)
        cancelled = self.settle(allocation)
        self.expect(cancelled["state"] == "cancelled", f"expected cancelled, got {cancelled['state']}")
        self.say(
            f"  cancelled during {'provisioning' if cancelled['attempts'] else 'placement'}; "
            f"{len(cancelled['events'])} events in the audit trail"
        )

    def bare_metal(self) -> None:
        self.say("A whole H100 host (8 GPUs) as bare metal: only a host with nothing claimed can take it.")
        allocation = self.create({"gpu_count": 8, "gpu_product": "H100", "shape": "baremetal"})
        active = self.settle(allocation)
        self.expect(
            active["state"] == "active", f"expected active, got {active['state']}: {active.get('failure_reason')}"
        )
        self.say(f"  active on {active['node']} with all {len(active['bundles'])} slots")
        self.held.append(allocation)

    def unplaceable(self) -> None:
        self.say(
            "Sixteen H200 GPUs as one slice VM: no host has sixteen. Berth explains the refusal level by level, and "
            "refuses the request at once, creating nothing."
        )
        body = {"gpu_count": 16, "gpu_product": "H200", "shape": "gpu_slice"}
        explained = self.call("POST", "/v1/explain", 200, json=body)
        self.expect(not explained["placed"], "the explain endpoint placed an impossible request")
        self.say(f"  explain: {explained['explanation']['summary']}")
        for level in explained["explanation"]["levels"]:
            self.say(f"    {level['level']}: {level['summary']}")  # the summary starts with the counts
        # No host of the fleet could ever hold it, so the API refuses it at create: no allocation, no workflow.
        refused = self.call("POST", "/v1/allocations", 422, json=body)
        self.expect(refused["error"]["code"] == "unsatisfiable", f"expected unsatisfiable, got {refused['error']}")
        self.say(f"  POST /v1/allocations: 422 {refused['error']['code']}: {refused['error']['message']}")

    def waiting_for_capacity(self) -> None:
        self.say(
            "Both H100 hosts busy (step 4 holds one, a second bare-metal request takes the other), a third request "
            "asks to wait up to 10 minutes instead of failing: it is queued, holding nothing, and placed the moment "
            "a host is released."
        )
        body = {"gpu_count": 8, "gpu_product": "H100", "shape": "baremetal"}
        second = self.create(body)
        self.expect(self.settle(second)["state"] == "active", "expected the second H100 host to be taken")
        waiting = self.create({**body, "queue": {"timeout": "10m"}})
        queued = self.wait(waiting, lambda a: a["state"] == "queued", "was queued")
        place = queued["queue"] or {}
        self.say(f"  queued in {place.get('region')}, position {place.get('position')}: {place.get('reason')}")
        self.call("DELETE", f"/v1/allocations/{second}", 202)
        active = self.wait(waiting, lambda a: a["state"] in ("active", *FINAL), "was placed")
        self.expect(
            active["state"] == "active", f"expected active, got {active['state']}: {active.get('failure_reason')}"
        )
        self.say(f"  {second} released; the queued request woke and is active on {active['node']}")
        self.held.append(waiting)

    def deployment(self) -> None:
        self.say(
            "A ModelDeployment in Modelplane's shape: 3 replicas of a prefill gang and a decode engine, in the "
            "clusters labelled tier=prod. The fleet scheduler spreads replicas over clusters before packing and puts "
            "each engine on one pool; each replica is a child workflow that records its node-cost ledger, applies "
            "its workload and waits for it to be ready."
        )
        name = DEMO_DEPLOYMENT["metadata"]["name"]
        accepted = self.call("PUT", f"/v1/deployments/{name}", 202, json=DEMO_DEPLOYMENT, headers=self.admin)
        self.console.print(f"  Temporal UI: {self.ui_link(accepted['workflow_id'])}", highlight=False, soft_wrap=True)
        steady = self.wait_deployment(name, lambda d: d["available"] == 3, "had 3 replicas ready")
        self.expect(steady["phase"] == "FullyScheduled", f"expected FullyScheduled, got {steady['phase']}")
        for replica in steady["replicas"]:
            pools = ", ".join(f"{engine} on {pool}" for engine, pool in replica["pools"].items())
            self.say(
                f"  {replica['name']}: {replica['cluster']}, {pools}, {replica['nodes']} nodes, {replica['phase']}"
            )
        clusters = {replica["cluster"] for replica in steady["replicas"]}
        self.expect(len(clusters) == 2, f"expected the replicas spread over both clusters, got {sorted(clusters)}")

        self.say("Scaled to 9 replicas: more than the pools hold. The ones that fit are placed, the rest explained.")
        scaled = {**DEMO_DEPLOYMENT, "spec": {**DEMO_DEPLOYMENT["spec"], "replicas": 9}}
        self.call("PUT", f"/v1/deployments/{name}", 202, json=scaled, headers=self.admin)
        partial = self.wait_deployment(name, lambda d: d["desired"] == 9 and d["phase"] != "Pending", "re-planned")
        self.expect(partial["phase"] == "PartiallyScheduled", f"expected PartiallyScheduled, got {partial['phase']}")
        self.say(f"  {partial['phase']}: {partial['message']}")
        for cluster in partial["clusters"]:
            self.say(f"    {cluster['cluster']}: {cluster['message']}")

        self.call("DELETE", f"/v1/deployments/{name}", 202, headers=self.admin)
        self.wait_gone(f"/v1/deployments/{name}")
        self.say("  deleted: every workload removed and its ledger rows released")

    def wait_deployment(self, name: str, until: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            current = self.call("GET", f"/v1/deployments/{name}", 200, headers=self.admin)
            if until(current):
                return current
            if time.monotonic() > deadline:
                raise StepFailed(f"deployment {name} never {what} (phase {current['phase']})")
            time.sleep(0.2)

    def wait_gone(self, path: str) -> None:
        deadline = time.monotonic() + self.timeout
        while self.http.get(path, headers=self.admin).status_code != 404:
            if time.monotonic() > deadline:
                raise StepFailed(f"{path} still exists")
            time.sleep(0.2)

    def release_held(self) -> None:
        for allocation in self.held:
            self.call("DELETE", f"/v1/allocations/{allocation}", 202)
        for allocation in self.held:
            released = self.settle(allocation)
            self.expect(released["state"] == "released", f"{allocation} ended {released['state']}")
        self.say(f"released {len(self.held)} allocation(s)")

    def usage(self) -> None:
        self.say(
            "Every claim was billed from the moment it was recorded to the moment it was released, in the same "
            "transaction as the claim itself: what `berth usage` reports (sreport's shape), per tenant and product."
        )
        since = self.started.isoformat()
        report = UsageReport.model_validate(
            self.call("GET", "/v1/usage", 200, params={"from": since, "by": "tenant,product"}, headers=self.admin)
        )
        render_usage(report, self.console)
        acme = [row for row in report.rows if row.tenant == "acme"]
        self.expect(bool(acme) and sum(row.gpu_hours for row in acme) > 0, "acme's GPU-hours are not in the ledger")
        self.expect(sum(row.allocations for row in acme) >= 3, "acme's allocations are not all in the ledger")

    def run(self) -> bool:
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("Capacity before", lambda: self.capacity("Capacity before")),
            ("1. A slice allocation, active, then released", self.slice_to_active_and_release),
            ("2. A node whose agent is down is not ranked", self.agent_down_is_not_ranked),
            ("3. Cancelled while provisioning", self.cancel_while_provisioning),
            ("4. A bare-metal host", self.bare_metal),
            ("5. A request that cannot be placed, and why", self.unplaceable),
            ("Capacity after (steps 2 and 4 still hold their GPUs)", lambda: self.capacity("Capacity after")),
            ("6. Waiting for capacity instead of failing", self.waiting_for_capacity),
            ("7. A ModelDeployment: spread over clusters, scaled past capacity, deleted", self.deployment),
            ("Cleaning up", self.release_held),
            ("8. What each tenant used: the usage ledger", self.usage),
        ]
        for title, step in steps:
            self.console.rule(title)
            try:
                step()
                self.say(styled("[green]ok[/]"))
            except (StepFailed, httpx.HTTPError) as failure:
                self.failures.append(f"{title}: {failure}")
                self.say(styled("[bold red]not as narrated:[/] {}", failure))
        self.http.close()
        return not self.failures
