"""The Grafana dashboard (deploy/grafana/berth.json) and the Prometheus alerting rules
(deploy/prometheus/berth-alerts.yaml) read only metrics `/metrics` serves, and those metrics say what a platform
team would check by hand: capacity by pool and state, agents, placement latency, control workers."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import yaml

from tests.api.stack import Stack

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
_METRIC = re.compile(r"\bberth_[a-z_]+\b")


def exposed(text: str) -> set[str]:
    """Every metric and sample name of a Prometheus text exposition."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def expressions() -> dict[str, str]:
    """Where each PromQL expression comes from -> the expression."""
    dashboard = json.loads((DEPLOY / "grafana" / "berth.json").read_text())
    found = {f"panel {p['title']!r}": t["expr"] for p in dashboard["panels"] for t in p["targets"]}
    rules = yaml.safe_load((DEPLOY / "prometheus" / "berth-alerts.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert {"alert", "expr", "for", "labels", "annotations"} <= set(rule), rule
            assert rule["labels"]["severity"] in ("critical", "warning") and rule["annotations"]["summary"]
            found[f"alert {rule['alert']}"] = rule["expr"]
    return found


async def test_every_metric_a_panel_or_an_alert_names_is_served(stack: Stack) -> None:
    held = await stack.create(2)
    await stack.wait_for(held, "active")
    text = (await stack.http.get("/metrics")).text
    served = exposed(text)
    missing = {
        f"{where}: {name}"
        for where, expr in expressions().items()
        for name in _METRIC.findall(expr)
        if name not in served
    }
    assert not missing, sorted(missing)

    # What they read: the lab's pool (7 GPUs; 2 held), its 3 live agents, the placement just made, a control worker.
    assert 'berth_slots{pool="lab-1/slices",state="reserved"} 2.0' in text
    assert 'berth_slots{pool="lab-1/slices",state="free"} 5.0' in text
    assert 'berth_slots{pool="lab-1/slices",state="placeable"} 5.0' in text  # every free slot: all validated, live
    assert 'berth_agents{state="live"} 3.0' in text and 'berth_agents{state="down"} 0.0' in text
    assert "berth_placements 1.0" in text and 'berth_placement_seconds{quantile="0.5"}' in text
    # -1 is "Temporal did not answer within the check's 3 s": a loaded dev server sometimes does not; a scraper reads
    # it again on its next scrape, as this does.
    for _ in range(10):
        if re.search(r"^berth_control_workers [1-9]", text, re.M):
            break
        await asyncio.sleep(0.5)
        text = (await stack.http.get("/metrics")).text
    assert re.search(r"^berth_control_workers [1-9]", text, re.M)
    assert 'berth_allocation_oldest_seconds{state="active"}' in text
    assert (await stack.http.delete(f"/v1/allocations/{held}", headers=stack.acme)).status_code == 202
    await stack.wait_for(held, "released")
    # The usage counter, from the ledger: the 2 GPUs acme held from the claim to the release, and no more after it.
    text = (await stack.http.get("/metrics")).text
    counted = re.search(
        r'^berth_gpu_seconds_total\{product="([^"]*)",region="([^"]*)",tenant="acme"\} (\S+)$', text, re.M
    )
    assert counted is not None, text
    assert float(counted.group(3)) > 0
    again = (await stack.http.get("/metrics")).text
    assert counted.group(0) in again  # released: it stays where it is
