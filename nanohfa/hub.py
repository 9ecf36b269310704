"""
The Hugging Face Hub, offline or not: one quick probe before datasets or transformers
start, so an offline machine gets its message in a second instead of after a minute of
retries.

When the Hub's host cannot be reached (or HF_HUB_OFFLINE is already set), the libraries'
offline mode is switched on for this process (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE): they
then read only their caches and local folders and fail at once for anything else. Call it
before importing datasets, transformers or huggingface_hub, which read these at import.
"""

import os
import socket
from urllib.parse import urlparse

OFFLINE_VARS = ('HF_HUB_OFFLINE', 'HF_DATASETS_OFFLINE', 'TRANSFORMERS_OFFLINE')


def _truthy(name):
    return os.environ.get(name, '').strip().upper() in ('1', 'ON', 'YES', 'TRUE')


def online(timeout=3.0):
    """True if the Hub can be used; otherwise offline mode is on for this process and False."""
    if any(_truthy(v) for v in OFFLINE_VARS):
        reachable = False
    else:
        proxy = next((os.environ[v] for v in ('HTTPS_PROXY', 'https_proxy', 'ALL_PROXY', 'all_proxy')
                      if os.environ.get(v)), None)
        url = urlparse(proxy if proxy and '://' in proxy else f'http://{proxy}' if proxy else
                       os.environ.get('HF_ENDPOINT', 'https://huggingface.co'))
        port = url.port or (80 if url.scheme == 'http' else 443)
        try:  # through the proxy when there is one: then the proxy is what must answer
            socket.create_connection((url.hostname or 'huggingface.co', port), timeout=timeout).close()
            reachable = True
        except OSError:
            reachable = False
    if not reachable:
        for v in OFFLINE_VARS:
            os.environ[v] = '1'
    return reachable


def first_line(e, limit=300):
    """The first line of an exception's message, with its type: the useful part of a library error."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:limit] if text else ''}".rstrip(': ')


def offline_now():
    return any(_truthy(v) for v in OFFLINE_VARS)
