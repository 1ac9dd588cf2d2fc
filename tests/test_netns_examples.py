"""The examples on hosts that are really apart: the server and each worker in
a network namespace of its own (tests/netns.py: one kernel, but each has its
own address and loopback, joined by veth pairs on a bridge), the client (the
example, run as a user runs it with --address) in this namespace. What each
computes must be bit for bit what it computes on the embedded default
(`plexus.local()`, every process on loopback): every step's loss (reward,
for the RL loop) and the final parameters, written by the example's --save.
The embedded runs themselves repeat bit for bit (their reductions sum in a
fixed order), which is what makes an exact comparison meaningful.

And a link that goes down: a worker's veth set down inside the lab (no
RST, no FIN: its connections just go silent) is noticed by the server's
heartbeat deadline. With no spare, what depends on that worker fails within
the deadline (plus a bounded margin) with an error that names the lost
worker; with a spare, the server remaps the slice onto it and the futures
read what a failure-free run computes.
"""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import plexus
from plexus import _core
from conftest import PLEXUS_PYTHONPATH, ROOT
from netns import NetnsLab
from test_netns import bounded, fresh_status

EXAMPLES = ROOT / "examples"

# (script, its arguments, hosts, devices per host) -- the same arguments
# on both clusters; the embedded one is sized by the example itself.
CASES = {
    "data_parallel": ("mlp_data_parallel.py",
                      ["--steps", "100", "--hosts", "2",
                       "--devices-per-host", "2"], 2, 2),
    "pipeline": ("mlp_pipeline.py", ["--steps", "100", "--microbatches", "4"],
                 2, 1),
    "rl": ("rl_loop.py", ["--steps", "60", "--sync-every", "2"], 3, 1),
}


@pytest.fixture
def lab():
    lab = NetnsLab.create()
    yield lab
    lab.close()


def run_example(script, args, out, env_extra=None, timeout=120):
    """The example as a user runs it; returns its stdout and what it saved."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PLEXUS_") or k == "PLEXUS_BIN_DIR"}
    env["PYTHONPATH"] = os.pathsep.join(
        [PLEXUS_PYTHONPATH] + ([os.environ["PYTHONPATH"]]
                               if os.environ.get("PYTHONPATH") else []))
    env.update(env_extra or {})
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args, "--save", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{script} {' '.join(args)} exited with {proc.returncode}:\n"
        f"{proc.stdout}\n{proc.stderr[-4000:]}")
    with np.load(out) as saved:
        return proc.stdout, {k: saved[k] for k in saved.files}


def start_cluster(lab, tmp_path, hosts, devices, extra=(), spares=0):
    """A server in a namespace of its own and `hosts` workers of `devices`
    devices (then `spares` spare workers), each in a namespace of its own."""
    server_ns = lab.add_host()
    server = lab.start_server(tmp_path / "server.log", host=server_ns,
                              extra=extra)
    workers = []
    for i in range(hosts + spares):
        host = lab.add_host()
        lab.start_worker(server, host, tmp_path / f"{host.name}.log",
                         devices=devices,
                         extra=["--spare"] if i >= hosts else [])
        workers.append(host)
    return server_ns, server, workers


@pytest.mark.parametrize("case", sorted(CASES))
def test_example_on_hosts_in_namespaces_matches_the_embedded_default_bit_for_bit(
        lab, tmp_path, case):
    script, args, hosts, devices = CASES[case]
    _, embedded = run_example(script, args, tmp_path / "embedded.npz")
    server_ns, server, workers = start_cluster(lab, tmp_path, hosts, devices)
    assert server.address.startswith(server_ns.address + ":")
    token = _core.tenant_token("default", lab.secret)
    out, apart = run_example(
        script, args + ["--address", server.address], tmp_path / "apart.npz",
        env_extra={"PLEXUS_TENANT": "default", "PLEXUS_TENANT_TOKEN": token})

    assert sorted(apart) == sorted(embedded)
    for name in embedded:
        assert apart[name].dtype == embedded[name].dtype, name
        assert apart[name].shape == embedded[name].shape, name
        assert apart[name].tobytes() == embedded[name].tobytes(), (
            f"{case}: {name} differs from the embedded run; max abs "
            f"difference {np.max(np.abs(apart[name] - embedded[name]))}")

    # It ran where it was meant to: every worker on its own namespace's
    # address, each with a share of the work, and tensors went worker to
    # worker across namespaces.
    st = fresh_status(server.address)
    alive = {w["host_name"]: w for w in st["workers"] if w["alive"]}
    assert set(alive) == {h.name for h in workers}, st["workers"]
    for h in workers:
        assert alive[h.name]["data_address"].startswith(h.address + ":")
    assert sum(w["stats"].get("bytes_sent", 0) for w in alive.values()) > 0
    assert lab.stop() == []


def test_a_worker_whose_link_goes_down_fails_dependent_futures_within_the_deadline(
        lab, tmp_path):
    heartbeat_ms = 1000
    server_ns, server, (a, b) = start_cluster(
        lab, tmp_path, 2, 1, extra=["--heartbeat-timeout-ms", str(heartbeat_ms)])
    client = lab.connect(server.address, name="link-down")
    try:
        s = client.slice(2, placement="spread")
        assert {d["host"] for d in s.devices} == {a.name, b.name}
        x = s.put(np.ones(2, np.float32), plexus.P("devices"))
        sleep = s.program("device_sleep", x, micros=50_000)
        y = x
        for _ in range(200):  # ~10 s of queued device time on each host
            y = sleep(y)
        total = s.program("all_reduce", plexus.Spec((), "float32",
                                                    plexus.partial()))(
            s.program("reduce_sum", y)(y))
        # b's only link, to the bridge the server, a and the client are on.
        lab.set_link(b, up=False)
        t0 = time.monotonic()

        def fetch():
            with pytest.raises(plexus.PlexusError) as e:
                np.asarray(total)
            return e.value, time.monotonic() - t0
        error, elapsed = bounded(fetch, "a future that needs the cut-off "
                                 "worker", timeout=heartbeat_ms / 1000 + 15)
        message = str(error)
        # Heartbeat deadline plus a margin for the report to reach the
        # client; the queued work alone would take ~10 s.
        assert elapsed < heartbeat_ms / 1000 + 5, (elapsed, message)
        assert isinstance(error, plexus.UnavailableError), (type(error),
                                                            message)
        # "worker 2 missed heartbeats for 1s [host host2, pid 452]": the
        # cause, the deadline and the host.
        assert "missed heartbeats for 1s" in message, message
        assert f"[host {b.name}," in message, message
        print(f"the dependent future failed {elapsed:.2f} s after the link "
              f"went down (deadline {heartbeat_ms} ms): {message}")

        st = plexus.status(server.address)
        state = {w["host_name"]: w["alive"] for w in st["workers"]}
        assert state[b.name] is False and state[a.name] is True, state
        # The other host still serves.
        rest = client.slice(1, hosts=[a.name], timeout=0)
        z = rest.put(np.arange(3, dtype=np.float32))
        np.testing.assert_array_equal(
            bounded(lambda: np.asarray(rest.program("scale", z,
                                                    factor=2.0)(z)),
                    "a call on the host still up"), [0, 2, 4])
    finally:
        client.close()


def test_with_a_spare_a_worker_whose_link_goes_down_is_replaced_and_values_recovered(
        lab, tmp_path):
    heartbeat_ms = 1000
    server_ns, server, (a, b, spare) = start_cluster(
        lab, tmp_path, 2, 1, spares=1,
        extra=["--heartbeat-timeout-ms", str(heartbeat_ms)])
    client = lab.connect(server.address, name="link-down-spare")
    try:
        s = client.slice(2, placement="spread")
        assert {d["host"] for d in s.devices} == {a.name, b.name}  # not the spare
        # Replicated: every value has a copy on the host that stays up.
        x = s.put(np.arange(6, dtype=np.float32), plexus.replicated())
        nap = s.program("device_sleep", x, micros=50_000)
        add = s.program("add", x, x)
        chain = [x]
        for _ in range(40):  # ~2 s of device time on each device
            chain.append(add(nap(chain[-1]), x))
        client.flush()
        np.testing.assert_array_equal(
            bounded(lambda: np.asarray(chain[3]), "an early value"),
            4 * np.arange(6))
        lab.set_link(b, up=False)
        t0 = time.monotonic()
        # What a failure-free run computes, the last value and one from
        # before the loss.
        np.testing.assert_array_equal(
            bounded(lambda: np.asarray(chain[-1]), "the chain's last value "
                    "after the remap", timeout=60), 41 * np.arange(6))
        elapsed = time.monotonic() - t0
        np.testing.assert_array_equal(np.asarray(chain[20]),
                                      21 * np.arange(6))
        assert s.generation == 1
        hosts = [d["host"] for d in s.devices]
        assert spare.name in hosts and b.name not in hosts, hosts
        st = plexus.status(server.address)
        state = {w["host_name"]: w["alive"] for w in st["workers"]}
        assert state[b.name] is False, state
        print(f"the chain's last value read {elapsed:.2f} s after the link "
              f"went down, on {hosts} (deadline {heartbeat_ms} ms)")
    finally:
        client.close()
