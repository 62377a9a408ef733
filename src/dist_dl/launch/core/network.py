"""Which network interface holds an address: what Horovod, Gloo and NCCL are
told to use between workers, found the same way by every engine."""
from __future__ import annotations

import ipaddress
import socket

__all__ = ["interface_holding", "resolve", "is_loopback", "loopback_interface", "IFNAME_VARS"]

# The variables that name the interface to Gloo and NCCL (Horovod's launcher
# sets NCCL's per job; the torch launcher sets both): read when a collective
# starts.
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def resolve(host: str) -> str | None:
    """``host``'s IPv4 address (itself if it is one), or None where it does not resolve."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def interface_holding(address: str) -> str | None:
    """The name of this host's network interface that holds ``address``
    (an IP address), or None where none does."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    return None


def loopback_interface() -> str:
    """The name of the interface that holds 127.0.0.1."""
    name = interface_holding("127.0.0.1")
    if name is None:
        raise RuntimeError("no network interface has 127.0.0.1; local workers need loopback")
    return name
