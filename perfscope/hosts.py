"""Which addresses a server of perfscope's binds: loopback by default, and a warning otherwise."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True when ``host`` only accepts local connections (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["is_loopback"]
