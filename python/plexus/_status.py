"""The server's view of the cluster (its GetStatus), as a dict, and what
it names: the live page's URL.

Below every other module that reads the status (the API, the console's
progress lines, `plexus top`, the CLI, the clusters): it imports only the
binding.
"""
import json
import os

from . import _core


def _int64_fields(obj):
    """protobuf's JSON writes int64 as strings; make them ints again."""
    if isinstance(obj, dict):
        return {k: _int64_fields(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_int64_fields(v) for v in obj]
    if isinstance(obj, str) and obj.lstrip("-").isdigit():
        return int(obj)
    return obj


def decode_status(text):
    """The status the binding returns (protobuf JSON) as a dict."""
    st = _int64_fields(json.loads(text))
    # Names stay names even when they look like numbers.
    for w in st.get("workers", []):
        w["host_name"] = str(w.get("host_name", ""))
    for c in st.get("clients", []):
        c["name"] = str(c.get("name", ""))
        c["tenant"] = str(c.get("tenant", ""))
    for s in st.get("slices", []):
        for d in s.get("devices", []):
            d["host_name"] = str(d.get("host_name", ""))
    for p in st.get("pending_slices", []):
        p["waiting_for"] = str(p.get("waiting_for", ""))
    for e in st.get("why", []):
        for k in ("program", "reason", "blame_host", "site", "root_reason",
                  "cause"):
            e[k] = str(e.get(k, ""))
    return st


def cluster_status(address, fresh=False):
    """The status of the server at `address`, as a dict. fresh=True first
    asks every live worker for its figures and waits for them and for each
    one's next heartbeat (~0.1 s)."""
    return decode_status(_core.cluster_status(address, fresh))


def web_url(st, secret=None, tenant=None, tenant_token=None):
    """The URL of the live page of the server whose status is `st`, with
    the token it needs in its fragment (which a browser never sends): the
    operator's when `secret` (hex) is given, else the tenant's ($PLEXUS_TENANT
    and $PLEXUS_TENANT_TOKEN by default). The page keeps the token for the
    tab and takes it off the address bar."""
    web = st.get("web_address")
    if not web:
        raise _core.PlexusError(
            f"the server at {st.get('address')} serves no live page (it "
            "was started with --web-listen off)")
    if secret:
        token = _core.operator_token(secret)
    else:
        tenant = tenant or os.environ.get("PLEXUS_TENANT")
        tenant_token = tenant_token or os.environ.get("PLEXUS_TENANT_TOKEN")
        if not (tenant and tenant_token):
            raise _core.PlexusError(
                "the live page needs a token: give --secret-file (the "
                "operator's), or set $PLEXUS_TENANT and $PLEXUS_TENANT_TOKEN "
                "(a tenant's)")
        token = f"{tenant}:{tenant_token}"
    return f"http://{web}/#token={token}"
