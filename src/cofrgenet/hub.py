"""The Hugging Face hub when it cannot be reached: the local cache at once, not after retries.

``datasets`` and ``huggingface_hub`` retry a hub they cannot reach five times, with
back-off: about 25 s of "Retrying in 8s [Retry 5/5]" lines before the error (or the
cached copy) on a machine without the network, such as a cluster's compute node.
:func:`offline_unless_reachable` opens one connection to the hub's host first; when that
fails, it sets ``HF_HUB_OFFLINE=1`` for this process, as a user would, so that the
libraries read their caches only and fail at once where nothing is cached. Their own
documented switch is an environment variable read when they are imported, so this acts
only before the first import of ``huggingface_hub``.
"""

from __future__ import annotations

import os
import socket
import sys
from urllib.parse import urlsplit

#: The hub's address: ``huggingface_hub``'s default, or the user's ``HF_ENDPOINT``.
DEFAULT_ENDPOINT = "https://huggingface.co"
#: Seconds to wait for the hub's host to accept a connection.
PROBE_TIMEOUT_S = 3.0
_PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
)
#: Why :func:`offline_unless_reachable` set ``HF_HUB_OFFLINE`` (unset: it did not; the
#: user may have). An environment variable, as the switch is, so that the processes this
#: one starts (DDP ranks, workers) inherit the reason with the switch.
REASON_VARIABLE = "COFR_HUB_UNREACHABLE"


def offline_reason() -> str:
    """Why the hub was not asked, for an error that a dataset could not be loaded:
    ``the hub did not answer: ...`` where this process went offline,
    ``HF_HUB_OFFLINE is set`` where the user set it, else ``""``."""
    reason = os.environ.get(REASON_VARIABLE)
    if reason and os.environ.get("HF_HUB_OFFLINE") == "1":
        return f"the hub did not answer: {reason}"
    return "HF_HUB_OFFLINE is set" if os.environ.get("HF_HUB_OFFLINE") else ""


def offline_unless_reachable(timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Set ``HF_HUB_OFFLINE=1`` when the hub's host does not accept a connection; return
    why (``"huggingface.co: [Errno -2] Name or service not known"``), else None.

    Does nothing (None) when ``HF_HUB_OFFLINE`` is already set, when a proxy is
    configured (a direct connection says nothing about the proxy's), or once
    ``huggingface_hub`` has been imported (it has read its settings). A one-line note
    on stderr says what happened.
    """
    if "HF_HUB_OFFLINE" in os.environ:  # the user's choice, either way
        return None
    if "huggingface_hub" in sys.modules or any(os.environ.get(v) for v in _PROXY_VARIABLES):
        return None
    endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    parts = urlsplit(endpoint)
    host = parts.hostname or endpoint
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        # One address, one timeout (create_connection would wait ``timeout`` per address).
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.settimeout(timeout)
            probe.connect(address)
    except OSError as error:
        reason = f"{host}: {error}"
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ[REASON_VARIABLE] = reason
        print(
            f"note: the Hugging Face hub does not answer ({reason}): reading the local "
            "cache only, as with HF_HUB_OFFLINE=1",
            file=sys.stderr,
        )
        return reason
    return None
