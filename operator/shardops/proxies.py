"""The HTTP(S) proxy of a URL, from the environment, for shardops' own urllib3 clients (the S3 wire
client, the LLM client): HTTPS_PROXY / HTTP_PROXY in either case, NO_PROXY honoured, read as urllib
(and boto3, requests, the Kubernetes client) read them. A cluster whose egress goes through a proxy
sets them once on the pods; a client that ignored them would time out on every call.

Imports nothing of shardops: it sits below every layer, next to `shardops.clock`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import urllib3


def proxy_for(
    url: str,
    proxies: Mapping[str, str] | None = None,
    bypass: Callable[[str], bool] | None = None,
) -> str | None:
    """The proxy URL requests to `url` go through, or None: none set for its scheme, or NO_PROXY
    names its host (a domain suffix, an address, `*`). `proxies` and `bypass` default to the
    environment's (`urllib.request.getproxies`, `proxy_bypass`)."""
    parts = urlsplit(url)
    found = getproxies() if proxies is None else proxies
    proxy = found.get(parts.scheme)
    if not proxy or not parts.hostname:
        return None
    skip = proxy_bypass if bypass is None else bypass
    # host:port, as urllib checks NO_PROXY entries with and without the port.
    where = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
    if skip(where):
        return None
    # A proxy given as host:port means http://host:port, as curl and urllib take it.
    return proxy if "://" in proxy else f"http://{proxy}"


def pool_for(url: str, **settings: Any) -> urllib3.PoolManager:
    """A urllib3 pool for requests to `url`: through its proxy (`proxy_for`; https tunnels with
    CONNECT, so TLS still ends at the server) or direct. `settings`: PoolManager's keywords."""
    proxy = proxy_for(url)
    if proxy is None:
        return urllib3.PoolManager(**settings)
    return urllib3.ProxyManager(proxy, **settings)
