"""The allocation request's placement constraints through the API: DRA CEL selectors, a cluster selector and pinned
nodes reach the scheduler; a selector that does not compile, or a region, product or node the fleet lacks, is a 422
at once with the position or the valid choices, and creates nothing. A tenant's cloud-config (`user_data`) reaches
the VM's spec as written, and one the seed could not take is a 422 naming `body.user_data` and why.

The lab fleet (tests/api/stack.py): region `lab`, cluster `lab-1` with pool `slices` of H200 (class `h200`, whose
device publishes `productName: "NVIDIA H200"` under driver gpu.nvidia.com), nodes `slow`, `small` and `big`.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from contracts.allocation import USER_DATA_MAX_BYTES, VmSpec
from store.models import AllocationRow
from tests.api.stack import Stack
from workflows.allocation.messages import AllocationInput

H200_SELECTOR = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H200"'
B200_SELECTOR = 'device.attributes["gpu.nvidia.com"].productName.lowerAscii().endsWith("b200")'


async def _allocations(stack: Stack) -> int:
    async with stack.lab.sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(AllocationRow)) or 0)


async def _allocation_workflows(stack: Stack) -> list[str]:
    return [
        w.id
        async for w in stack.lab.starter.list_workflows("WorkflowType = 'AllocationWorkflow'")
        if w.id.startswith("allocation/")
    ]


@pytest.mark.parametrize(
    ("body", "code", "field", "choices", "message"),
    [
        (
            {"region": "mars"},
            "unknown_region",
            "body.region",
            ["lab"],
            "no region 'mars' among the regions your tenant may use; available to you: lab",
        ),
        (
            {"gpu_product": "B200"},
            "unknown_product",
            "body.gpu_product",
            ["H200"],
            "no B200 in the regions your tenant may use; available to you: H200",
        ),
        (
            {"nodes": ["big", "huge"]},
            "unknown_node",
            "body.nodes[1]",
            ["big", "slow", "small"],
            "no node 'huge' in the regions your tenant may use; available to you: big, slow, small",
        ),
    ],
)
async def test_unknown_names_are_422_with_the_choices_and_create_nothing(
    stack: Stack, body: dict[str, Any], code: str, field: str, choices: list[str], message: str
) -> None:
    for path in ("/v1/allocations", "/v1/explain"):
        response = await stack.http.post(path, json={"gpu_count": 1, **body}, headers=stack.acme)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert (error["code"], error["message"]) == (code, message)
        value = body.get("region") or body.get("gpu_product") or body["nodes"][-1]
        assert error["details"] == [{"field": field, "value": value, "choices": choices}]
    assert await _allocations(stack) == 0
    assert (await stack.http.get("/v1/allocations", headers=stack.acme)).json()["allocations"] == []
    assert await _allocation_workflows(stack) == []


async def test_a_product_is_known_whatever_its_case(stack: Stack) -> None:
    response = await stack.http.post("/v1/explain", json={"gpu_count": 1, "gpu_product": "h200"}, headers=stack.acme)
    assert response.status_code == 200 and response.json()["placed"] is True


async def test_a_selector_that_does_not_compile_is_422_naming_it_and_the_position(stack: Stack) -> None:
    body = {"gpu_count": 1, "selectors": [H200_SELECTOR, "device.attributes['gpu.nvidia.com'].memory >"]}
    for path in ("/v1/allocations", "/v1/explain"):
        response = await stack.http.post(path, json=body, headers=stack.acme)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_selector"
        assert error["message"] == "selectors[1] does not compile at 1:44: Syntax error: unexpected end of expression"
        assert error["details"] == [
            {
                "field": "body.selectors[1]",
                "expression": body["selectors"][1],
                "line": 1,
                "column": 44,
                "reason": "Syntax error: unexpected end of expression",
            },
        ]
    unknown_field = {"gpu_count": 1, "selectors": ["device.name == 'gpu-0'"]}
    error = (await stack.http.post("/v1/allocations", json=unknown_field, headers=stack.acme)).json()["error"]
    assert error["message"] == "selectors[0] does not compile at 1:8: undefined field 'name'"
    assert await _allocations(stack) == 0 and await _allocation_workflows(stack) == []


async def test_selectors_and_cluster_selector_decide_the_placement(stack: Stack) -> None:
    matching = {"gpu_count": 2, "selectors": [H200_SELECTOR], "cluster_selector": {}}
    placed = (await stack.http.post("/v1/explain", json=matching, headers=stack.acme)).json()
    assert placed["placed"] is True and placed["candidates"][0]["node"] == "small"

    other = await stack.http.post(
        "/v1/explain", json={"gpu_count": 2, "selectors": [B200_SELECTOR]}, headers=stack.acme
    )
    refused = other.json()
    assert refused["placed"] is False, refused
    assert refused["refusal"]["code"] == "no_region"
    assert refused["refusal"]["message"].endswith(
        "1 has no pool matching the cluster selector, readiness and device selectors"
    )

    labelled = await stack.http.post(
        "/v1/explain", json={"gpu_count": 2, "cluster_selector": {"tier": "gold"}}, headers=stack.acme
    )
    assert labelled.json()["placed"] is False
    assert labelled.json()["refusal"]["message"] == refused["refusal"]["message"]

    # The selectors travel with the allocation: its workflow places it through them.
    allocation_id = await stack.create(2, selectors=[H200_SELECTOR])
    active = await stack.wait_for(allocation_id, "active")
    assert active["node"] == "small"
    async with stack.lab.sessions() as session:
        recorded = await session.scalar(select(AllocationRow.request).where(AllocationRow.id == allocation_id))
    assert recorded["selectors"] == [H200_SELECTOR] and "nodes" not in recorded  # unset fields are left out

    failing = await stack.create(2, selectors=[B200_SELECTOR])
    failed = await stack.wait_for(failing, "failed")
    assert "1 has no pool matching the cluster selector, readiness and device selectors" in failed["failure_reason"]


async def test_pinned_nodes_reach_the_scheduler(stack: Stack) -> None:
    pinned = await stack.http.post("/v1/explain", json={"gpu_count": 2, "nodes": ["big"]}, headers=stack.acme)
    assert pinned.status_code == 200, pinned.text
    assert [candidate["node"] for candidate in pinned.json()["candidates"]] == ["big"]  # best fit alone would be small

    allocation_id = await stack.create(2, nodes=["big"])
    assert (await stack.wait_for(allocation_id, "active"))["node"] == "big"


async def _create(stack: Stack, body: dict[str, Any]) -> str:
    """`Stack.create` takes the GPU count as `gpus`, which is also the pinned GPUs' field: post the body as it is."""
    response = await stack.http.post("/v1/allocations", json=body, headers=stack.acme)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def test_a_pinned_gpu_is_the_slot_the_allocation_gets_and_a_held_one_is_refused_with_the_reason(
    stack: Stack,
) -> None:
    pin = {"nodes": ["big"], "gpus": ["00000000:12:00.0"]}  # nvidia-smi's spelling of big's third GPU
    allocation_id = await _create(stack, {"gpu_count": 1, **pin})
    active = await stack.wait_for(allocation_id, "active")
    assert active["node"] == "big"
    assert [bundle["gpu_pci"] for bundle in active["bundles"]] == ["0000:12:00.0"]

    explained = (await stack.http.post("/v1/explain", json={"gpu_count": 1, **pin}, headers=stack.acme)).json()
    assert explained["placed"] is False
    reason = "big cannot give its pinned GPUs: GPU 0000:12:00.0 is claimed by another allocation"
    assert explained["refusal"] == {
        "code": "pinned_nodes_unavailable",
        "message": f"no pinned node can take 1 GPU slice: {reason}",
    }
    refused = await stack.wait_for(await _create(stack, {"gpu_count": 1, **pin}), "failed")
    assert reason in refused["failure_reason"]
    other = await stack.wait_for(
        await _create(stack, {"gpu_count": 1, "nodes": ["big"], "gpus": ["0000:13:00.0"]}), "active"
    )
    assert [bundle["gpu_pci"] for bundle in other["bundles"]] == ["0000:13:00.0"]


@pytest.mark.parametrize(
    ("body", "code", "field", "message"),
    [
        (
            {"gpus": ["0000:10:00.0"]},
            "invalid_request",
            "body.gpus",
            "gpus need exactly one pinned node in `nodes`, not 0",
        ),
        (
            {"gpus": ["0000:10:00.0"], "nodes": ["big", "small"]},
            "invalid_request",
            "body.gpus",
            "gpus need exactly one pinned node in `nodes`, not 2",
        ),
        (
            {"gpus": ["0000:10:00.0", "0000:11:00.0"], "nodes": ["big"]},
            "invalid_request",
            "body.gpu_count",
            "gpu_count is 1 but 2 GPUs are pinned: they must be equal",
        ),
        (
            {"gpus": ["10:00"], "nodes": ["big"]},
            "invalid_request",
            "body.gpus[0]",
            "Value error, '10:00' is not a PCI address",
        ),
    ],
)
async def test_gpu_pins_that_mean_nothing_are_422_naming_the_field(
    stack: Stack, body: dict[str, Any], code: str, field: str, message: str
) -> None:
    for path in ("/v1/allocations", "/v1/explain"):
        response = await stack.http.post(path, json={"gpu_count": 1, **body}, headers=stack.acme)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == code
        assert error["message"] == f"the request is not valid: {field}: {message}"
        assert error["details"][0]["field"] == field
    assert await _allocations(stack) == 0 and await _allocation_workflows(stack) == []


async def test_a_gpu_that_is_not_the_pinned_nodes_is_422_with_its_gpus_as_choices(stack: Stack) -> None:
    body = {"gpu_count": 2, "nodes": ["small"], "gpus": ["0000:10:00.0", "0000:12:00.0"]}
    for path in ("/v1/allocations", "/v1/explain"):
        response = await stack.http.post(path, json=body, headers=stack.acme)
        assert response.status_code == 422, response.text
        assert response.json()["error"] == {
            "code": "unknown_gpu",
            "message": "gpu '0000:12:00.0' is not an approved GPU of node small; choose one of: 0000:10:00.0, "
            "0000:11:00.0",
            "details": [
                {"field": "body.gpus[1]", "value": "0000:12:00.0", "choices": ["0000:10:00.0", "0000:11:00.0"]}
            ],
        }
    assert await _allocations(stack) == 0 and await _allocation_workflows(stack) == []


CLOUD_CONFIG = "#cloud-config\n# the tenant's own comment\npackages: [htop]\nruncmd:\n  - [touch, /var/tmp/ready]\n"


async def test_user_data_reaches_the_vm_spec_as_written(stack: Stack) -> None:
    allocation_id = await stack.create(2, user_data=CLOUD_CONFIG)
    await stack.wait_for(allocation_id, "active")
    history = await stack.lab.starter.get_workflow_handle(f"allocation/{allocation_id}").fetch_history()
    converter = stack.lab.starter.data_converter
    started = history.events[0].workflow_execution_started_event_attributes
    [workflow_input] = await converter.decode(started.input.payloads, [AllocationInput])
    assert workflow_input.user_data == CLOUD_CONFIG
    [create_vm] = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "create_vm"
    ]
    [spec] = await converter.decode(create_vm.input.payloads, [VmSpec])
    assert spec.user_data == CLOUD_CONFIG  # the text itself, comments and all: the agent merges it into the seed
    async with stack.lab.sessions() as session:
        recorded = await session.scalar(select(AllocationRow.request).where(AllocationRow.id == allocation_id))
    assert recorded["user_data"] == CLOUD_CONFIG  # a retry of a failed allocation starts again from this body

    # The header alone is an empty cloud-config; without user-data the recorded body has no such key (its
    # fingerprint is the one it had before the field existed).
    bare = await stack.create(1, user_data="#cloud-config\r\n")
    plain = await stack.create(1)
    async with stack.lab.sessions() as session:
        rows = {row.id: row.request for row in await session.execute(select(AllocationRow.id, AllocationRow.request))}
    assert rows[bare]["user_data"] == "#cloud-config\r\n" and "user_data" not in rows[plain]


@pytest.mark.parametrize(
    ("user_data", "problem", "message"),
    [
        (
            "packages: [htop]\n",
            "user_data_header",
            "must start with the line #cloud-config: cloud-init reads the document as cloud-config only then",
        ),
        (
            "#cloud-config-archive\n- type: text/cloud-config\n",
            "user_data_header",
            "must start with the line #cloud-config: cloud-init reads the document as cloud-config only then",
        ),
        (
            "#cloud-config\n- htop\n",
            "user_data_not_mapping",
            "is a YAML list, not a mapping: a cloud-config document maps module keys",
        ),
        (
            "#cloud-config\nruncmd: [\n",
            "user_data_yaml",
            "is not YAML: while parsing a flow node expected the node content, but found '<stream end>' in "
            '"<unicode string>", line 3, column 1: ^',
        ),
        (
            "#cloud-config\na: " + "[" * 2000 + "]" * 2000 + "\n",
            "user_data_yaml",
            "is not YAML: it is nested too deeply",
        ),
        (
            "#cloud-config\npackages: [htop]\nusers:\n  - name: me\n",
            "user_data_reserved_key",
            "may not set users, which Berth's seed sets itself (users: a users list replaces the default user, which "
            "carries the allocation's ssh_public_keys, and would lock the tenant out)",
        ),
        (
            "#cloud-config\nssh_pwauth: true\nhostname: mine\n",
            "user_data_reserved_key",
            "may not set hostname, ssh_pwauth, which Berth's seed sets itself (hostname: Berth names the VM after its "
            "allocation; ssh_pwauth: Berth's VMs take key logins only)",
        ),
        (
            "#cloud-config\n# " + "x" * USER_DATA_MAX_BYTES + "\n",
            "user_data_too_large",
            f"is {USER_DATA_MAX_BYTES + 17} bytes; user-data may be at most 65536 bytes (64 KiB)",
        ),
        (
            "#cloud-config\n# " + "é" * (USER_DATA_MAX_BYTES // 2) + "\n",  # within maxLength, over in bytes
            "user_data_too_large",
            f"is {USER_DATA_MAX_BYTES + 17} bytes; user-data may be at most 65536 bytes (64 KiB)",
        ),
    ],
    ids=[
        "no_header",
        "archive_header",
        "list",
        "not_yaml",
        "nested_too_deeply",
        "users",
        "hostname_and_ssh_pwauth",
        "too_large",
        "too_large_in_bytes",
    ],
)
async def test_user_data_the_seed_cannot_take_is_422_naming_the_problem_and_creates_nothing(
    stack: Stack, user_data: str, problem: str, message: str
) -> None:
    for path in ("/v1/allocations", "/v1/explain"):
        response = await stack.http.post(path, json={"gpu_count": 1, "user_data": user_data}, headers=stack.acme)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_request"
        assert error["message"] == f"the request is not valid: body.user_data: {message}"
        assert [(p["field"], p["type"], p["message"]) for p in error["details"]] == [
            ("body.user_data", problem, message)
        ]
    assert await _allocations(stack) == 0 and await _allocation_workflows(stack) == []
