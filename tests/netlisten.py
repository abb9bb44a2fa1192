"""Listening TCP sockets of a process tree, read from /proc (Linux; no psutil needed)."""

from __future__ import annotations

import os
from pathlib import Path


def descendants(root: int) -> set[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = {root}, [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _addr(hexaddr: str) -> str:
    """/proc/net/tcp{,6} address -> `1.2.3.4:port` or `[hex words]:port`."""
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        return ".".join(str(b) for b in raw[::-1]) + f":{int(port, 16)}"
    words = [raw[i:i + 4][::-1].hex() for i in range(0, 16, 4)]
    return "[" + ":".join(words) + f"]:{int(port, 16)}"


def listening(pids: set[int]) -> list[tuple[int, str]]:
    """(pid, address) of every TCP socket in LISTEN state owned by `pids`."""
    inodes: dict[str, str] = {}
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":  # LISTEN
                inodes[f[9]] = _addr(f[1])
    out = []
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    out.append((pid, inodes[link[8:-1]]))
        except OSError:
            continue
    return out


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or 127.x mapped into IPv6 (::ffff:127.x.y.z)."""
    host = address.rsplit(":", 1)[0]
    if not host.startswith("["):
        return host.startswith("127.")
    words = host.strip("[]").split(":")
    return words == ["00000000"] * 3 + ["00000001"] or (
        words[:3] == ["00000000", "00000000", "0000ffff"] and words[3].startswith("7f"))
