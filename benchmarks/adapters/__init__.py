"""Echo adapters for the loss/latency benchmark: one interface over our protocol, ENet and KCP.

``create(name, on_echo)`` builds the adapter for a protocol id in ``PROTOCOLS``;
``unavailable(name)`` says why a protocol's library cannot be loaded (None if it can). See
``base.py`` for the adapter contract.
"""
from __future__ import annotations

from typing import Optional

from .base import DatagramLog, EchoAdapter, EchoCallback, Ticker

PROTOCOLS = ("ours-redundant", "ours-reliable", "enet", "kcp-fast", "kcp-normal")
LABELS = {
    "ours-redundant": "ours redundant",
    "ours-reliable": "ours reliable_ordered",
    "enet": "ENet reliable",
    "kcp-fast": "KCP fast (1,10,2,1)",
    "kcp-normal": "KCP normal (0,40,0,0)",
}
# What each protocol needs from PyPI (for the error message when it is missing).
REQUIREMENTS = {"enet": "pyenet", "kcp-fast": "kcp", "kcp-normal": "kcp"}

__all__ = ["DatagramLog", "EchoAdapter", "EchoCallback", "LABELS", "PROTOCOLS", "Ticker",
           "create", "unavailable"]


def unavailable(name: str) -> Optional[str]:
    """None if the protocol can run here, else the exact reason (the import error)."""
    if name not in PROTOCOLS:
        return f"unknown protocol {name!r} (known: {', '.join(PROTOCOLS)})"
    try:
        if name == "enet":
            from .enet_adapter import import_enet
            import_enet()
        elif name.startswith("kcp-"):
            from .kcp_adapter import import_kcp
            import_kcp()
        else:
            from .relay_adapter import RelayAdapter  # noqa: F401
    except Exception as exc:   # noqa: BLE001 - reported verbatim, never skipped silently
        need = REQUIREMENTS.get(name, "the relay package (pip install -e .)")
        return f"cannot import the library for {name} (PyPI package {need!r}): " \
               f"{type(exc).__name__}: {exc}"
    return None


def create(name: str, on_echo: EchoCallback, ack_delay: float = 0.005,
           ours_config: Optional[dict] = None) -> EchoAdapter:
    """A fresh adapter for protocol ``name``. ``ack_delay`` and ``ours_config`` (further
    EndpointConfig fields, e.g. ``redundancy_budget``) apply to ours only."""
    if name == "ours-redundant":
        from .relay_adapter import RelayAdapter
        return RelayAdapter(on_echo, mode="redundant", ack_delay=ack_delay, **(ours_config or {}))
    if name == "ours-reliable":
        from .relay_adapter import RelayAdapter
        return RelayAdapter(on_echo, mode="reliable_ordered", ack_delay=ack_delay,
                            **(ours_config or {}))
    if name == "enet":
        from .enet_adapter import EnetAdapter
        return EnetAdapter(on_echo)
    if name == "kcp-fast":
        from .kcp_adapter import KcpAdapter
        return KcpAdapter(on_echo, mode="fast")
    if name == "kcp-normal":
        from .kcp_adapter import KcpAdapter
        return KcpAdapter(on_echo, mode="normal")
    raise ValueError(f"unknown protocol {name!r} (known: {', '.join(PROTOCOLS)})")
