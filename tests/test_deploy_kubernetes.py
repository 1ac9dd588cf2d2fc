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


def test_the_manifests_say_what_docs_deploy_promises():
    m = Manifests.load(FILES)
    server = m.one("Deployment", "plexus-server")
    workers = m.one("StatefulSet", "plexus-worker")
    assert m.one("Service", "plexus-server")["spec"]["selector"] == \
        server["spec"]["template"]["metadata"]["labels"]
    # One worker per node.
    terms = workers["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["topologyKey"] for t in terms] == ["kubernetes.io/hostname"]
    for pod in (server, workers):
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
    return m.one("Deployment", "plexus-server")["spec"]["template"]["spec"]


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
        (pod,) = pods
        names = ["plexus-server", "plexus-server.plexus",
                 "plexus-server.plexus.svc",
                 "plexus-server.plexus.svc.cluster.local"]
        cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
        san = ",".join([f"DNS:{n}" for n in names] + [f"IP:{pod.ip}"])
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key),
             "-out", str(cert), "-days", "1", "-subj", "/CN=plexus-server",
             "-addext", f"subjectAltName={san}"],
            check=True, capture_output=True, timeout=60)
        for k, f in (("tls.crt", cert), ("tls.key", key), ("ca.crt", cert)):
            m.set_secret("plexus-tls", k, f.read_text())
        monkeypatch.setenv("PLEXUS_TLS_CA", str(cert))
    return prepare


def start_cluster(m, lab, runner, tmp_path, monkeypatch):
    """The server's pod, then the workers': (server pod, worker pods), once
    the server listens and every worker has registered."""
    prepare = make_secrets(m, lab, tmp_path, monkeypatch)
    (server,) = runner.start("Deployment", "plexus-server", prepare=prepare)
    server.wait_for_log("listening on", timeout=30)
    workers = runner.start("StatefulSet", "plexus-worker")
    for w in workers:
        w.wait_for_log("registered as worker", timeout=30)
    return server, workers


def test_the_manifests_commands_run_a_cluster_in_network_namespaces(
        manifests, lab, runner, tmp_path, monkeypatch):
    m = manifests
    server, workers = start_cluster(m, lab, runner, tmp_path, monkeypatch)
    address = f"{server.ip}:7070"
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
        p.name: 0 for p in [server] + workers + [job]}, runner.logs()
    # No container logged a credential.
    token = plexus._core.tenant_token("smoke", lab.secret)
    for pod in runner.pods:
        text = "".join(pod.containers[0].lines).lower()
        assert lab.secret not in text and token not in text, pod.name


def test_the_placeholder_secret_is_refused(runner):
    # cluster-secret.yaml applied as it is: the server does not start, and
    # says why, without showing the value.
    (server,) = runner.start("Deployment", "plexus-server")
    line = server.wait_for_log("cannot start", timeout=30)
    assert server.containers[0].popen.wait(timeout=15) == 1
    assert "PLEXUS_CLUSTER_SECRET" in line or "hex" in line, line
    assert "REPLACE-ME" not in "".join(server.containers[0].lines)


def test_the_workers_rejoin_when_the_server_container_restarts(
        manifests, lab, runner, tmp_path, monkeypatch):
    # The server's container dies (a crash, an OOM kill) and the kubelet
    # starts it again in the same pod: the workers, still running, register
    # again (plexus-worker reconnects with back-off, at most 5 s apart) and
    # the cluster serves a job. No worker pod restarts.
    server, workers = start_cluster(manifests, lab, runner, tmp_path,
                                    monkeypatch)
    runner.restart(server).wait_for_log("listening on", timeout=30)
    for w in workers:
        w.wait_for_log("registered as worker", timeout=30, count=2)
    address = f"{server.ip}:7070"
    monkeypatch.setenv("PLEXUS_CLUSTER_SECRET", lab.secret)  # the operator's
    st = plexus.status(address)
    assert sorted(w["host_name"] for w in st["workers"] if w["alive"]) == \
        [p.name for p in workers]
    client = plexus.connect(address, name="after-restart")
    try:
        y = bounded(lambda: readme_example(client)[0], "a job after restart")
    finally:
        client.close()
    assert y == 56.0
    grace = server_spec(manifests)["terminationGracePeriodSeconds"]
    assert runner.delete_all(grace_s=grace) == {
        p.name: 0 for p in [server] + workers}, runner.logs()
