"""The webhooks' pure parts: the SSRF guard on URLs and addresses, the retry back-off, the
pinned URL, the body."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime
from uuid import uuid4

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.errors import WebhookTargetRefused
from app.webhooks.sender import payload, pinned_url, retry_delay
from app.webhooks.targets import allowed_hosts, check_url, refused_address

PRIVATE_NETWORKS = [
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "100.64.0.0/10",
    "0.0.0.0/8",
    "::1/128",
    "fc00::/7",
    "fe80::/10",
]


@given(st.sampled_from(PRIVATE_NETWORKS), st.integers(min_value=0))
def test_every_address_of_a_private_network_is_refused(network: str, offset: int) -> None:
    net = ipaddress.ip_network(network)
    address = net[offset % net.num_addresses]
    assert refused_address(address)
    if address.version == 4:
        assert refused_address(ipaddress.ip_address(f"::ffff:{address}"))


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert not refused_address(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["224.0.0.1", "ff02::1", "255.255.255.255", "240.0.0.1"])
def test_multicast_and_reserved_addresses_are_refused(address: str) -> None:
    assert refused_address(ipaddress.ip_address(address))


@pytest.mark.parametrize("host", ["8.8.8.8", "example.com", "[2606:4700::1111]"])
def test_public_urls_pass(host: str) -> None:
    assert check_url(f"https://{host}/hook", frozenset()).host == host.strip("[]").lower()


def test_the_allow_list_lifts_the_refusal() -> None:
    allow = allowed_hosts(" 127.0.0.1, Hooks.Internal ,")
    assert allow == {"127.0.0.1", "hooks.internal"}
    check_url("http://127.0.0.1:9000/x", allow)
    check_url("http://hooks.internal/x", allow)
    with pytest.raises(WebhookTargetRefused):
        check_url("http://127.0.0.2/x", allow)


@given(
    st.integers(min_value=1, max_value=10_000),
    st.floats(min_value=0.01, max_value=100),
    st.floats(min_value=0.01, max_value=100_000),
)
def test_retry_delay_doubles_up_to_its_cap(attempt: int, first: float, cap: float) -> None:
    delay = retry_delay(attempt, first, cap)
    assert 0 < delay <= cap
    assert delay <= retry_delay(attempt + 1, first, cap)
    assert retry_delay(1, first, cap) == min(first, cap)


def test_the_pinned_url_keeps_path_port_and_query() -> None:
    v4 = ipaddress.ip_address("93.184.216.34")
    v6 = ipaddress.ip_address("2606:2800::1")
    assert pinned_url("https://h.example:8443/a?b=1", v4) == "https://93.184.216.34:8443/a?b=1"
    assert pinned_url("http://h.example/a", v6) == "http://[2606:2800::1]/a"


def test_the_body_names_the_event_and_its_session() -> None:
    created = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    session_id = uuid4()
    delivery = {
        "type": "session_end",
        "created_at": created,
        "session_id": session_id,
        "event": {"seq": 4, "type": "session_end", "data": {}, "createdAt": created.isoformat()},
    }
    body = payload(delivery, None)
    assert body == (
        '{"type":"session_end","timestamp":"2026-12-03T10:00:00.000Z","data":{"sessionId":"'
        f'{session_id}","event":{{"seq":4,"type":"session_end","data":{{}},"createdAt":'
        '"2026-12-03T10:00:00.000Z"},"session":null}}'
    )
