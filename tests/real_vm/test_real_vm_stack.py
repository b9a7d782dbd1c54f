"""`berth up --real-vms` as a user meets it: allocations made through the CLI and the HTTP API boot real guests.

One stack for the module (examples/real-vms/fleet.yaml: one host, two slots). Two allocations boot side by side on
the host: one a tenant waits for with `berth alloc create --user-data FILE --wait` while the node agent is killed
with -9 mid-boot, the other with user-data that makes cloud-init fail. The first is `active` only once its gates
pass, shows its address, lets the tenant in over SSH with its key (as the image's user, never root) where its
user-data has run; its QEMU killed from outside, the agent sees a dead VM and its owner is told; released, it leaves
nothing, and the slot serves again without a repair. The second fails its attempt with cloud-init's own words, and
the saga undoes everything it did.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from config.context import read_context
from config.settings import Settings
from devstack.real_vms import domains_on
from devstack.stack import DevStack, real_vms_fleet_file
from tests.real_vm.conftest import ssh

pytestmark = [pytest.mark.real_vm, pytest.mark.xdist_group("real_vm")]

GOOD_USER_DATA = "#cloud-config\nruncmd:\n  - [sh, -c, 'echo made by user-data > /var/tmp/berth-user-data']\n"
FAILING_USER_DATA = "#cloud-config\nruncmd:\n  - [sh, -c, 'echo the tenant script failed >&2; exit 3']\n"


@pytest.fixture(scope="module")
def stack(real_libvirt, guest_image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    home = tmp_path_factory.mktemp("real-vm-stack")
    lines: list[str] = []
    stack = DevStack(
        Settings(state_dir=home / "state"), real_vms_fleet_file(), say=lines.append, real_vms=True, accelerator="tcg"
    )
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()
    assert any(line.startswith("real VMs: ") and "removed" in line for line in lines), lines


def berth(stack: DevStack, *arguments: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The `berth` command as a user runs it beside the stack (it finds the stack by its context file)."""
    env = {**os.environ, "BERTH_STATE_DIR": str(stack.settings.state_dir), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *arguments],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def api(stack: DevStack) -> httpx.Client:
    assert stack.context is not None
    token = stack.context.tenant_tokens["acme"]
    return httpx.Client(base_url=stack.context.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def wait_for(client: httpx.Client, allocation: str, states: set[str], timeout: float = 400) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        current = client.get(f"/v1/allocations/{allocation}").json()
        if current["state"] in states:
            return current
        assert time.monotonic() < deadline, f"{allocation} is {current['state']} after {timeout}s"
        time.sleep(1)


def domains(real_libvirt, stack_folder: str) -> list[str]:
    return domains_on(real_libvirt, Path(stack_folder))


def test_two_allocations_boot_real_guests_side_by_side_through_the_cli_and_the_api(
    stack: DevStack, real_libvirt, ssh_key, tmp_path: Path
) -> None:
    key, public_key = ssh_key
    pool_folder = str(stack._real_vms.folder) if stack._real_vms else ""
    assert pool_folder

    with api(stack) as client:
        bad = client.post(
            "/v1/allocations",
            json={
                "gpu_count": 1,
                "shape": "gpu_slice",
                "ssh_public_keys": [public_key],
                "user_data": FAILING_USER_DATA,
            },
        )
        assert bad.status_code == 202, bad.text
        bad_id = bad.json()["id"]

        # The tenant's own command, waiting; meanwhile the node agent is killed mid-boot and restarted.
        key_file = tmp_path / "key.pub"
        key_file.write_text(public_key + "\n")
        user_data = tmp_path / "user-data.yaml"
        user_data.write_text(GOOD_USER_DATA)
        command = ["alloc", "create", "--gpus", "1", "--ssh-key", str(key_file), "--user-data", str(user_data)]
        waited: dict[str, subprocess.CompletedProcess[str]] = {}
        create = threading.Thread(target=lambda: waited.update(done=berth(stack, *command, "--wait", "-o", "json")))
        create.start()
        deadline = time.monotonic() + 120
        while len(domains(real_libvirt, pool_folder)) < 2:
            assert time.monotonic() < deadline, f"the two guests were never both defined: {waited}"
            time.sleep(0.5)
        context = read_context(stack.settings)
        assert context is not None
        killed = context.processes["agents"]
        os.kill(killed, signal.SIGKILL)
        stack.wait_ready("agents", 60, replacing=killed)
        create.join()

        done = waited["done"]
        assert done.returncode == 0, done.stdout + done.stderr
        good = json.loads(done.stdout)
        assert good["state"] == "active"
        good_id = good["id"]
        shown = berth(stack, "alloc", "get", good_id, "-o", "json")
        assert shown.returncode == 0, shown.stderr
        [bundle] = json.loads(shown.stdout)["bundles"]
        address = bundle["private_ip"]
        assert address.startswith("10.213.250.")
        # The tenant's key logs in as the image's default user; the seed named the guest and ran the user-data.
        inside = ssh(key, address, "hostname; cat /var/tmp/berth-user-data; cloud-init status")
        assert inside.returncode == 0, inside.stderr
        assert inside.stdout.split("\n")[:3] == [f"berth-{good_id}", "made by user-data", "status: done"]
        assert ssh(key, address, "true", user="root").returncode != 0  # no root logins

        # Its QEMU killed from outside: the agent sees a dead VM and the allocation's health path tells its owner.
        qemu = int(Path(f"/run/libvirt/qemu/berth-{good_id}.pid").read_text())
        os.kill(qemu, signal.SIGKILL)
        degraded = wait_for(client, good_id, {"degraded", "failed", "released"}, timeout=60)
        assert degraded["state"] == "degraded", degraded
        [told] = [event["reason"] for event in degraded["events"] if event["step"] == "gpu_failed"]
        assert f"the VM holding the GPU stopped: the VM berth-{good_id} is not running (" in told, told

        failed = wait_for(client, bad_id, {"failed", "cancelled", "active"})
        assert failed["state"] == "failed", failed
        reason = failed["attempts"][0]["reason"]
        assert reason.startswith("readiness_failed: cloud_init: status: error"), reason
        assert "scripts_user" in reason or "scripts-user" in reason, reason
        assert f"berth-{bad_id}" not in domains(real_libvirt, pool_folder)  # the saga destroyed its VM

        released = berth(stack, "alloc", "release", good_id, "--wait")
        assert released.returncode == 0, released.stdout + released.stderr
        assert domains(real_libvirt, pool_folder) == []
        assert sorted(os.listdir(pool_folder)) == []  # overlays, seeds and console logs: all gone
    # A stopped VM failed its allocation, not the GPU: once it is torn down the slot serves again, no repair needed.
    assert stack.context is not None
    admin = {"Authorization": f"Bearer {stack.context.admin_token}"}
    deadline = time.monotonic() + 60
    while True:
        node = httpx.get(f"{stack.context.api_url}/v1/nodes/vmhost-1", headers=admin, timeout=30).json()
        counts = (node["available_slots"], node["reserved_slots"], node["quarantined_slots"], len(node["unhealthy"]))
        if counts == (2, 0, 0, 0):
            break
        assert time.monotonic() < deadline, (counts, node["unhealthy"], node["quarantined"], node["signals"])
        time.sleep(1)
