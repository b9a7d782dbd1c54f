"""`berth explain -f FLEET`: placement or refusal with its explanation, offline, from a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cli.explain import explain

FLEET = """
apiVersion: berth.dev/v1alpha1
kind: Region
metadata: {name: us-east}
spec: {jurisdiction: us, prices: {H200: 3.49}}
---
apiVersion: berth.dev/v1alpha1
kind: Tenant
metadata: {name: acme}
spec: {gpuQuota: 8}
---
apiVersion: berth.dev/v1alpha1
kind: InferenceClass
metadata: {name: h200}
spec:
  devices: [{name: gpu, driver: gpu.nvidia.com, attributes: {productName: {string: NVIDIA H200}}}]
---
apiVersion: berth.dev/v1alpha1
kind: InferenceCluster
metadata: {name: use1}
spec:
  region: us-east
  nodePools:
  - name: slices
    className: h200
    shape: gpu_slice
    gpuProduct: H200
    nodeTemplate: {count: 2, namePrefix: h, gpusPerNode: 4, numaNodes: 1}
"""

BUSY = """
---
apiVersion: berth.dev/v1alpha1
kind: SlotState
metadata: {name: busy}
spec:
  allocations:
  - {id: a1, tenant: acme, state: claimed, slots: [h01/0, h01/1, h01/2]}
  - {id: a2, tenant: acme, state: leased, slots: [h02/0, h02/1, h02/2]}
"""

app = typer.Typer()
app.command()(explain)
runner = CliRunner(env={"COLUMNS": "200"})  # Rich wraps at the terminal width


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def test_text_output_shows_the_choice_levels_and_plan(tmp_path: Path) -> None:
    result = runner.invoke(app, ["-f", str(write(tmp_path, FLEET)), "--gpus", "2", "--product", "H200"])
    assert result.exit_code == 0, result.output
    assert "Placed: 2 H200 GPU slices fit on node h01 in pool use1/slices (us-east)" in result.stdout
    assert "Plan on h01" in result.stdout and "h01/0" in result.stdout and "h01/1" in result.stdout


def test_json_output_is_the_placement_result(tmp_path: Path) -> None:
    args = ["-f", str(write(tmp_path, FLEET)), "--gpus", "4", "--tenant", "acme", "--output", "json"]
    document = json.loads(runner.invoke(app, args).stdout)
    assert document["placed"] is True and document["region"] == "us-east"
    assert [c["node"] for c in document["candidates"]] == ["h01", "h02"]
    assert document["plan"]["gpu_count"] == 4 and len(document["plan"]["bundles"]) == 4
    assert [level["level"] for level in document["explanation"]["levels"]] == [
        "tenant",
        "region",
        "pool",
        "node",
        "bundle",
    ]


def test_slot_state_documents_answer_what_if_questions(tmp_path: Path) -> None:
    path = write(tmp_path, FLEET + BUSY)
    result = runner.invoke(app, ["-f", str(path), "--gpus", "2"])
    assert result.exit_code == 0, result.output
    assert "Refused (insufficient_capacity)" in result.stdout
    assert "1 has fewer than 2 compatible free bundles" in result.stdout
    assert "1 would fit but for slots leased to in-flight allocations" in result.stdout

    quota = json.loads(runner.invoke(app, ["-f", str(path), "--gpus", "3", "--tenant", "acme", "-o", "json"]).stdout)
    assert quota["refusal"]["code"] == "quota_exceeded"
    assert "3 active + 3 in flight + 3 requested > quota 8" in quota["refusal"]["message"]


# Three nested 10-element `all()`s: over a request's whole CEL budget on the first device.
TEN = "[500, 501, 502, 503, 504, 505, 506, 507, 508, 509]"
COSTLY = f"{TEN}.all(a, {TEN}.all(b, {TEN}.all(c, a + b + c > 0)))"


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        (None, ["--gpus", "1"], "missing.yaml: no such file"),
        (FLEET, ["--gpus", "1", "--selector", "device.driver =="], "--selector: CEL selector"),
        (FLEET, ["--gpus", "1", "--selector", COSTLY], "--selector: the request's CEL selectors cost more than"),
        (FLEET.replace("gpuProduct: H200", "gpuProduct: H200\n    nodeCont: 3"), ["--gpus", "1"], "nodeCont"),
        (FLEET + BUSY.replace("h02/2", "h09/2"), ["--gpus", "1"], "slot 'h09/2' is not in the fleet"),
        ("kind: [", ["--gpus", "1"], "is not valid YAML"),
    ],
)
def test_errors_are_one_line_with_a_non_zero_exit(
    tmp_path: Path, text: str | None, args: list[str], message: str
) -> None:
    path = write(tmp_path, text) if text is not None else tmp_path / "missing.yaml"
    result = runner.invoke(app, ["-f", str(path), *args])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output


def test_pinned_gpus_place_on_exactly_those_slots() -> None:
    """docs/seeds.md, "Pinned nodes and GPUs": a node and GPUs on it pinned (nvidia-smi's spelling accepted), exactly
    those slots."""
    examples = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
    pinned = ["-f", str(examples), "--product", "H200", "--node", "j22u05", "--gpu", "00000000:3C:00.0"]
    document = json.loads(runner.invoke(app, [*pinned, "--gpus", "1", "--output", "json"]).stdout)
    assert document["placed"] is True and document["plan"]["node"] == "j22u05"
    assert [bundle["gpu_pci"] for bundle in document["plan"]["bundles"]] == ["0000:3c:00.0"]

    mismatch = runner.invoke(app, [*pinned, "--gpus", "2"])
    assert mismatch.exit_code != 0
    assert "gpu_count is 2 but 1 distinct GPUs are pinned" in mismatch.output
    assert "Traceback" not in mismatch.output
