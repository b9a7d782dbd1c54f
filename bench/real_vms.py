"""Real VMs benchmark: the guest image's build, and real guests booted by the libvirt runtime on libvirt's QEMU driver.

    python -m bench.real_vms [--rounds 3] [--cold-rounds 1] [--json]

What it times, each the median over its rounds (seconds):

- the guest image (devstack/guest_image.py): a cold build into a fresh temporary cache (`ensure_image(cache=...)`,
  mmdebstrap to a compressed qcow2 with its kernel and initrd; about a minute, so `--cold-rounds` defaults to 1),
  and `ensure_image()` on the machine's warm cache (reading its manifest);
- one guest through `LibvirtVmDriver`: define -> running (`create`: the overlay, the NoCloud seed, the domain
  defined and started), running -> the `ssh` gate passes (a TCP connection to port 22 on the address of libvirt's
  DHCP lease), running -> ready (`readiness(...).ready`: `cloud-init status --wait` done through the guest agent;
  the `gpus` gate is skipped, nothing is passed through here), release -> the domain gone (`destroy` until libvirt
  no longer knows the name);
- two guests created at once (a thread each), the same phases, each the slower of the two.

Readiness is probed every 0.5 s, as often as the node agent's poll at most, so a phase's figure is up to about half
a second (plus one probe) late. A round boots one guest, then two; `--rounds` rounds.

The setting is the real_vm tests' (tests/real_vm/conftest.py, whose network helpers it imports): the guests boot
under TCG (`accelerator="tcg"`: this machine's nested KVM hangs guests), from the kernel and initrd beside the image
(`firmware="bios"`), with 1 vCPU and 640 MiB each, on an isolated libvirt network of the benchmark's own (no
<forward>: a bridge and dnsmasq on a free /24 that only this host and these guests sit on) and a transient
directory pool under /var/lib/libvirt/images. Every domain, the network, the pool and every folder it made are
removed when it ends, whether it finished or failed (SIGTERM and Ctrl-C included). It needs root, QEMU, libvirtd
and virtlogd (scripts/test-prerequisites.sh installs and starts them), and the image's build tools.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.libvirt.domain import domain_name
from agent.libvirt.driver import LibvirtVmDriver
from contracts.allocation import VmSpec
from devstack.guest_image import GuestImage, ensure_image
from devstack.real_vms import cannot_run, guest_host_settings
from tests.real_vm.conftest import IMAGES_ROOT, URI, VmNetwork, free_subnet, network_xml, vm_spec

POLL_SECONDS = 0.5
BOOT_TIMEOUT = 900.0  # two TCG guests on two cores reach cloud-init's end in a few minutes; a hung boot, never
GONE_TIMEOUT = 60.0
IMAGE_LOCK = Path("/var/lock/berth-guest-image.lock")  # the real_vm tests' lock: one build of the shared cache

PHASES = {
    "create": "define -> running (create)",
    "ssh": "running -> ssh gate passes",
    "ready": "running -> cloud-init done (ready)",
    "gone": "release -> domain gone (destroy)",
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- the guest image ------------------------------------------------------------------------------------------------


def shared_image() -> GuestImage:
    """The machine's cached image (built first if missing), under the real_vm tests' lock."""
    with IMAGE_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return ensure_image()


def measure_image(cold_rounds: int, cached_rounds: int) -> dict[str, list[float]]:
    """Seconds of each cold build (a fresh temporary cache each, removed after) and of each warm `ensure_image()`."""
    samples: dict[str, list[float]] = {"cold": [], "cold_build_seconds": [], "cached": []}
    for round_ in range(cold_rounds):
        scratch = Path(tempfile.mkdtemp(prefix="berth-bench-image-", dir="/var/tmp"))
        try:
            log(f"image: cold build {round_ + 1}/{cold_rounds} into {scratch}")
            started = time.perf_counter()
            image = ensure_image(cache=scratch)
            samples["cold"].append(time.perf_counter() - started)
            samples["cold_build_seconds"].append(image.build_seconds)
            log(f"image: cold build {samples['cold'][-1]:.1f} s ({image.size_bytes / 2**20:.0f} MiB)")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    shared_image()  # built here if the machine had none, and its manifest in the page cache: not timed
    for _ in range(cached_rounds):
        started = time.perf_counter()
        ensure_image()
        samples["cached"].append(time.perf_counter() - started)
    return samples


# ---- the lab: network, pool, driver -----------------------------------------------------------------------------


@dataclass
class Lab:
    connection: Any
    driver: LibvirtVmDriver
    network: VmNetwork
    folder: Path
    public_key: str
    suffix: str


@contextmanager
def lab(image: GuestImage) -> Iterator[Lab]:
    """An isolated network, a transient pool, a tenant key and the driver; all of it removed at the end, and any
    domain whose disks are in the pool with it."""
    import libvirt

    libvirt.registerErrorHandler(lambda _context, _error: None, None)
    connection = libvirt.open(URI)
    suffix = uuid.uuid4().hex[:6]
    undo: list[tuple[str, Callable[[], None]]] = []
    try:
        network = VmNetwork(name=f"berth-bench-{suffix}", bridge=f"brb-{suffix}", subnet=free_subnet())
        made_network = connection.networkCreateXML(network_xml(network))
        undo.append((f"network {network.name}", made_network.destroy))
        if "<forward" in made_network.XMLDesc(0):
            raise RuntimeError(f"network {network.name} forwards traffic: it must be isolated")

        folder = IMAGES_ROOT / f"berth-bench-{suffix}"
        folder.mkdir(parents=True, mode=0o711)
        undo.append((f"folder {folder}", lambda: shutil.rmtree(folder, ignore_errors=True)))
        pool = connection.storagePoolCreateXML(
            f"<pool type='dir'><name>berth-bench-{suffix}</name><target><path>{folder}</path></target></pool>", 0
        )
        undo.append((f"pool berth-bench-{suffix}", pool.destroy))
        undo.append(("domains on the pool", lambda: remove_domains_on(connection, folder)))

        keys = Path(tempfile.mkdtemp(prefix="berth-bench-ssh-"))
        undo.append((f"folder {keys}", lambda: shutil.rmtree(keys, ignore_errors=True)))
        key = keys / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bench@berth", "-f", str(key)], check=True)

        settings = guest_host_settings(image, network.name, f"berth-bench-{suffix}", folder, accelerator="tcg")
        driver = LibvirtVmDriver(settings, {0: sorted(os.sched_getaffinity(0))}, connection=connection)
        log(f"lab: {driver.runtime()}; network {network.name} on {network.bridge} ({network.subnet}, isolated)")
        yield Lab(connection, driver, network, folder, key.with_suffix(".pub").read_text().strip(), suffix)
    finally:
        for what, step in reversed(undo):
            try:
                step()
            except Exception as error:  # keep removing the rest; say what stayed
                log(f"cleanup: could not remove {what}: {error}")
        connection.close()
        log("cleanup: done")


def remove_domains_on(connection: Any, folder: Path) -> None:
    for domain in connection.listAllDomains(0):
        if str(folder) in domain.XMLDesc(0):
            log(f"cleanup: removing {domain.name()}")
            if domain.isActive():
                domain.destroy()
            domain.undefine()


# ---- one boot -------------------------------------------------------------------------------------------------------


def boot(the_lab: Lab, spec: VmSpec, phases: dict[str, float], others: set[str]) -> None:
    """Create the guest and probe it until ready, writing each phase's seconds into `phases` as it passes, and into
    `others` the name of every guest not of this run that was running on the host at a probe (they share the CPUs)."""
    driver = the_lab.driver
    started = time.perf_counter()
    driver.create(spec)
    running = time.perf_counter()
    phases["create"] = running - started
    while True:
        report = driver.readiness(spec.allocation_id, gpu_count=1)
        now = time.perf_counter()
        others.update(foreign_guests(the_lab))
        if report.ssh and "ssh" not in phases:
            phases["ssh"] = now - running
        if report.ready:
            phases["ready"] = now - running
            return
        if report.failed_gate is not None:
            console = "\n".join(report.console[-10:])
            raise RuntimeError(f"{spec.allocation_id}: gate {report.failed_gate} failed: {report.failure}\n{console}")
        if now - running > BOOT_TIMEOUT:
            raise TimeoutError(f"{spec.allocation_id} not ready after {BOOT_TIMEOUT:.0f} s: {report.detail}")
        time.sleep(POLL_SECONDS)


def release(the_lab: Lab, allocation: str, phases: dict[str, float]) -> None:
    """`destroy`, then until libvirt no longer knows the domain's name."""
    import libvirt

    started = time.perf_counter()
    the_lab.driver.destroy(allocation)
    name = domain_name(allocation)
    while True:
        try:
            the_lab.connection.lookupByName(name)
        except libvirt.libvirtError as error:
            if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                break
            raise
        if time.perf_counter() - started > GONE_TIMEOUT:
            raise TimeoutError(f"{name} still defined {GONE_TIMEOUT:.0f} s after its release")
        time.sleep(0.05)
    phases["gone"] = time.perf_counter() - started


def at_once(work: list[Callable[[], None]]) -> None:
    """Each callable in a thread of its own, started together; the first error is raised once all have ended."""
    errors: list[BaseException] = []

    def run(step: Callable[[], None]) -> None:
        try:
            step()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(step,), daemon=True) for step in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def foreign_guests(the_lab: Lab) -> list[str]:
    """The running domains that are not this run's guests: someone else's, sharing this host's CPUs."""
    import libvirt

    ours = domain_name(f"bench-{the_lab.suffix}-")
    active = the_lab.connection.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
    return [domain.name() for domain in active if not domain.name().startswith(ours)]


def boot_round(the_lab: Lab, round_: int, guests: int) -> dict[str, Any]:
    """`guests` guests created at once, probed until ready, then released at once: each phase's slowest guest, and
    the other guests seen running on the host meanwhile (`others`: a figure with any is not an idle machine's)."""
    specs = [
        vm_spec(
            f"bench-{the_lab.suffix}-r{round_}-{guests}x{index}",
            mac(the_lab.suffix, round_, guests, index),
            the_lab.public_key,
            slot=index,
        )
        for index in range(guests)
    ]
    phases: list[dict[str, float]] = [{} for _ in specs]
    pairs = list(zip(specs, phases, strict=True))
    others: set[str] = set(foreign_guests(the_lab))
    released = False
    try:
        at_once([lambda s=spec, p=found: boot(the_lab, s, p, others) for spec, found in pairs])
        at_once([lambda s=spec, p=found: release(the_lab, s.allocation_id, p) for spec, found in pairs])
        released = True
    finally:
        for allocation in [] if released else [spec.allocation_id for spec in specs]:  # a failed round's guests
            try:
                the_lab.driver.destroy(allocation)
            except Exception as error:
                log(f"cleanup: could not destroy {allocation}: {error}")
    return {**{phase: max(found[phase] for found in phases) for phase in PHASES}, "others": sorted(others)}


def mac(suffix: str, round_: int, guests: int, index: int) -> str:
    """A MAC of its own per guest of a run (libvirt's 52:54:00 prefix), so an old DHCP lease never answers for it."""
    return f"52:54:00:{suffix[:2]}:{round_ % 256:02x}:{guests * 16 + index:02x}"


# ---- the run ------------------------------------------------------------------------------------------------------


def measure(rounds: int, cold_rounds: int) -> dict[str, Any]:
    image_samples = measure_image(cold_rounds, cached_rounds=rounds)
    image = shared_image()
    boots: dict[str, list[dict[str, Any]]] = {"one": [], "two": []}
    with lab(image) as the_lab:
        for round_ in range(1, rounds + 1):
            for label, guests in (("one", 1), ("two", 2)):
                log(f"round {round_}/{rounds}: {guests} guest(s)")
                found = boot_round(the_lab, round_, guests)
                boots[label].append(found)
                others = f"; other guests running meanwhile: {', '.join(found['others'])}" if found["others"] else ""
                log("  " + ", ".join(f"{phase} {found[phase]:.1f} s" for phase in PHASES) + others)
    return {
        "rounds": rounds,
        "cold_rounds": cold_rounds,
        "poll_seconds": POLL_SECONDS,
        "accelerator": "tcg",
        "cpus": os.cpu_count(),
        "image": {
            "cold_s": median(image_samples["cold"]),
            "cold_build_seconds": median(image_samples["cold_build_seconds"]),
            "cached_s": median(image_samples["cached"]),
            "size_bytes": image.size_bytes,
            "samples": image_samples,
        },
        "boots": {
            label: {
                "median": {phase: median([found[phase] for found in samples]) for phase in PHASES},
                "samples": samples,
            }
            for label, samples in boots.items()
        },
    }


def median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


def print_table(result: dict[str, Any]) -> None:
    image = result["image"]
    print(
        f"medians over {result['rounds']} rounds (the cold build: {result['cold_rounds']}), seconds; TCG, "
        f"{result['cpus']} CPUs, readiness probed every {result['poll_seconds']} s"
    )
    print()
    print("| image | s |")
    print("| --- | ---: |")
    own = image["cold_build_seconds"]
    print(f"| cold build (fresh cache; the build's own clock: {own:.1f}) | {image['cold_s']:.1f} |")
    print(f"| cached (`ensure_image()` on the warm cache) | {image['cached_s']:.4f} |")
    print()
    print("| phase | one guest | two at once (the slower) |")
    print("| --- | ---: | ---: |")
    one, two = result["boots"]["one"]["median"], result["boots"]["two"]["median"]
    for phase, name in PHASES.items():
        print(f"| {name} | {one[phase]:.1f} | {two[phase]:.1f} |")
    for label, samples in result["boots"].items():
        crowded = sum(1 for found in samples["samples"] if found["others"])
        if crowded:
            print(f"\n{label}: {crowded} of {len(samples['samples'])} rounds ran beside other guests on this host")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="boot rounds (each: one guest, then two at once)")
    parser.add_argument("--cold-rounds", type=int, default=1, help="cold image builds (about a minute each)")
    parser.add_argument("--json", action="store_true", help="print the figures and every sample as JSON")
    args = parser.parse_args()
    missing = cannot_run()
    if missing is not None:
        raise SystemExit(f"real VMs cannot boot on this machine: {missing}")

    def terminated(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # through every `finally`: nothing is left behind

    signal.signal(signal.SIGTERM, terminated)
    result = measure(max(1, args.rounds), max(0, args.cold_rounds))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
