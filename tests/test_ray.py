"""plexus.ray on a local Ray: Ray reserves the resources (a placement group
of one bundle per host), Plexus starts its server and a worker per bundle
as processes of Ray actors, and the data-parallel example trains through
the client it returns.

Ray (scripts/setup.sh installs it) is kept small on this machine: 2 CPUs,
no dashboard, a small object store, shut down at the end of the module;
every wait is bounded. With CI=true a missing Ray fails the module
(tests/conftest.py), it does not skip.
"""
import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

import plexus  # noqa: E402
from conftest import PLEXUS_PYTHONPATH  # noqa: E402
import plexus.ray  # noqa: E402
from deploy_job import run  # noqa: E402
from mlp_data_parallel import LOSS_THRESHOLD  # noqa: E402 (deploy_job's path)
from test_netns import bounded  # noqa: E402
from tls_cert import self_signed  # noqa: E402

# Under the ASan stage the test process preloads the sanitizer runtime; Ray's
# own daemons must not (they are not built with it), the host actors must
# (they load the instrumented extension): the variables go to the actors
# only, through their runtime_env.
SANITIZER_VARS = ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS",
                  "LSAN_OPTIONS")


@pytest.fixture(scope="module")
def local_ray():
    sanitizer = {k: os.environ.pop(k) for k in SANITIZER_VARS
                 if k in os.environ}
    try:
        # address="local": a Ray of its own, never one already running here.
        ray.init(address="local", num_cpus=2, include_dashboard=False,
                 log_to_driver=False,
                 configure_logging=False,
                 object_store_memory=96 * 1024 * 1024)
    finally:
        os.environ.update(sanitizer)
    # The host actors import the plexus this test runs (conftest may have
    # put it on sys.path only).
    env = dict(sanitizer, PYTHONPATH=os.pathsep.join(
        [PLEXUS_PYTHONPATH] + ([os.environ["PYTHONPATH"]]
                               if os.environ.get("PYTHONPATH") else [])))
    yield {"runtime_env": {"env_vars": env}}
    ray.shutdown()


def parent_title(pid):
    ppid = int(next(ln.split()[1] for ln in
                    Path(f"/proc/{pid}/status").read_text().splitlines()
                    if ln.startswith("PPid:")))
    return Path(f"/proc/{ppid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.jax_heavy
def test_plexus_ray_runs_the_data_parallel_example(local_ray, tmp_path,
                                                    monkeypatch):
    # The control plane on TLS: a certificate naming the node's address.
    cert, key = self_signed(tmp_path,
                            f"IP:{ray.util.get_node_ip_address()}",
                            common_name="plexus-ray")
    monkeypatch.delenv("PLEXUS_TLS_CA", raising=False)
    with plexus.ray.start(hosts=2, devices_per_host=1, cpus_per_host=1,
                          strategy="PACK", timeout=60, log_dir=str(tmp_path),
                          actor_options=local_ray, tls_cert=str(cert),
                          tls_key=str(key)) as cluster:
        assert "(TLS;" in (tmp_path / "plexus-server.log").read_text()
        # Ray reserved the resources: one bundle of one CPU per host.
        table = ray.util.placement_group_table(cluster.placement_group)
        assert table["state"] == "CREATED", table
        assert list(table["bundles"].values()) == [{"CPU": 1.0}] * 2, table

        st = cluster.status()
        workers = {w["host_name"]: w for w in st["workers"] if w["alive"]}
        assert sorted(workers) == ["ray-0", "ray-1"]
        for w in workers.values():
            # Each worker is a process of its host actor.
            assert "ray::_Host" in parent_title(int(w["pid"])), w
        final_loss, err = bounded(
            lambda: run(cluster.client, hosts=2, devices_per_host=1,
                        steps=100), "the data-parallel example", timeout=120)
        pg = cluster.placement_group
        pids = [int(w["pid"]) for w in workers.values()]
        secret = cluster._secret
    assert err <= 1e-5
    assert final_loss < LOSS_THRESHOLD
    # down(): processes gone, the reservation returned to Ray.
    assert all(not Path(f"/proc/{p}").exists() or
               "State:\tZ" in Path(f"/proc/{p}/status").read_text()
               for p in pids)
    assert ray.util.placement_group_table(pg)["state"] == "REMOVED"
    # The secret is in no log of the server or the workers.
    for log in tmp_path.glob("plexus-*.log"):
        assert secret not in log.read_text(errors="replace").lower(), log
    # The CA stayed this cluster's: nothing in this process's environment
    # points later clusters at it (their workers would speak TLS to a
    # plain-text server and never register).
    assert "PLEXUS_TLS_CA" not in os.environ


def test_a_reservation_ray_cannot_place_fails_within_the_timeout(local_ray):
    # Two bundles on one node with STRICT_SPREAD: never placed here.
    with pytest.raises(TimeoutError) as e:
        plexus.ray.start(hosts=2, strategy="STRICT_SPREAD", timeout=3,
                         actor_options=local_ray)
    assert "did not place 2 bundle(s)" in str(e.value)
    # Nothing is left reserved.
    tables = ray.util.placement_group_table().values()
    assert tables and all(t["state"] == "REMOVED" for t in tables), tables
