"""The live page, /metrics and `plexus top` of a running cluster
(src/plexus/web/): a job hung on purpose shows on the page opened in
headless Chromium, Prometheus text that a Grafana dashboard can plot, and
a tenant that sees only its own clients."""
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import plexus
from conftest import PLEXUS_PYTHONPATH
from test_why import chain_across_two_hosts

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 30


def get(url, token=None):
    """(HTTP status, body) of a GET."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=WAIT_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def split(url):
    """(base URL, token) of a web_url."""
    base, token = url.split("#token=")
    return base, token


def chromium(*args):
    """Runs headless Chromium (Debian's, scripts/setup.sh) with `args`;
    returns its stdout. The page's script polls once a second: a virtual
    time budget of 5 s lets it draw a few times before the dump."""
    exe = shutil.which("chromium")
    assert exe, "chromium is not installed (scripts/setup.sh installs it)"
    # Not the sanitizer runtime the ASan stage preloads into this process.
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.endswith("SAN_OPTIONS")}
    out = subprocess.run(
        [exe, "--headless=new", "--no-sandbox", "--disable-gpu",
         "--disable-dev-shm-usage", "--hide-scrollbars",
         "--virtual-time-budget=5000", *args],
        capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def artifacts_dir(tmp_path):
    """Where the screenshot goes: $PLEXUS_TEST_ARTIFACTS (CI keeps it),
    else the test's temporary folder."""
    d = Path(os.environ.get("PLEXUS_TEST_ARTIFACTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_the_live_page_shows_hosts_slices_a_running_graph_and_why(tmp_path):
    with plexus.local(hosts=2) as cluster:
        c, z, slices = chain_across_two_hosts(cluster)
        # A graph of two calls on host1 behind the consumer: in flight.
        triple = slices[1].program("scale", z, factor=3.0, name="in_graph")
        with c.graph():
            g = triple(triple(z))
        cluster.wait_until(
            lambda st: any(e["program"] == "consumer"
                           for e in st.get("why", [])) and
            any(int(gs["client_id"]) == c.id and
                int(gs.get("calls_running", 0)) == 2
                for gs in st.get("graphs", [])),
            timeout=WAIT_S, what="a why entry and the graph in flight")
        url = cluster.web_url()
        dom = chromium("--dump-dom", url)
        # Live data arrived and was drawn more than once.
        updates = int(re.search(r'data-updates="(\d+)"', dom).group(1))
        assert updates >= 2, dom[:2000]
        assert "as operator" in dom
        # Hosts, the client's slices, its graph in flight, and why.
        assert 'data-host="host0"' in dom and 'data-host="host1"' in dom
        st = cluster.status()
        for s in st["slices"]:
            assert f'data-slice="{s["slice_id"]}"' in dom, dom
        client_row = re.search(r'data-client="%d">(.*?)</tr>' % c.id, dom)
        assert client_row, dom
        cells = re.findall(r"<td>(.*?)</td>", client_row.group(1))
        assert cells[1] == "stuck" and int(cells[6]) >= 1, cells  # in flight
        # The graph in flight: its id, client, calls running and done.
        graph_row = re.search(r'data-graph="%d/1">(.*?)</tr>' % c.id, dom)
        assert graph_row, dom
        cells = re.findall(r"<td>(.*?)</td>", graph_row.group(1))
        assert cells[:4] == ["1", f"{c.id} (stuck)", "2", "0"], cells
        del g
        why = re.findall(r'<li data-call="\d+">(.*?)</li>', dom)
        assert any("consumer" in w and "slow_step" in w and "host0" in w
                   for w in why), why
        # The token left the address bar and is not in the page.
        _, token = split(url)
        assert token not in dom
        shot = artifacts_dir(tmp_path) / "live-page.png"
        chromium("--window-size=1400,1800", f"--screenshot={shot}", url)
        assert shot.stat().st_size > 10_000
        print(f"screenshot of the live page: {shot}")


def test_a_page_without_a_token_asks_for_one_and_shows_nothing():
    with plexus.local(hosts=1) as cluster:
        base, _ = split(cluster.web_url())
        dom = chromium("--dump-dom", base)
        assert 'data-updates="0"' in dom
        assert "plexus token --admin" in dom
        assert 'data-host="' not in dom
        status, body = get(base + "api/status")
        assert status == 401 and "needs a token" in body, (status, body)
        status, body = get(base + "metrics", token="0" * 32)
        assert status == 403 and "plexus_" not in body, (status, body)


def metric_names(text):
    return set(re.findall(r"^# TYPE (\w+) ", text, re.M))


def test_metrics_and_the_grafana_dashboard():
    with plexus.local(hosts=2) as cluster:
        c = cluster.connect(name="metrics-client")
        s = c.slice(2)
        x = s.put(np.ones((2, 4), dtype=np.float32), sharding=("split", 0))
        y = s.program("scale", x, factor=3.0, name="triple")(x)
        plexus.wait(y, timeout=WAIT_S)
        base, token = split(cluster.web_url())
        st = cluster.wait_until(
            lambda st: sum(int(w.get("stats", {}).get("calls_executed", 0))
                           for w in st["workers"]) >= 2,
            timeout=WAIT_S, what="both workers' heartbeats after the call")
        status, text = get(base + "metrics", token)
        assert status == 200, text
        assert 'plexus_workers{state="alive"} 2' in text
        assert re.search(r"^plexus_calls_routed_total \d+", text, re.M), text
        executed = sum(float(v) for v in re.findall(
            r'^plexus_worker_calls_total\{[^}]*\} (\S+)', text, re.M))
        assert executed >= 2, text
        assert re.search(r'plexus_client_calls_admitted_total\{client="%d",'
                         r'client_name="metrics-client",tenant="default"\} '
                         r'[1-9]' % c.id, text), text
        assert 'plexus_device_memory_bytes{host="host0"' in text
        served = metric_names(text)
        # Every metric the dashboard plots is one /metrics serves.
        dashboard = json.loads((ROOT / "deploy/grafana/plexus.json").read_text())
        exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
        plotted = {m for e in exprs for m in re.findall(r"\bplexus_\w+", e)}
        assert plotted, exprs
        assert plotted <= served, sorted(plotted - served)
        # And it plots every family.
        assert served <= plotted, sorted(served - plotted)
        del st


def transfer_bytes(text):
    """{(host, path): bytes} of plexus_transfer_bytes_total in `text`."""
    return {(h, p): float(v) for h, p, v in re.findall(
        r'^plexus_transfer_bytes_total\{host="(\w+)",worker="\d+",'
        r'path="(\w+)"\} (\S+)$', text, re.M)}


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "tcp"])
def test_metrics_count_the_bytes_of_each_transfer_path_per_host(shm):
    """A value put on host0 and read by a call on host1 moves once, from
    host0, over shared memory (or TCP with shared memory off): /metrics
    counts its bytes on that path of host0 and nothing anywhere else."""
    with plexus.local(hosts=2, shared_memory=shm) as cluster:
        c = cluster.connect(name="mover", shared_memory=shm)
        a = c.slice(1, hosts=["host0"])
        b = c.slice(1, hosts=["host1"])
        x = np.arange(3 << 18, dtype=np.float32)  # 3 MiB
        y = b.program("scale", x, factor=2.0, name="reader")(a.put(x))
        np.testing.assert_array_equal(np.asarray(y), 2 * x)
        path = "shared_memory" if shm else "tcp"
        cluster.wait_until(
            lambda st: any(int(w["stats"].get("transfer_bytes", {})
                               .get(path, 0)) > 0 for w in st["workers"]),
            timeout=WAIT_S, what=f"a heartbeat with {path} bytes")
        base, token = split(cluster.web_url())
        status, text = get(base + "metrics", token)
        assert status == 200, text
        moved = transfer_bytes(text)
        paths = {"alias", "device_to_device", "ipc", "shared_memory", "tcp",
                 "nccl"}
        assert set(moved) == {(h, p) for h in ("host0", "host1")
                              for p in paths}, moved
        assert moved.pop(("host0", path)) == x.nbytes, text
        assert set(moved.values()) == {0.0}, moved
        # The page's history plots the same counters, summed over hosts.
        status, body = get(base + "api/status", token)
        assert status == 200, body
        assert set(json.loads(body)["history"]["transfer_bytes"]) == paths


def test_metrics_show_the_tasks_pending_on_each_device():
    """A device held by a long call, three calls queued behind it: four
    tasks pending there, on /metrics and on the page's host row."""
    with plexus.local(hosts=1) as cluster:
        c = cluster.connect(name="queue")
        s = c.slice(1)
        x = s.put(np.arange(4, dtype=np.float32))
        slow = s.program("device_sleep", x, micros=600_000_000,
                         name="slow_step")
        scale = s.program("scale", x, factor=2.0, name="behind")
        held = [slow(x)] + [scale(x) for _ in range(3)]
        c.flush()
        cluster.wait_until(
            lambda st: [int(n) for n in st["workers"][0]["stats"].get(
                "device_tasks_pending", [])] == [4],
            timeout=WAIT_S, what="four tasks pending on host0's device")
        base, token = split(cluster.web_url())
        status, text = get(base + "metrics", token)
        assert re.search(r'^plexus_device_tasks_pending\{host="host0",'
                         r'worker="\d+",device="0"\} 4$', text, re.M), text
        dom = chromium("--dump-dom", cluster.web_url())
        assert re.search(r'data-host="host0">.*?4 tasks pending', dom), dom
        del held


def test_a_tenant_sees_only_its_own_clients():
    tenants = {"tenants": {"red": {"weight": 1}, "blue": {"weight": 1}}}
    with plexus.local(hosts=1, tenants=tenants) as cluster:
        red = cluster.connect(name="red-job", tenant="red")
        blue = cluster.connect(name="blue-job", tenant="blue")
        held = (red.slice(1), blue.slice(1))  # released when dropped
        base, token = split(cluster.web_url(tenant="red"))
        assert token.startswith("red:")
        status, body = get(base + "api/status", token)
        assert status == 200, body
        seen = json.loads(body)
        assert seen["viewer"] == "tenant red"
        assert [c["name"] for c in seen["status"]["clients"]] == ["red-job"]
        assert {s["client_id"] for s in seen["status"]["slices"]} == \
            {str(red.id)}
        assert seen["status"]["workers"], "the hosts stay visible"
        status, text = get(base + "metrics", token)
        assert "red-job" in text and "blue-job" not in text
        # The operator sees both.
        _, operator = split(cluster.web_url())
        status, body = get(base + "api/status", operator)
        names = {c["name"] for c in json.loads(body)["status"]["clients"]}
        assert names == {"red-job", "blue-job"}
        del held


def run_cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "plexus", *args], capture_output=True,
        text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": PLEXUS_PYTHONPATH, **(env or {})})


def test_plexus_status_web_and_top():
    with plexus.local(hosts=2) as cluster:
        c, z, slices = chain_across_two_hosts(cluster)
        cluster.wait_until(
            lambda st: any(e["program"] == "consumer"
                           for e in st.get("why", [])),
            timeout=WAIT_S, what="a why entry for the consumer")
        secret = cluster._secret
        out = run_cli("status", "--web", "--no-browser", "--address",
                      cluster.address, env={"PLEXUS_CLUSTER_SECRET": secret})
        assert out.returncode == 0, out.stderr
        url = out.stdout.strip()
        assert url == cluster.web_url(), (url, cluster.web_url())
        admin = run_cli("token", "--admin",
                        env={"PLEXUS_CLUSTER_SECRET": secret})
        assert admin.returncode == 0, admin.stderr
        assert url.endswith("#token=" + admin.stdout.strip())
        base, token = split(url)
        assert get(base + "api/status", token)[0] == 200
        # Without a secret or a tenant's token: an error naming both.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("PLEXUS_TENANT")}
        env.pop("PLEXUS_CLUSTER_SECRET", None)
        out = subprocess.run(
            [sys.executable, "-m", "plexus", "status", "--web",
             "--no-browser", "--address", cluster.address],
            capture_output=True, text=True, timeout=120,
            env={**env, "PYTHONPATH": PLEXUS_PYTHONPATH,
                 "HOME": str(Path(os.environ.get("TMPDIR", "/tmp")))})
        assert out.returncode == 1
        assert "PLEXUS_TENANT_TOKEN" in out.stderr, out.stderr
        # top: one frame (not a terminal), with the hosts and the why.
        top = run_cli("top", "--address", cluster.address, "--interval",
                      "0.5")
        assert top.returncode == 0, top.stderr
        assert "host0" in top.stdout and "host1" in top.stdout, top.stdout
        assert "stuck" in top.stdout, top.stdout
        assert "'slow_step'" in top.stdout, top.stdout


def test_a_server_started_without_the_page_says_so():
    with plexus.local(hosts=1, web_listen="off") as cluster:
        assert cluster.status().get("web_address", "") == ""
        with pytest.raises(plexus.PlexusError, match="--web-listen off"):
            cluster.web_url()
