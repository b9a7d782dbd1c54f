"""A child started as another user (PostgreSQL's, when the stack runs as root) runs as that user and in that user's
groups, switched by setpriv in the program the child execs: Popen's own `user=` would fork() the child, and fork()
runs the handlers gRPC registered, which crashed such a child now and then (devstack/process.py)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from devstack.process import as_user, spawn

USER = "nobody"
IDS = ["sh", "-c", "id -u; id -g; id -G"]

# Only root can make a child another user; CI runs as root, so these run there. setpriv is util-linux's, on every
# Debian machine: its absence is a failure below, not a skip.
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="LOUD: not root, and only root can make a child another user: the spawn-user tests did NOT run",
)


def test_setpriv_is_there_to_switch_the_user() -> None:
    assert shutil.which("setpriv"), "setpriv (util-linux) is missing: devstack falls back to Popen's forking user="


def _expected() -> list[str]:
    entry = pwd.getpwnam(USER)
    groups = sorted(os.getgrouplist(USER, entry.pw_gid))
    return [str(entry.pw_uid), str(entry.pw_gid), " ".join(map(str, groups))]


def _sorted_groups(lines: list[str]) -> list[str]:
    uid, gid, groups = lines
    return [uid, gid, " ".join(sorted(groups.split(), key=int))]


def test_a_spawned_child_runs_as_its_user_in_that_users_groups(tmp_path: Path) -> None:
    log = tmp_path / "ids.log"
    process = spawn(IDS, log, user=USER)
    assert process.wait(timeout=10) == 0
    assert _sorted_groups(log.read_text().split("\n")[:3]) == _expected()


def test_a_command_run_as_a_user_leaves_popen_nothing_to_switch() -> None:
    command, popen_user = as_user(IDS, USER)
    assert popen_user is None  # Popen can start it with vfork: no fork handler runs
    done = subprocess.run(command, capture_output=True, text=True, check=True, user=popen_user)
    assert _sorted_groups(done.stdout.split("\n")[:3]) == _expected()
    assert as_user(IDS, None) == (IDS, None)
