"""An sshd of a test's own on 127.0.0.1, for `ray up` with the local provider.

Everything it uses (host key, client key, authorized_keys, config, the session's HOME) lives in
one private folder. sshd's StrictModes refuses keys under a group- or world-writable folder,
/tmp included, so that folder is made under ~/.cache/raymm-tests, and `private_dir` checks every
folder above it.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")


def private_dir(prefix: str) -> Path:
    """A fresh 0700 folder under ~/.cache/raymm-tests (or $XDG_CACHE_HOME/raymm-tests) that no
    other user can write into, nor into any folder above it (sshd checks the whole path of
    authorized_keys)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "raymm-tests"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    for p in [base, *base.parents]:
        mode = p.stat().st_mode
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise AssertionError(f"{p} is group/world-writable: sshd would refuse keys under "
                                 f"{base}; set XDG_CACHE_HOME to a private folder")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Sshd:
    """A running sshd: log in as `user` with `key` on 127.0.0.1:`port`; sessions get
    HOME=`home`."""

    proc: subprocess.Popen
    port: int
    user: str
    key: Path
    home: Path
    log: Path

    def ssh(self, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ssh", "-i", str(self.key), "-p", str(self.port), "-o", "BatchMode=yes",
             "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no",
             "-o", f"UserKnownHostsFile={os.devnull}", f"{self.user}@127.0.0.1", command],
            capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        """End the connections it serves (its children), then the listener itself."""
        if self.proc.poll() is not None:
            return
        for pid in children(self.proc.pid):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def start_sshd(root: Path, user: str) -> Sshd:
    """Generate keys and a config under `root` (private), start sshd on a free loopback port
    and wait until it accepts a login."""
    if not SSHD.exists():
        raise AssertionError(f"{SSHD} is missing: apt-get install openssh-server (.ci/run does)")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    home = root / "home"
    home.mkdir(mode=0o700)
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)],
                       check=True)
    auth = root / "authorized_keys"
    auth.write_text((root / "client_key.pub").read_text())
    auth.chmod(0o600)
    port = free_port()
    config = root / "sshd_config"
    config.write_text(f"""\
ListenAddress 127.0.0.1
Port {port}
HostKey {root / "host_key"}
PidFile {root / "sshd.pid"}
AuthorizedKeysFile {auth}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
AllowUsers {user}
SetEnv HOME={home}
""")
    log = root / "sshd.log"
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    sshd = Sshd(proc, port, user, root / "client_key", home, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"sshd exited with {proc.returncode}:\n{log.read_text()}")
        if "Server listening" in log.read_text():
            break
        time.sleep(0.2)
    login = sshd.ssh("echo $HOME")
    if login.returncode != 0 or login.stdout.strip() != str(home):
        sshd.stop()
        raise AssertionError(f"cannot log in to the test's sshd ({login.returncode}): "
                             f"{login.stdout}{login.stderr}\n{log.read_text()}")
    return sshd
