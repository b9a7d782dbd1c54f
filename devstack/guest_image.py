"""A small Debian guest image for the real-VM tests and `berth up --real-vms`, built from Debian's packages only.

    mmdebstrap (minbase + the packages below, the host's own apt sources) -> a root file system folder
    -> `mkfs.ext4 -d` into a raw disk -> `qemu-img convert -c` to a compressed qcow2
    -> the kernel and initrd beside it, for direct kernel boot

Why direct kernel boot: an image with a boot loader needs a partition table and loop devices to install GRUB, which a
sandbox may not have; the kernel and initrd next to the disk boot the same root file system under any firmware. Real
hosts use the distribution's cloud images, which boot from their own disk: the image catalogue takes either (see
docs/operating.md, "Images").

What the guest holds, and why each piece:

- cloud-init (reads the NoCloud seed: hostname, the tenant's SSH key, user-data), with `locales` so its locale
  module can set C.UTF-8 (without it cloud-init ends in `status: error`);
- openssh-server (the `ssh` readiness gate and the tenant's way in);
- qemu-guest-agent (the `cloud_init` gate runs `cloud-init status --long` through it);
- ifupdown and isc-dhcp-client (cloud-init renders its network config for ifupdown), the cloud kernel and
  initramfs-tools (its virtio_blk is a module, so the initrd is needed).

The build is cached under `/var/cache/berth/guest-images/<key>/` (root) or `~/.cache/berth/guest-images/<key>/`, the key a hash of everything that decides the bytes
(this module's recipe, the suite, the packages and the apt sources), so a machine builds it once. A build goes to a
temporary folder and is renamed into place, so a killed build never leaves a half image that looks finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

RECIPE_VERSION = "1"  # change when anything below changes the image's bytes in a way the key does not see
SUITE = "bookworm"
PACKAGES = (
    "systemd-sysv",
    "udev",
    "cloud-init",
    "locales",
    "openssh-server",
    "qemu-guest-agent",
    "isc-dhcp-client",
    "ifupdown",
    "netbase",
    "linux-image-cloud-amd64",
    "initramfs-tools",
)
TOOLS = ("mmdebstrap", "mkfs.ext4", "qemu-img")
DISK_SIZE = "2G"  # the root file system's size; the overlay each VM gets can be larger
KERNEL_CMDLINE = "root=/dev/vda rw console=ttyS0,115200n8 net.ifnames=0"

# Run inside the new root before it is packed: the image's own configuration. Each line says why.
_CUSTOMIZE = [
    # the root file system is the whole virtio disk, mounted read-write by the kernel command line
    "echo '/dev/vda / ext4 defaults 0 1' > \"$1/etc/fstab\"",
    # C.UTF-8 is built into glibc: cloud-init's locale module sets it without generating anything
    "printf 'locale: C.UTF-8\\ndatasource_list: [NoCloud, None]\\n' > \"$1/etc/cloud/cloud.cfg.d/90-berth.cfg\"",
    # a machine id per guest, made at first boot, never one shared by every VM of the image
    'truncate -s 0 "$1/etc/machine-id"',
    # not the build machine's name: cloud-init names each guest after its allocation
    'echo localhost > "$1/etc/hostname"',
    # host keys per guest: cloud-init makes them at first boot
    'rm -f "$1"/etc/ssh/ssh_host_*',
    # nothing to fetch at run time and nothing of the build's caches in the image
    'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
]
# Documentation and translations nobody reads in a test guest: about a fifth of the image.
_DPKG_EXCLUDES = [
    "path-exclude=/usr/share/doc/*",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
]


class GuestImage(BaseModel):
    """A built image: its disk (qcow2), the kernel and initrd to boot it with, and the command line."""

    key: str
    disk: Path
    kernel: Path
    initrd: Path
    cmdline: str
    size_bytes: int
    build_seconds: float

    def catalogue_entry(self) -> dict[str, str]:
        """As the agent's image catalogue takes it (agent/libvirt/driver.py, `CatalogueImage`)."""
        return {"disk": str(self.disk), "kernel": str(self.kernel), "initrd": str(self.initrd), "cmdline": self.cmdline}


class ImageBuildError(RuntimeError):
    """The image could not be built; the message names the tool or step and its last output."""


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def cache_root() -> Path:
    """`BERTH_GUEST_IMAGE_CACHE`, else `/var/cache/berth/guest-images` under root, else `~/.cache/berth/...`.

    Not root's home: QEMU runs as its own user (`libvirt-qemu`) and must reach the base image, and /root is 0700."""
    configured = os.environ.get("BERTH_GUEST_IMAGE_CACHE")
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/var/cache/berth/guest-images")
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "berth" / "guest-images"


def image_key() -> str:
    """A hash of every input that decides the image: the recipe, the suite, the packages and the apt sources."""
    digest = hashlib.sha256()
    for part in (RECIPE_VERSION, SUITE, *PACKAGES, DISK_SIZE, KERNEL_CMDLINE, *_CUSTOMIZE, *_DPKG_EXCLUDES):
        digest.update(part.encode() + b"\0")
    for source in _apt_sources():
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def ensure_image(cache: Path | None = None) -> GuestImage:
    """The cached image, built first if this machine has none for the current key."""
    folder = (cache or cache_root()) / image_key()
    manifest = folder / "image.json"
    if manifest.is_file():
        return GuestImage.model_validate_json(manifest.read_text())
    lacking = missing_tools()
    if lacking:
        raise ImageBuildError(f"cannot build the guest image: {', '.join(lacking)} not installed")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.") as work_dir:
        work = Path(work_dir)
        image = _build(work, folder)
        out = work / "out"
        (out / "image.json").write_text(image.model_dump_json(indent=2))
        try:
            out.rename(folder)
        except OSError:
            if not manifest.is_file():  # another build finished first: use it; otherwise the rename's error stands
                raise
    return GuestImage.model_validate_json(manifest.read_text())


def _build(work: Path, final: Path) -> GuestImage:
    started = time.monotonic()
    rootfs, out = work / "rootfs", work / "out"
    out.mkdir(mode=0o755)  # QEMU's user must reach the files in it, and the temporary folder above it is 0700
    out.chmod(0o755)
    sources = _apt_sources()
    command = [
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        "--format=directory",
        f"--include={','.join(PACKAGES)}",
        *(f"--dpkgopt={rule}" for rule in _DPKG_EXCLUDES),
        *(f"--customize-hook={step}" for step in _CUSTOMIZE),
        SUITE,
        str(rootfs),
        *(str(source) for source in sources),
    ]
    _run(command, "mmdebstrap")
    kernel, initrd = _boot_files(rootfs)
    shutil.copy2(kernel, out / "vmlinuz")
    shutil.copy2(initrd, out / "initrd.img")
    raw = work / "root.raw"
    _run(["mkfs.ext4", "-q", "-F", "-L", "berth-root", "-d", str(rootfs), str(raw), DISK_SIZE], "mkfs.ext4")
    _run(["qemu-img", "convert", "-c", "-f", "raw", "-O", "qcow2", str(raw), str(out / "disk.qcow2")], "qemu-img")
    for path in out.iterdir():
        path.chmod(0o644)  # QEMU runs as libvirt-qemu: it reads the base image, kernel and initrd
    size = sum(path.stat().st_size for path in out.iterdir())
    return GuestImage(
        key=final.name,
        disk=final / "disk.qcow2",
        kernel=final / "vmlinuz",
        initrd=final / "initrd.img",
        cmdline=KERNEL_CMDLINE,
        size_bytes=size,
        build_seconds=round(time.monotonic() - started, 1),
    )


def _boot_files(rootfs: Path) -> tuple[Path, Path]:
    kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
    initrds = sorted((rootfs / "boot").glob("initrd.img-*"))
    if not kernels or not initrds:
        raise ImageBuildError(f"the image has no kernel or initrd in /boot: {sorted(os.listdir(rootfs / 'boot'))}")
    return kernels[-1], initrds[-1]


def _apt_sources() -> list[Path]:
    """The host's own apt sources (deb822 `.sources` files and `sources.list`): the only place packages come from."""
    found = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    legacy = Path("/etc/apt/sources.list")
    if legacy.is_file() and any(line.strip().startswith("deb ") for line in legacy.read_text().splitlines()):
        found.append(legacy)
    return found


def _run(command: list[str], step: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise ImageBuildError(f"{step} failed (exit {result.returncode}):\n{tail}")


def main() -> None:
    """`python -m devstack.guest_image`: build (or find) the image and print where it is, as JSON."""
    image = ensure_image()
    print(json.dumps(image.model_dump(mode="json"), indent=2))


if __name__ == "__main__":
    main()
