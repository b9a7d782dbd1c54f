"""The cloud-init NoCloud seed of a libvirt VM: three small YAML files on an ISO labelled `cidata`.

cloud-init's NoCloud datasource finds the seed by its volume label (exactly `cidata`) and reads `meta-data` and
`user-data` (both required) and `network-config` (optional; we always write one so the guest never falls back to
DHCP on whichever NIC it finds first). The seed is a pure function of `SeedConfig`: the same config gives the same
bytes, so a retried `create_vm` rewrites nothing and two agents can compare seeds by hash.

Reproducible bytes. pycdlib stamps the wall clock, in the host's local time zone, into every volume descriptor,
every directory record and every Rock Ridge TF entry. `build_seed_iso` pins them all to `SEED_DATE` (UTC):

- volume creation and effective dates, directory-record dates and Rock Ridge TF times: replaced on pycdlib's objects
  after the files are added and before the image is written (the attributes `volume_creation_date`,
  `volume_effective_date`, `root_dir_record`, `children`, `date`, `rock_ridge.dr_entries.tf_record`);
- the volume modification date: pycdlib makes a fresh one from `time.time()` inside the volume descriptor's
  `record()`, with no argument to override it, so it is overwritten in the written image at its ECMA-119 position
  (bytes 831-847 of each primary and supplementary volume descriptor, sectors 16 onwards up to the terminator).
  That touches nothing pycdlib computes from it (no checksum covers a volume descriptor).
"""

from __future__ import annotations

import io
import ipaddress
import os
import re
import struct
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pycdlib
import yaml
from pycdlib import dates
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contracts.allocation import USER_DATA_RESERVED_KEYS

VOLUME_LABEL = "cidata"
SEED_DATE = datetime(2000, 1, 1, tzinfo=UTC)
"""Every date in the image. Any fixed instant would do; nothing in cloud-init reads them."""

# The ISO 9660 (level 1, 8.3) names; Joliet and Rock Ridge carry the real ones, which is what guests read.
_FILES = (
    ("meta-data", "/METADATA.;1"),
    ("user-data", "/USERDATA.;1"),
    ("network-config", "/NETCFG.;1"),
)
_USER_DATA_KEYS = tuple(USER_DATA_RESERVED_KEYS)  # what the seed sets itself: no addition may replace it

_SECTOR = 2048
_FIRST_VD_SECTOR = 16
_VD_PRIMARY, _VD_SUPPLEMENTARY, _VD_TERMINATOR = 1, 2, 255
_VD_MODIFICATION_DATE = slice(830, 847)  # ECMA-119 8.4.27: BP 831 to 847

_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_HOSTNAME_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


class GuestInterface(BaseModel):
    """One guest NIC, matched by MAC so the config applies whatever name the guest kernel gives it."""

    model_config = ConfigDict(frozen=True)

    mac: str
    address: str | None = None
    prefix: int = Field(default=24, ge=1, le=32)
    # More addresses on the same NIC: a multi-GPU VM has one NIC and one private IP per bundle
    # (docs/seeds.md, "The GPU slice bundle").
    extra_addresses: list[str] = Field(default_factory=list)
    gateway: str | None = None
    nameservers: list[str] = Field(default_factory=list)

    @field_validator("mac")
    @classmethod
    def _mac(cls, value: str) -> str:
        """Lower-case so two spellings of one MAC give one seed (and netplan matches either way)."""
        mac = value.strip().lower()
        if not _MAC.match(mac):
            raise ValueError(f"not a MAC address: {value!r}")
        return mac

    @field_validator("address", "gateway")
    @classmethod
    def _ipv4(cls, value: str | None) -> str | None:
        return None if value is None else str(ipaddress.IPv4Address(value.strip()))

    @field_validator("extra_addresses")
    @classmethod
    def _extra(cls, value: list[str]) -> list[str]:
        return [str(ipaddress.IPv4Address(address.strip())) for address in value]

    @field_validator("nameservers")
    @classmethod
    def _nameservers(cls, value: list[str]) -> list[str]:
        return [str(ipaddress.ip_address(server.strip())) for server in value]

    @model_validator(mode="after")
    def _gateway_on_link(self) -> GuestInterface:
        """A default route needs a gateway inside the static subnet; netplan would reject it only at boot."""
        if self.extra_addresses and self.address is None:
            raise ValueError(f"interface {self.mac}: extra addresses need a first static address")
        if self.gateway is None:
            return self
        if self.address is None:
            raise ValueError(f"interface {self.mac}: a gateway needs a static address (DHCP brings its own)")
        if ipaddress.IPv4Address(self.gateway) not in self.network():
            raise ValueError(f"interface {self.mac}: gateway {self.gateway} is outside {self.network()}")
        return self

    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Interface(f"{self.address}/{self.prefix}").network


class SeedConfig(BaseModel):
    """What the guest must know on first boot: who it is, who may log in, how its NICs are addressed."""

    model_config = ConfigDict(frozen=True)

    instance_id: str = Field(min_length=1, description="the allocation id; a new id makes cloud-init run again")
    hostname: str
    ssh_public_keys: list[str] = Field(default_factory=list)
    interfaces: list[GuestInterface] = Field(min_length=1)
    user_data_extra: dict[str, object] | None = None

    @field_validator("hostname")
    @classmethod
    def _hostname(cls, value: str) -> str:
        hostname = value.strip().lower()
        if len(hostname) > 253 or not all(_HOSTNAME_LABEL.match(label) for label in hostname.split(".")):
            raise ValueError(f"not a valid hostname: {value!r}")
        return hostname

    @field_validator("ssh_public_keys")
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:
        """One authorized_keys line each: a key with a line break in it would never match and could smuggle a line."""
        keys = [key.strip() for key in value]
        for key in keys:
            if not key or "\n" in key or "\r" in key:
                raise ValueError(f"an SSH public key must be one non-empty line: {key!r}")
        return keys

    @model_validator(mode="after")
    def _distinct_macs(self) -> SeedConfig:
        macs = [interface.mac for interface in self.interfaces]
        duplicates = sorted({mac for mac in macs if macs.count(mac) > 1})
        if duplicates:
            raise ValueError(f"interfaces share a MAC address: {', '.join(duplicates)}")
        return self

    @model_validator(mode="after")
    def _extra_is_additive(self) -> SeedConfig:
        """Operator additions may not replace what the seed sets: the keys and the password policy are the contract."""
        if not self.user_data_extra:
            return self
        overlap = sorted(set(self.user_data_extra) & set(_USER_DATA_KEYS))
        if overlap:
            raise ValueError(f"user_data_extra may not set keys the seed sets itself: {', '.join(overlap)}")
        try:
            _dump(self.user_data_extra)
        except yaml.YAMLError as error:
            raise ValueError(f"user_data_extra is not plain YAML data: {error}") from error
        return self


def _dump(document: object) -> bytes:
    """Deterministic YAML: insertion order kept, no line folding (an SSH key stays on one line)."""
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=2**31 - 1).encode()


def meta_data(config: SeedConfig) -> dict[str, Any]:
    return {"instance-id": config.instance_id, "local-hostname": config.hostname}


def user_data(config: SeedConfig) -> dict[str, Any]:
    """Key-only logins, no root: the tenant's keys are the only way in."""
    document: dict[str, Any] = {
        "hostname": config.hostname,
        "ssh_authorized_keys": list(config.ssh_public_keys),
        "ssh_pwauth": False,
        "disable_root": True,
    }
    document.update(config.user_data_extra or {})
    return document


def network_config(config: SeedConfig) -> dict[str, Any]:
    """Network config version 2; routes rather than the deprecated `gateway4`."""
    ethernets = {f"nic{index}": _ethernet(interface) for index, interface in enumerate(config.interfaces)}
    return {"version": 2, "ethernets": ethernets}


def _ethernet(interface: GuestInterface) -> dict[str, Any]:
    entry: dict[str, Any] = {"match": {"macaddress": interface.mac}}
    if interface.address is None:
        entry["dhcp4"] = True
    else:
        addresses = [interface.address, *interface.extra_addresses]
        entry["addresses"] = [f"{address}/{interface.prefix}" for address in addresses]
    if interface.gateway is not None:
        entry["routes"] = [{"to": "default", "via": interface.gateway}]
    if interface.nameservers:
        entry["nameservers"] = {"addresses": list(interface.nameservers)}
    return entry


def seed_files(config: SeedConfig) -> dict[str, bytes]:
    """The NoCloud files by their names on the seed."""
    return {
        "meta-data": _dump(meta_data(config)),
        "user-data": b"#cloud-config\n" + _dump(user_data(config)),
        "network-config": _dump(network_config(config)),
    }


def build_seed_iso(config: SeedConfig) -> bytes:
    """The seed image: ISO 9660 with Joliet and Rock Ridge, labelled `cidata`, identical bytes for one config."""
    files = seed_files(config)
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=1, vol_ident=VOLUME_LABEL, joliet=3, rock_ridge="1.09")
    try:
        for name, iso_path in _FILES:
            content = files[name]
            iso.add_fp(io.BytesIO(content), len(content), iso_path, rr_name=name, joliet_path=f"/{name}")
        _pin_dates(iso)
        out = io.BytesIO()
        iso.write_fp(out)
    finally:
        iso.close()
    return _pin_modification_dates(out.getvalue())


def write_seed_iso(config: SeedConfig, path: Path) -> Path:
    """Write the seed atomically (temp file beside it, fsync, rename); an identical seed already there is left be.

    Mode 0644: the file holds public keys only, and QEMU must be able to read it where libvirt does not relabel.
    """
    image = build_seed_iso(config)
    if path.is_file() and path.read_bytes() == image:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as temp:
            temp.write(image)
            temp.flush()
            os.fchmod(temp.fileno(), 0o644)
            os.fsync(temp.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return path


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable, so a crash cannot leave the old seed (or none) behind a reported success."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _volume_descriptor_date() -> bytes:
    """ECMA-119 8.4.26.1: 16 ASCII digits and an offset from GMT in 15-minute units (0: UTC)."""
    return SEED_DATE.strftime("%Y%m%d%H%M%S").encode() + b"00" + b"\x00"


def _fixed_vd_date() -> dates.VolumeDescriptorDate:
    date = dates.VolumeDescriptorDate()
    date.parse(_volume_descriptor_date())
    return date


def _fixed_dr_date() -> dates.DirectoryRecordDate:
    """ECMA-119 9.1.5: seven numbers, the year counted from 1900, the GMT offset last."""
    d = SEED_DATE
    date = dates.DirectoryRecordDate()
    date.parse(struct.pack("=BBBBBBb", d.year - 1900, d.month, d.day, d.hour, d.minute, d.second, 0))
    return date


def _pin_dates(iso: pycdlib.PyCdlib) -> None:
    """Replace every date pycdlib took from the clock, except the one it only makes while writing (see module doc)."""
    for vd in _volume_descriptors(iso):
        vd.volume_creation_date = _fixed_vd_date()
        vd.volume_effective_date = _fixed_vd_date()
        for record in _directory_records(vd.root_dir_record):
            record.date = _fixed_dr_date()
            _pin_rock_ridge_times(record)


def _volume_descriptors(iso: pycdlib.PyCdlib) -> list[Any]:
    descriptors = [*iso.pvds, *iso.svds]
    if iso.joliet_vd is not None and iso.joliet_vd not in descriptors:
        descriptors.append(iso.joliet_vd)
    return descriptors


def _directory_records(root: Any) -> Iterator[Any]:
    """Every record under a root, the root and each directory's `.` and `..` included; each once."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        record = stack.pop()
        if id(record) in seen:
            continue
        seen.add(id(record))
        yield record
        stack.extend(record.children)


_RR_TIME_FIELDS = (
    "creation_time",
    "access_time",
    "modification_time",
    "attribute_change_time",
    "backup_time",
    "expiration_time",
    "effective_time",
)


def _pin_rock_ridge_times(record: Any) -> None:
    """Rock Ridge TF entries carry their own copies of the times, short (7-byte) or long (17-byte) form."""
    if record.rock_ridge is None:
        return
    for entries in (record.rock_ridge.dr_entries, record.rock_ridge.ce_entries):
        tf = None if entries is None else entries.tf_record
        if tf is None:
            continue
        for field in _RR_TIME_FIELDS:
            current = getattr(tf, field)
            if current is None:
                continue
            fixed = _fixed_vd_date() if isinstance(current, dates.VolumeDescriptorDate) else _fixed_dr_date()
            setattr(tf, field, fixed)


def _pin_modification_dates(image: bytes) -> bytes:
    """Overwrite the volume modification date pycdlib wrote from the clock, in each primary and supplementary VD."""
    patched = bytearray(image)
    fixed = _volume_descriptor_date()
    sector = _FIRST_VD_SECTOR
    while (sector + 1) * _SECTOR <= len(patched):
        start = sector * _SECTOR
        kind, magic = patched[start], bytes(patched[start + 1 : start + 6])
        if magic != b"CD001" or kind == _VD_TERMINATOR:
            break
        if kind in (_VD_PRIMARY, _VD_SUPPLEMENTARY):
            patched[start + _VD_MODIFICATION_DATE.start : start + _VD_MODIFICATION_DATE.stop] = fixed
        sector += 1
    return bytes(patched)
