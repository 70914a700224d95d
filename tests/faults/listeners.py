"""Which sockets a set of processes listens on, and whether all of them are loopback ones
(the fault tests of docs/reliability.md, "What listens where")."""

from __future__ import annotations

import ipaddress

import psutil


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)  # ::ffff:127.0.0.1 on a dual-stack socket
    return (mapped or addr).is_loopback


def _name(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def listeners_of(procs: list[psutil.Process]) -> dict[tuple[int, str], set[tuple[str, int]]]:
    out: dict[tuple[int, str], set[tuple[str, int]]] = {}
    for p in procs:
        try:
            socks = {
                (c.laddr.ip, c.laddr.port)
                for c in p.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            }
            name = _name(p).split(" ")[0].rsplit("/", 1)[-1] or p.name()
        except psutil.Error:
            continue
        if socks:
            out[(p.pid, name)] = socks
    return out


def off_loopback(listening: dict[tuple[int, str], set[tuple[str, int]]]) -> str:
    """'' when every socket is a loopback one, else which are not."""
    exposed = {
        f"{name} (pid {pid})": sorted(f"{ip}:{port}" for ip, port in socks if not is_loopback(ip))
        for (pid, name), socks in listening.items()
    }
    exposed = {k: v for k, v in exposed.items() if v}
    if not exposed:
        return ""
    total = sum(len(s) for s in listening.values())
    return f"{sum(map(len, exposed.values()))} of {total} sockets off loopback: {exposed}"
