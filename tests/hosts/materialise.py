"""Write every fixture host to disk, so a command (or a document) can be pointed at one as if it were a host.

    python -m tests.hosts.materialise DIR

writes DIR/<name>/ (the host's root: sys/, proc/, dev/, and recorded/ where nvidia-smi was recorded) and
DIR/<name>.node.json (the fleet-file node approved for it). An existing DIR/<name>/ is replaced.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from tests.hosts.sysfs_tree import all_fixture_hosts


def materialise(directory: Path) -> list[Path]:
    roots = []
    for host in all_fixture_hosts():
        root = directory / host.name
        if root.exists():
            shutil.rmtree(root)
        host.write(root)
        (directory / f"{host.name}.node.json").write_text(json.dumps(host.node, indent=2) + "\n")
        roots.append(root)
    return roots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    args.directory.mkdir(parents=True, exist_ok=True)
    for root in materialise(args.directory):
        print(root)


if __name__ == "__main__":
    main()
