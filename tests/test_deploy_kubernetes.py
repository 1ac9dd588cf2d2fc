"""deploy/kubernetes/: the manifests validate against the Kubernetes schema,
and the commands and environment they give each container, run as written
in network namespaces of their own (one per pod, as on a node), make a
cluster that runs a job.

What stands in for Kubernetes here (tests/kube.py does each, nothing else):
- a pod is a network namespace with its own address (tests/netns.py);
- a container's environment is what its `env` and `envFrom` say (ConfigMap
  and Secret values, the downward API's pod name, namespace and address),
  on top of the image's own (PATH, PLEXUS_PJRT_PLUGIN: the source tree's
  here); $(VAR) in command and args is expanded as Kubernetes does;
- a Service name (plexus-server, plexus-server.<ns>.svc.cluster.local)
  followed by a port, in an argument or an environment value, resolves to
  the address of the one pod it selects;
- a ConfigMap or Secret volume is a folder with one file per key;
- the image's `plexus-server` and `plexus-worker` are the build's
  ($PLEXUS_BIN_DIR), its `python3` this test's interpreter with the tree's
  package on PYTHONPATH. The image itself (deploy/docker/Dockerfile) is not
  built: these machines have no container engine.
No command is changed: a flag the binary of this tree does not have fails
the test, naming the container.
"""
import copy
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

import plexus
from conftest import ROOT
from deploy_job import run
from mlp_data_parallel import LOSS_THRESHOLD  # deploy_job's path
from kube import Manifests, PodRunner
from netns import NetnsLab
from test_netns import bounded, readme_example
from tls_cert import self_signed

DEPLOY = ROOT / "deploy" / "kubernetes"
FILES = sorted(DEPLOY.glob("*.yaml"))
KUBERNETES_VERSION = "1.37.0"  # kubernetes-validate 1.37.0's newest schema


def validate(paths):
    """kubernetes-validate --strict over `paths`: (exit code, output)."""
    exe = shutil.which("kubernetes-validate")
    cmd = ([exe] if exe else [sys.executable, "-m", "kubernetes_validate"])
    cmd += ["--strict", "-k", KUBERNETES_VERSION] + [str(p) for p in paths]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def test_the_manifests_validate_against_the_kubernetes_schema(tmp_path):
    pytest.importorskip("kubernetes_validate")  # scripts/setup.sh installs it
    assert FILES, f"no manifests in {DEPLOY}"
    code, out = validate(FILES)
    assert code == 0, out
    kinds = {(d["kind"], d["metadata"]["name"])
             for d in Manifests.load(FILES).docs}
    for kind in kinds:
        assert f"{kind[0].lower()}/{kind[1]} " in out.lower() + " ", out
    # --strict rejects what Kubernetes would: a misspelt field fails.
    broken = tmp_path / "broken.yaml"
    docs = copy.deepcopy(Manifests.load(FILES).docs)
    for d in docs:
        if d["kind"] == "StatefulSet":
            c = d["spec"]["template"]["spec"]["containers"][0]
            c["comand"] = c.pop("command")
    broken.write_text(yaml.safe_dump_all(docs))
    code, out = validate([broken])
    assert code != 0 and "comand" in out, out


SERVERS = ("plexus-server-a", "plexus-server-b")


def test_the_manifests_say_what_docs_deploy_promises():
    m = Manifests.load(FILES)
    servers = [m.one("StatefulSet", name) for name in SERVERS]
    workers = m.one("StatefulSet", "plexus-worker")
    # A pair of servers, each one pod with a Service of its own; the
    # Service plexus-server (the web page) selects both.
    for server in servers:
        assert server["spec"]["replicas"] == 1
        assert m.one("Service", server["metadata"]["name"])["spec"][
            "selector"] == server["spec"]["template"]["metadata"]["labels"]
    web = m.one("Service", "plexus-server")["spec"]["selector"]
    for server in servers:
        labels = server["spec"]["template"]["metadata"]["labels"]
        assert web.items() <= labels.items()
    # The two are the same but for whom they follow, the name they
    # advertise and the first's --serve-if-alone-ms.
    (a, b) = [copy.deepcopy(s["spec"]["template"]) for s in servers]
    args = {}
    for name, t in zip(SERVERS, (a, b)):
        (c,) = t["spec"]["containers"]
        args[name] = c.pop("args")
        t["metadata"]["labels"].pop("plexus.dev/server")
    assert a == b
    other = {"plexus-server-a": "plexus-server-b",
             "plexus-server-b": "plexus-server-a"}
    for name in SERVERS:
        assert f"--standby-of={other[name]}:7070" in args[name]
        assert any(x.startswith(f"--advertise-address={name}.")
                   for x in args[name])
    assert [x for x in args["plexus-server-a"]
            if x.startswith("--serve-if-alone-ms")] and not [
        x for x in args["plexus-server-b"] if "serve-if-alone" in x]
    config = m.config_map("plexus-config")
    # Serving alone waits past the other's lease and a takeover.
    assert int(config["PLEXUS_SERVE_IF_ALONE_MS"]) >= \
        2 * int(config["PLEXUS_STANDBY_LEASE_MS"]) + 1000
    # The journal is a volume of each server's own.
    for server in servers:
        (c,) = server["spec"]["template"]["spec"]["containers"]
        (journal,) = [x for x in c["args"] if x.startswith("--journal=")]
        (claim,) = server["spec"]["volumeClaimTemplates"]
        (mount,) = [v for v in c["volumeMounts"]
                    if v["name"] == claim["metadata"]["name"]]
        assert journal.partition("=")[2].startswith(mount["mountPath"] + "/")
    # Workers and clients are given the pair.
    assert config["PLEXUS_SERVERS"] == ",".join(f"{n}:7070" for n in SERVERS)
    # One worker per node.
    terms = workers["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["topologyKey"] for t in terms] == ["kubernetes.io/hostname"]
    for pod in servers + [workers]:
        spec = pod["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        # The image the Dockerfile builds, named in the pod.
        dockerfile = pod["spec"]["template"]["metadata"]["annotations"][
            "plexus.dev/dockerfile"]
        assert (ROOT / dockerfile).is_file()
        assert f"-t {c['image']} " in (ROOT / dockerfile).read_text()
        # The cluster secret comes from the Secret, in the environment.
        (secret,) = [e for e in c["env"] if e["name"] == "PLEXUS_CLUSTER_SECRET"]
        ref = secret["valueFrom"]["secretKeyRef"]
        assert m.one("Secret", ref["name"])["stringData"].get(ref["key"])
        assert not any("secret" in a.lower() for a in c["args"])
        # Fixed ports, by flags, the ones the pod declares.
        for port in c["ports"]:
            assert any(a.endswith(f":{port['containerPort']}")
                       for a in c["args"]), (c["args"], port)
        assert "configMapRef" in c["envFrom"][0]


def server_spec(m):
    return m.one("StatefulSet", SERVERS[0])["spec"]["template"]["spec"]


@pytest.fixture
def lab():
    lab = NetnsLab.create()
    yield lab
    lab.close()


@pytest.fixture
def manifests():
    return Manifests.load(FILES)


@pytest.fixture
def runner(manifests, lab, tmp_path):
    runner = PodRunner(manifests, lab, tmp_path, namespace="plexus")
    yield runner
    runner.kill()


def make_secrets(m, lab, tmp_path, monkeypatch):
    """What the operator's `kubectl create secret` would hold: a fresh
    cluster secret, the smoke tenant's token (`plexus token --tenant
    smoke`), and the server's TLS certificate, made once the server pod's
    address is known (the test dials it by address, a cluster by the
    Service's names; the certificate names both). Returns the `prepare`
    for the server's pods. This test's own clients trust the certificate
    too ($PLEXUS_TLS_CA)."""
    m.set_secret("plexus-cluster-secret", "cluster-secret", lab.secret)
    m.set_secret("plexus-tenant-smoke", "token",
                 plexus._core.tenant_token("smoke", lab.secret))

    def prepare(pods):
        names = [f"{server}{domain}" for server in SERVERS
                 for domain in ("", ".plexus", ".plexus.svc",
                                ".plexus.svc.cluster.local")]
        san = ",".join([f"DNS:{n}" for n in names]
                       + [f"IP:{pod.ip}" for pod in pods])
        cert, key = self_signed(tmp_path, san, common_name="plexus-server")
        for k, f in (("tls.crt", cert), ("tls.key", key), ("ca.crt", cert)):
            m.set_secret("plexus-tls", k, f.read_text())
        monkeypatch.setenv("PLEXUS_TLS_CA", str(cert))
    return prepare


def start_cluster(m, lab, runner, tmp_path, monkeypatch):
    """The server pair's pods, then the workers': (servers, worker pods),
    once the first server serves (no other to follow: it serves alone
    after --serve-if-alone-ms), the second follows it, and every worker
    has registered."""
    prepare = make_secrets(m, lab, tmp_path, monkeypatch)
    servers = runner.create("StatefulSet", SERVERS[0]) + \
        runner.create("StatefulSet", SERVERS[1])
    prepare(servers)
    runner.run(servers)
    servers[0].wait_for_log("listening on", timeout=60)
    servers[1].wait_for_log("following the primary", timeout=30)
    workers = runner.start("StatefulSet", "plexus-worker")
    for w in workers:
        w.wait_for_log("registered as worker", timeout=30)
    return servers, workers


def server_list(servers):
    """The pair's Services, as a pod resolves them: PLEXUS_SERVERS."""
    return ",".join(f"{s.ip}:7070" for s in servers)


def test_the_manifests_commands_run_a_cluster_in_network_namespaces(
        manifests, lab, runner, tmp_path, monkeypatch):
    m = manifests
    servers, workers = start_cluster(m, lab, runner, tmp_path, monkeypatch)
    server = servers[0]
    address = server_list(servers)
    # This test's own client holds the cluster secret, as the operator does.
    monkeypatch.setenv("PLEXUS_CLUSTER_SECRET", lab.secret)
    st = plexus.status(address)
    got = {w["host_name"]: w for w in st["workers"] if w["alive"]}
    want_names = [f"plexus-worker-{i}" for i in range(len(workers))]
    assert sorted(got) == want_names
    devices = int(m.one("ConfigMap", "plexus-config")["data"][
        "PLEXUS_DEVICES_PER_HOST"])
    for pod in workers:
        w = got[pod.name]
        # Advertised: the pod's address, on the fixed port.
        assert w["data_address"] == f"{pod.ip}:7071", w
        assert len(w["devices"]) == devices

    # smoke-job.yaml: a client pod of its own, with its tenant's token.
    (job,) = runner.start("Job", "plexus-smoke")
    assert runner.wait(job, timeout=120) == 0, runner.logs()
    assert any(f"plexus-smoke: 56.0 over {len(workers)} hosts (ok)" in ln
               for ln in job.containers[0].lines), runner.logs()
    # Its session was the Secret's tenant's.
    server.wait_for_log("connected: plexus-smoke (tenant smoke)", timeout=5)

    client = plexus.connect(address, name="k8s-job")
    try:
        y, sharding, z, triple = bounded(lambda: readme_example(client),
                                         "a job on the Kubernetes cluster")
        # And the data-parallel example over both pods' devices.
        final_loss, err = bounded(
            lambda: run(client, hosts=len(workers), devices_per_host=devices,
                        steps=100), "the data-parallel example", timeout=120)
    finally:
        client.close()
    assert err <= 1e-5 and final_loss < LOSS_THRESHOLD, (final_loss, err)
    assert y == 56.0
    rng = np.random.default_rng(7)
    big = rng.standard_normal((512, 1024)).astype(np.float32)
    np.testing.assert_array_equal(z, big)
    np.testing.assert_array_equal(triple, big * 3)

    # `kubectl delete -f plexus.yaml`: every container gets SIGTERM and
    # exits with code 0 within the pods' grace period.
    grace = server_spec(m)["terminationGracePeriodSeconds"]
    assert runner.delete_all(grace_s=grace) == {
        p.name: 0 for p in servers + workers + [job]}, runner.logs()
    # No container logged a credential.
    token = plexus._core.tenant_token("smoke", lab.secret)
    for pod in runner.pods:
        text = "".join(pod.containers[0].lines).lower()
        assert lab.secret not in text and token not in text, pod.name


def test_the_placeholder_secret_is_refused(runner):
    # cluster-secret.yaml applied as it is: neither server starts, and each
    # says why, without showing the value.
    servers = runner.create("StatefulSet", SERVERS[0]) + \
        runner.create("StatefulSet", SERVERS[1])
    runner.run(servers)
    for server in servers:
        line = server.wait_for_log("cannot start", timeout=30)
        assert server.containers[0].popen.wait(timeout=15) == 1
        assert "PLEXUS_CLUSTER_SECRET" in line or "hex" in line, line
        assert "REPLACE-ME" not in "".join(server.containers[0].lines)


def test_training_goes_on_when_either_server_container_dies(
        manifests, lab, runner, tmp_path, monkeypatch):
    """The serving server's container is SIGKILLed (a crash, an OOM kill)
    and the kubelet starts it again at once in the same pod, on the same
    journal volume: the other server takes over at its lease's end, and
    the restarted one finds it serving and follows it. Later the other's
    container dies the same way and the first takes over again. A
    data-parallel training loop (examples/elastic_training.py) given the
    pair's Services goes on through both, its losses equal to those of the
    same run with no kill, bit for bit; no worker pod restarts, and every
    pod stops with code 0 at `kubectl delete`. The lease and the first
    server's wait are shortened (the operator's ConfigMap) to keep the test
    short; their ratio is the manifests'."""
    config = manifests.config_map("plexus-config")
    lease, alone = (int(config["PLEXUS_STANDBY_LEASE_MS"]),
                    int(config["PLEXUS_SERVE_IF_ALONE_MS"]))
    manifests.set_config("plexus-config", "PLEXUS_STANDBY_LEASE_MS", "1000")
    manifests.set_config("plexus-config", "PLEXUS_SERVE_IF_ALONE_MS",
                         str(1000 * alone // lease))
    manifests.one("StatefulSet", "plexus-worker")["spec"]["replicas"] = 3
    servers, workers = start_cluster(manifests, lab, runner, tmp_path,
                                     monkeypatch)
    monkeypatch.setenv("PLEXUS_CLUSTER_SECRET", lab.secret)  # the operator's
    sys.path.insert(0, str(ROOT / "examples"))
    from elastic_training import train

    client = plexus.connect(server_list(servers), name="k8s-trainer")
    try:
        baseline = bounded(lambda: train(client, 8, snapshot_every=0),
                           "training with no kill", timeout=120)
        serving = {"index": 0}

        def on_step(step):
            if step not in (3, 6):
                return
            dead = servers[serving["index"]]
            other = servers[1 - serving["index"]]
            runner.restart(dead)  # SIGKILL, then the same container again
            # Each in its current container: the other's first takeover,
            # and the restarted one's first words are that it follows the
            # server that took over, rather than serve its own journal.
            other.wait_for_log("taking over", timeout=60)
            dead.wait_for_log("following the primary", timeout=60)
            serving["index"] = 1 - serving["index"]

        losses = bounded(lambda: train(client, 8, snapshot_every=0,
                                       on_step=on_step),
                         "training through two server kills", timeout=240)
        assert losses == baseline, (losses, baseline)
        ends = client.session_ends
        assert len(ends) == 2 and all(e["resumed"] for e in ends), ends
    finally:
        client.close()
    # Neither restarted server served its own journal.
    for s in servers:
        assert "serving this server's journal" not in "".join(
            s.containers[0].lines), s.name
    for s in servers:  # every container's log, the killed ones' too
        for line in s.containers[0].log.read_text().splitlines():
            if "resumed; " in line:
                assert line.endswith(", 0 lost"), line
    grace = server_spec(manifests)["terminationGracePeriodSeconds"]
    assert runner.delete_all(grace_s=grace) == {
        p.name: 0 for p in servers + workers}, runner.logs()
