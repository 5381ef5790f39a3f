"""This host on the network: a free port to listen on, and the address other nodes reach it by."""
from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now ("" for every interface: a rendezvous other nodes connect to)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def node_ip() -> str:
    """This node's address as Ray sees it; 127.0.0.1 outside a Ray cluster."""
    try:
        import ray
        return ray.util.get_node_ip_address()
    except Exception:
        return "127.0.0.1"
