"""The SSRF guard: a webhook may not point into the network Ferryman runs in (private,
link-local, loopback and other non-global addresses) unless FERRYMAN_WEBHOOK_ALLOW_HOSTS lists
its host. Checked on the URL when a subscription is written, and on every address the host
resolves to when a delivery is sent (a name may resolve anywhere, and change)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.errors import WebhookTargetRefused

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def allowed_hosts(setting: str) -> frozenset[str]:
    """FERRYMAN_WEBHOOK_ALLOW_HOSTS, a comma-separated list of host names or addresses."""
    return frozenset(host.strip().lower() for host in setting.split(",") if host.strip())


def refused_address(address: IPAddress) -> bool:
    """Not a public address: private, loopback, link-local, multicast, reserved, unspecified
    (and an IPv4 address mapped into IPv6 is judged as the IPv4 one)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not address.is_global or address.is_multicast


@dataclass(frozen=True)
class Target:
    url: str
    host: str  # lower case, without brackets
    port: int


def parse_target(url: str) -> Target:
    """The URL's host and port; WebhookTargetRefused unless it is an absolute http(s) URL
    without credentials."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookTargetRefused(f"url is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookTargetRefused("url must be an absolute http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise WebhookTargetRefused("url must not carry credentials")
    default = 443 if parts.scheme == "https" else 80
    return Target(url=url, host=parts.hostname.lower(), port=port or default)


def check_url(url: str, allow: Collection[str]) -> Target:
    """At create and patch: refuse a URL whose host is a non-public address literal or a
    local name (`localhost`, `*.localhost`), unless `allow` lists it. Names are resolved only
    when sending."""
    target = parse_target(url)
    if target.host in allow:
        return target
    if target.host == "localhost" or target.host.endswith(".localhost"):
        raise WebhookTargetRefused(f"url's host {target.host} is loopback")
    try:
        address = ipaddress.ip_address(target.host)
    except ValueError:
        return target
    if refused_address(address):
        raise WebhookTargetRefused(f"url's host {target.host} is not a public address")
    return target


async def resolve(target: Target, allow: Collection[str]) -> list[IPAddress]:
    """At send time: every address the host resolves to, WebhookTargetRefused when any is
    not public and the host is not allowed (OSError when the name does not resolve)."""
    check_url(target.url, allow)
    infos = await asyncio.get_running_loop().getaddrinfo(
        target.host, target.port, type=socket.SOCK_STREAM
    )
    addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
    if target.host not in allow:
        for address in addresses:
            if refused_address(address):
                raise WebhookTargetRefused(f"{target.host} resolves to {address}, not public")
    return addresses
