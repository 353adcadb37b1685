"""Which Host headers ``jobman serve`` answers, so that a page elsewhere cannot reach the dashboard
through a name it controls (DNS rebinding): the name in the Host header must be one no one else
can point at this server. That is an IP literal (a loopback one, or the address served; any, when
serving every address), ``localhost``, or, when serving the network, this machine's own names.
"""

from __future__ import annotations

import ipaddress
import socket
from functools import lru_cache


def host_name(header: str) -> str:
    """The name or address in a Host header, without its port; IPv6 keeps its brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name[1:-1] if name.startswith("[") else name)
    except ValueError:
        return None


@lru_cache(maxsize=1)
def _own_names() -> frozenset[str]:
    names = {socket.gethostname().lower()}
    try:
        names.add(socket.getfqdn().lower())
    except OSError:  # no resolver: the short name alone
        pass
    return frozenset(n for n in names if n)


def host_allowed(header: str, served: str) -> bool:
    """Whether a request naming ``header`` as its Host may be answered by a server bound to ``served``."""
    name = host_name(header)
    if name == "localhost":
        return True
    address, bound = _address(name), _address(served.strip().lower())
    if address is not None:
        if address.is_loopback or address == bound:
            return True
        return bound is not None and bound.is_unspecified  # serving every address: any of them, by number
    if bound is not None and (bound.is_loopback):
        return False  # a loopback server is reached by number or as localhost only
    return name in _own_names()
