"""Which source a transport address counts against, for per-source limits."""
from __future__ import annotations

import ipaddress
from typing import Hashable


def source_key(address: object) -> Hashable:
    """The source of ``address`` (a socket address tuple, or any other address object).

    IPv4: the IP address, whatever the port (a client picks ports freely). IPv6: the /64
    network, as ``"2001:db8:0:1::/64"`` (one subscriber usually gets a /64 and can pick any
    address in it); an IPv4-mapped address (``::ffff:192.0.2.1``, from a dual-stack socket)
    counts as its IPv4 address. Anything else is its own source.
    """
    host = address[0] if type(address) is tuple and len(address) > 0 else address
    if type(host) is not str or ":" not in host:
        return host
    try:
        ip = ipaddress.IPv6Address(host.partition("%")[0])      # "fe80::1%eth0": scope dropped
    except ValueError:
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return f"{ipaddress.IPv6Address(int(ip) >> 64 << 64)}/64"
