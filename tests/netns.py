"""Test hosts: network namespaces, each joined to the host by a veth pair on a /30 of its own
(the host side .1, the namespace side .2), the only non-loopback addresses a test uses. The
database address is on a veth pair of the host's own (both ends on the host), routed to from
every namespace through its link, so that a host can be cut off entirely (its end of the link
down) or from the database alone (the route gone; clients still reach the host).
Needs root and `ip` (iproute2); `hosts()` skips without them (fails under CI=true)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from tests.support import missing


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class Host:
    """One namespace: `address` is its own, `gateway` the host side of its link, `database`
    where the test's PostgreSQL listens (the same for every host)."""

    name: str
    link: str  # the namespace's end of the veth pair
    address: str
    gateway: str
    database: ipaddress.IPv4Interface  # the address, on the hosts' whole subnet

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        ip("netns", "exec", self.name, "ip", "link", "set", self.link, "down")

    def heal(self) -> None:
        ip("netns", "exec", self.name, "ip", "link", "set", self.link, "up")
        self.route("replace")

    def cut_database(self) -> None:
        self.route("del")

    def heal_database(self) -> None:
        self.route("replace")

    def route(self, verb: str) -> None:
        target = f"{self.database.ip}/32"
        ip("netns", "exec", self.name, "ip", "route", verb, target, "via", self.gateway)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.0.0.0/8 that no interface of this machine uses (other test runs may hold
    namespaces of their own at the same time)."""
    used = subprocess.run(
        ["ip", "-4", "-o", "addr"], check=True, capture_output=True, text=True
    ).stdout
    for second in range(200, 250):
        if f" 10.{second}." not in used:
            return ipaddress.IPv4Network(f"10.{second}.0.0/24")
    raise RuntimeError("no free 10.x.0.0/24 for the test hosts")


@contextlib.contextmanager
def hosts(count: int) -> Iterator[list[Host]]:
    """`count` namespaces, deleted (with their links) at the end, also on failure."""
    if os.geteuid() != 0:
        missing("network namespaces need root", "the partition tests")
    if shutil.which("ip") is None:
        missing("`ip` (iproute2) is not installed", "the partition tests")
    tag = uuid.uuid4().hex[:6]
    whole = _free_subnet()
    subnets = list(whole.subnets(new_prefix=30))
    database = ipaddress.IPv4Interface(f"{whole[-2]}/{whole.prefixlen}")
    database_link = f"fmd{tag}"
    made: list[Host] = []
    try:
        ip("link", "add", database_link, "type", "veth", "peer", "name", f"{database_link}p")
        ip("addr", "add", f"{database.ip}/32", "dev", database_link)
        ip("link", "set", database_link, "up")
        ip("link", "set", f"{database_link}p", "up")
        for i in range(count):
            net = subnets[i]
            gateway = f"{net[1]}/{net.prefixlen}"
            host = Host(f"fm-{tag}-{i}", f"fmn{tag}{i}", str(net[2]), str(net[1]), database)
            outer = f"fmh{tag}{i}"
            ip("netns", "add", host.name)
            made.append(host)
            ip("link", "add", outer, "type", "veth", "peer", "name", host.link)
            ip("link", "set", host.link, "netns", host.name)
            ip("addr", "add", gateway, "dev", outer)
            ip("link", "set", outer, "up")
            inside = ["netns", "exec", host.name, "ip"]
            ip(*inside, "addr", "add", f"{host.address}/{net.prefixlen}", "dev", host.link)
            ip(*inside, "link", "set", host.link, "up")
            ip(*inside, "link", "set", "lo", "up")
            host.route("replace")
        yield made
    finally:
        for host in made:
            # Deleting the namespace deletes its end of the veth, and so the pair.
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("netns", "del", host.name)
            with contextlib.suppress(subprocess.CalledProcessError):  # never moved inside
                ip("link", "del", host.link.replace("fmn", "fmh", 1))
        with contextlib.suppress(subprocess.CalledProcessError):
            ip("link", "del", database_link)
