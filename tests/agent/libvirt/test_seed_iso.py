"""The cloud-init NoCloud seed: what a guest reads off the ISO, and that one config always gives one image."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pycdlib
import pytest
import yaml

from agent.libvirt.seed import (
    GuestInterface,
    SeedConfig,
    build_seed_iso,
    seed_files,
    write_seed_iso,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq0Kc0bG2d0mW8n0Gm3V9k8sA3k5s0mJ8eXl2k4h8mB tenant@laptop"


def config(**overrides: object) -> SeedConfig:
    values: dict[str, object] = {
        "instance_id": "alloc-7f3a",
        "hostname": "vm-alloc-7f3a",
        "ssh_public_keys": [KEY],
        "interfaces": [
            GuestInterface(
                mac="52:54:00:12:34:56", address="10.100.0.11", gateway="10.100.0.1", nameservers=["10.100.0.2"]
            )
        ],
    }
    values.update(overrides)
    return SeedConfig.model_validate(values)


def open_iso(image: bytes) -> pycdlib.PyCdlib:
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(image))
    return iso


def read(iso: pycdlib.PyCdlib, **path: str) -> bytes:
    out = io.BytesIO()
    iso.get_file_from_iso_fp(out, **path)
    return out.getvalue()


def names(iso: pycdlib.PyCdlib, **path: str) -> set[str]:
    """The file names under the root as a guest sees them, `.` and `..` left out."""
    found = set()
    for record in iso.list_children(**path):
        if record.is_dot() or record.is_dotdot():
            continue
        if "rr_path" in path:
            found.add(record.rock_ridge.name().decode())
        else:
            found.add(record.file_identifier().decode("utf-16-be"))
    return found


def test_the_iso_holds_exactly_the_three_nocloud_files_under_label_cidata() -> None:
    iso = open_iso(build_seed_iso(config()))
    try:
        assert iso.pvd.volume_identifier.decode().rstrip() == "cidata"
        assert iso.has_joliet() and iso.has_rock_ridge()
        assert names(iso, joliet_path="/") == {"meta-data", "user-data", "network-config"}
        assert names(iso, rr_path="/") == {"meta-data", "user-data", "network-config"}
        for name, content in seed_files(config()).items():
            assert read(iso, joliet_path=f"/{name}") == content
            assert read(iso, rr_path=f"/{name}") == content
    finally:
        iso.close()


def test_the_guest_reads_who_it_is_who_may_log_in_and_how_its_nic_is_addressed() -> None:
    iso = open_iso(build_seed_iso(config()))
    try:
        meta = yaml.safe_load(read(iso, rr_path="/meta-data"))
        raw_user = read(iso, rr_path="/user-data")
        network = yaml.safe_load(read(iso, rr_path="/network-config"))
    finally:
        iso.close()

    assert meta == {"instance-id": "alloc-7f3a", "local-hostname": "vm-alloc-7f3a"}
    assert raw_user.startswith(b"#cloud-config\n")
    assert yaml.safe_load(raw_user) == {
        "hostname": "vm-alloc-7f3a",
        "ssh_authorized_keys": [KEY],
        "ssh_pwauth": False,
        "disable_root": True,
    }
    assert network == {
        "version": 2,
        "ethernets": {
            "nic0": {
                "match": {"macaddress": "52:54:00:12:34:56"},
                "addresses": ["10.100.0.11/24"],
                "routes": [{"to": "default", "via": "10.100.0.1"}],
                "nameservers": {"addresses": ["10.100.0.2"]},
            }
        },
    }


def test_an_interface_without_an_address_asks_for_dhcp_and_each_nic_gets_its_own_id() -> None:
    interfaces = [
        GuestInterface(mac="52:54:00:AA:BB:01", address="192.168.5.20", prefix=28),
        GuestInterface(mac="52:54:00:aa:bb:02"),
    ]
    network = yaml.safe_load(seed_files(config(interfaces=interfaces))["network-config"])
    assert network["ethernets"] == {
        "nic0": {"match": {"macaddress": "52:54:00:aa:bb:01"}, "addresses": ["192.168.5.20/28"]},
        "nic1": {"match": {"macaddress": "52:54:00:aa:bb:02"}, "dhcp4": True},
    }


@pytest.fixture
def restore_timezone():
    yield
    time.tzset()


def test_one_config_gives_one_image_whatever_the_clock_or_time_zone(
    monkeypatch: pytest.MonkeyPatch, restore_timezone: None
) -> None:
    first = build_seed_iso(config())
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    later = time.time() + 86_400 * 400 + 3_661
    monkeypatch.setattr(time, "time", lambda: later)
    assert build_seed_iso(config()) == first


def test_a_changed_config_gives_a_different_image() -> None:
    image = build_seed_iso(config())
    assert build_seed_iso(config(hostname="vm-other")) != image
    assert build_seed_iso(config(ssh_public_keys=[])) != image
    other_nic = [GuestInterface(mac="52:54:00:12:34:56", address="10.100.0.12", gateway="10.100.0.1")]
    assert build_seed_iso(config(interfaces=other_nic)) != image


def test_operator_additions_are_merged_but_may_not_replace_what_the_seed_sets() -> None:
    extra = {"package_update": False, "runcmd": [["touch", "/run/berth-seeded"]]}
    user = yaml.safe_load(seed_files(config(user_data_extra=extra))["user-data"])
    assert user["runcmd"] == [["touch", "/run/berth-seeded"]] and user["package_update"] is False
    assert user["ssh_pwauth"] is False

    with pytest.raises(ValueError, match="disable_root, ssh_pwauth"):
        config(user_data_extra={"ssh_pwauth": True, "disable_root": False, "runcmd": []})


def test_a_config_without_ssh_keys_still_builds() -> None:
    iso = open_iso(build_seed_iso(config(ssh_public_keys=[])))
    try:
        user = yaml.safe_load(read(iso, rr_path="/user-data"))
    finally:
        iso.close()
    assert user["ssh_authorized_keys"] == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"interfaces": []},
        {"interfaces": [{"mac": "52:54:00:12:34"}]},
        {"interfaces": [{"mac": "52:54:00:12:34:56", "address": "10.100.0.300"}]},
        {"interfaces": [{"mac": "52:54:00:12:34:56", "gateway": "10.100.0.1"}]},
        {"interfaces": [{"mac": "52:54:00:12:34:56", "address": "10.100.0.11", "gateway": "10.101.0.1"}]},
        {"interfaces": [{"mac": "52:54:00:12:34:56"}, {"mac": "52:54:00:12:34:56", "address": "10.0.0.2"}]},
        {"hostname": "not_a_host"},
        {"ssh_public_keys": [KEY + "\nssh-rsa AAAA intruder"]},
    ],
)
def test_configs_a_guest_could_not_use_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        config(**overrides)


def test_write_seed_iso_is_atomic_and_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "seeds" / "alloc-7f3a.iso"
    assert write_seed_iso(config(), path) == path
    assert path.read_bytes() == build_seed_iso(config())
    assert path.stat().st_mode & 0o777 == 0o644
    inode = path.stat().st_ino

    write_seed_iso(config(), path)
    assert path.stat().st_ino == inode  # an identical seed is not rewritten

    write_seed_iso(config(hostname="vm-renamed"), path)
    assert path.read_bytes() == build_seed_iso(config(hostname="vm-renamed"))
    assert os.listdir(path.parent) == [path.name]  # no temp file left behind
