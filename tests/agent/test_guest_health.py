"""The guest's view of its GPUs: `nvidia-smi -q` and the kernel's Xid lines of the fixtures under
tests/hosts/guest/ (their README says where their shape comes from), parsed and judged by the one verdict function,
and read through the real libvirt VM runtime (libvirt's test driver) with the guest agent answering as QEMU
documents. A guest that does not answer is `unknown`, never healthy; a guest still booting is not asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.guest_health import Exited, guest_signals
from agent.libvirt.guest import Recorded, RecordedGuestAgent
from agent.libvirt.guest_health import GuestHealthWatch
from scheduler.host.health import HealthState, PcieSignals, SlotSignals, assess

GUEST = Path(__file__).resolve().parent.parent / "hosts" / "guest"
GPU = PcieSignals(
    address="0000:3c:00.0",
    present=True,
    driver="vfio-pci",
    aer_fatal=0,
    aer_nonfatal=0,
    aer_correctable=0,
    link_speed=32.0,
    max_link_speed=32.0,
    link_width=16,
    max_link_width=16,
)


def recorded(case: str) -> tuple[Exited, Exited]:
    folder = GUEST / case
    out = folder / "nvidia-smi-q.txt"
    err = folder / "nvidia-smi-q.stderr"
    smi = Exited(
        exit_code=int((folder / "nvidia-smi-q.rc").read_text()),
        stdout=out.read_text() if out.exists() else "",
        stderr=err.read_text() if err.exists() else "",
    )
    return smi, Exited(exit_code=0, stdout=(folder / "dmesg.txt").read_text())


def verdict(case: str) -> tuple[HealthState, list[str]]:
    [reading] = guest_signals(*recorded(case), gpus=1)
    judged = assess(SlotSignals(index=0, gpu=GPU, guest=reading))
    return judged.state, judged.reasons


@pytest.mark.parametrize(
    ("case", "state", "first_reason"),
    [
        ("clean", HealthState.HEALTHY, None),
        ("xid48", HealthState.FAILED, "Xid 48 (Double bit ECC error): NVIDIA says RESET_GPU"),
        ("xid63", HealthState.DEGRADED, "a row remap of the GPU's memory waits for a GPU reset (nvidia-smi -q)"),
        ("xid64", HealthState.FAILED, "the GPU's row remapping failed (nvidia-smi -q): NVIDIA says CONTACT_SUPPORT"),
        ("xid79", HealthState.FAILED, "the guest's driver lost the GPU (nvidia-smi -q: GPU is lost)"),
        ("xid94", HealthState.DEGRADED, "a row remap of the GPU's memory waits for a GPU reset (nvidia-smi -q)"),
        ("xid95", HealthState.FAILED, "Xid 95 (Uncontained ECC error): NVIDIA says RESET_GPU"),
        ("xid119", HealthState.FAILED, "Xid 119 (GSP RPC timeout): NVIDIA says RESET_GPU"),
    ],
)
def test_each_recorded_guest_gets_the_verdict_nvidia_s_catalog_gives_it(
    case: str, state: HealthState, first_reason: str | None
) -> None:
    judged, reasons = verdict(case)
    assert judged is state
    assert (reasons[0] if reasons else None) == first_reason


def test_every_reason_of_a_double_bit_error_is_listed_worst_first() -> None:
    assert verdict("xid48")[1] == [
        "Xid 48 (Double bit ECC error): NVIDIA says RESET_GPU",
        "a row remap of the GPU's memory waits for a GPU reset (nvidia-smi -q)",
        "the GPU logged 1 uncorrectable ECC errors (nvidia-smi -q)",
        "Xid 63 (ECC page retirement or row remapping recording event): NVIDIA says RESET_GPU",
    ]


def test_the_guest_s_gpus_in_pci_order_are_the_plan_s_bundles_in_order() -> None:
    smi, kernel = recorded("clean-two-gpus")
    kernel = Exited(
        exit_code=0,
        stdout=kernel.stdout + "[ 77.1] NVRM: Xid (PCI:0000:08:00): 79, pid=1, GPU has fallen off the bus.\n",
    )
    first, second = guest_signals(smi, kernel, gpus=2)
    assert (first.answered, first.xids, second.xids) == (True, [], [79])
    assert guest_signals(smi, kernel, gpus=3)[2].detail == "nvidia-smi -q lists 2 of 3 GPUs"


def test_a_guest_without_nvidia_smi_is_unknown_never_healthy() -> None:
    missing = Exited(exit_code=127, stderr="nvidia-smi: not found")
    [reading] = guest_signals(missing, None, gpus=1)
    judged = assess(SlotSignals(index=0, gpu=GPU, guest=reading))
    assert judged.state is HealthState.UNKNOWN
    assert judged.reasons == [
        "the guest driver did not answer for the GPU (nvidia-smi -q failed: nvidia-smi: not found): "
        "its health is unknown"
    ]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_watch_starts_each_command_once_polls_it_later_and_looks_again_after_its_interval() -> None:
    smi, kernel = recorded("xid63")
    agent = RecordedGuestAgent(
        outcomes={
            "nvidia-smi -q": Recorded(exit_code=0, stdout=smi.stdout, polls_before_exit=1),
            "dmesg": Recorded(exit_code=0, stdout=kernel.stdout),
        }
    )
    clock = Clock()
    watch = GuestHealthWatch(agent, interval=60, clock=clock)
    assert watch.look("berth-a", 1) == []  # started, nothing to say yet
    assert watch.look("berth-a", 1) == []  # nvidia-smi still running
    [reading] = watch.look("berth-a", 1)
    assert (reading.remap_pending, reading.xids) == (True, [63])
    assert watch.look("berth-a", 1) == [reading]  # within the interval: the last reading, nothing started
    assert [line for _, line in agent.started] == ["nvidia-smi -q", "dmesg"]
    clock.now += 60
    watch.look("berth-a", 1)
    assert [line for _, line in agent.started] == ["nvidia-smi -q", "dmesg"] * 2


def test_a_guest_agent_that_does_not_answer_makes_every_gpu_of_the_vm_unknown() -> None:
    watch = GuestHealthWatch(RecordedGuestAgent(reachable=False), clock=Clock())
    readings = watch.look("berth-a", 2)
    assert [(r.answered, r.detail) for r in readings] == [
        (False, "Guest agent is not responding: QEMU guest agent is not connected")
    ] * 2


def test_a_command_that_never_finishes_is_unknown_after_the_interval() -> None:
    agent = RecordedGuestAgent(outcomes={"nvidia-smi -q": Recorded(polls_before_exit=10**6), "dmesg": Recorded()})
    clock = Clock()
    watch = GuestHealthWatch(agent, interval=60, clock=clock)
    watch.look("berth-a", 1)
    clock.now += 61
    [reading] = watch.look("berth-a", 1)
    assert (reading.answered, reading.detail) == (False, "nvidia-smi -q did not finish within 60s")
