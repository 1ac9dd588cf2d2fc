"""Kubernetes manifests, read and run without Kubernetes: each pod of a
Deployment or StatefulSet becomes a network namespace of a NetnsLab
(tests/netns.py) running its containers' commands, with the environment,
arguments and files the manifests give them.

    m = Manifests.load(paths)
    m.set_secret("plexus-cluster-secret", "cluster-secret", hex)
    runner = PodRunner(m, lab, tmp_path, namespace="plexus")
    (server,) = runner.start("StatefulSet", "plexus-server-a")
    server.wait_for_log("listening on", timeout=30)
    ...
    runner.wait_all(timeout=15)   # {pod name: exit code}

Kubernetes semantics kept: $(VAR) in command, args and env values is
expanded from the container's environment ($$ escapes, an undefined
variable stays as written); `envFrom` first, then `env` in order; the
downward API's metadata.name, metadata.namespace and status.podIP; a
Service name, short or fully qualified, resolves to the address of the pod
it selects; a ConfigMap or Secret volume is a folder of one file per key,
and its mount path in an argument becomes that folder; so does a StatefulSet's
volume claim (one folder per pod, kept when its container restarts). Not
kept: the
image's user (the processes run as this test), probes, resources.
"""
import base64
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from conftest import PLEXUS_PYTHONPATH
from plexus._binaries import bin_dir, default_pjrt_plugin

# The image's own environment (deploy/docker/Dockerfile's ENV), with this
# tree's paths; sanitizer settings of the test run pass through (the ASan
# stage preloads the runtime, which a pod's python3 needs to import the
# instrumented extension, as the test process does).
_SANITIZER_VARS = ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS",
                   "TSAN_OPTIONS", "LD_PRELOAD")


def image_env(home):
    # PYTHONPATH: the image has the package installed; here, the tree's.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "PYTHONUNBUFFERED": "1", "PYTHONPATH": PLEXUS_PYTHONPATH,
           "PLEXUS_PJRT_PLUGIN": default_pjrt_plugin() or ""}
    env.update({k: os.environ[k] for k in _SANITIZER_VARS if k in os.environ})
    return env


_VAR = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_]*)\))")


def expand(text, env):
    """Kubernetes' $(VAR) expansion of command, args and env values."""
    def one(m):
        if m.group(1) == "$":
            return "$"
        return env.get(m.group(2), m.group(0))
    return _VAR.sub(one, text)


@dataclass
class Manifests:
    docs: list

    @classmethod
    def load(cls, paths):
        docs = []
        for p in paths:
            docs += [d for d in yaml.safe_load_all(Path(p).read_text()) if d]
        return cls(docs)

    def one(self, kind, name):
        found = [d for d in self.docs
                 if d["kind"] == kind and d["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} in the manifests"
        return found[0]

    def all(self, kind):
        return [d for d in self.docs if d["kind"] == kind]

    def config_map(self, name):
        return dict(self.one("ConfigMap", name).get("data", {}))

    def secret(self, name):
        s = self.one("Secret", name)
        data = {k: base64.b64decode(v).decode()
                for k, v in s.get("data", {}).items()}
        data.update(s.get("stringData", {}))
        return data

    def set_config(self, name, key, value):
        """What editing the ConfigMap `name` before applying it would
        hold."""
        self.one("ConfigMap", name).setdefault("data", {})[key] = value

    def set_secret(self, name, key, value):
        """What `kubectl create secret generic NAME --from-literal=KEY=...`
        would hold."""
        s = self.one("Secret", name)
        s.setdefault("stringData", {})[key] = value
        s.get("data", {}).pop(key, None)


class Container:
    """One container's process, its output copied to a log file and
    watched line by line."""

    def __init__(self, pod, name, cmd, env, log):
        self.pod, self.name, self.log = pod, name, log
        self.cmd, self.env = cmd, env
        self.lines = []
        self.done = threading.Condition()
        self.eof = False
        self.popen = subprocess.Popen(
            ["ip", "netns", "exec", pod.netns] + cmd, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        with open(self.log, "ab") as out:
            for line in self.popen.stdout:
                out.write(line)
                out.flush()
                with self.done:
                    self.lines.append(line.decode(errors="replace"))
                    self.done.notify_all()
        with self.done:
            self.eof = True
            self.done.notify_all()

    def await_eof(self, timeout):
        """Waits (at most `timeout`) until the reader has taken every line
        the process wrote: its exit comes before the reader's last read."""
        with self.done:
            self.done.wait_for(lambda: self.eof, timeout=timeout)

    def wait_for_log(self, text, timeout, count=1):
        """Returns the `count`th line holding `text`; raises if the process
        ends first (its output ended) or `timeout` passes."""
        deadline = time.monotonic() + timeout
        with self.done:
            while True:
                hits = [ln for ln in self.lines if text in ln]
                if len(hits) >= count:
                    return hits[count - 1]
                left = deadline - time.monotonic()
                if self.eof or left <= 0:
                    why = ("its output ended (exit code "
                           f"{self.popen.poll()})" if self.eof
                           else f"{timeout} s passed")
                    raise AssertionError(
                        f"{self.pod.name}/{self.name}: no line with {text!r}; "
                        f"{why}. Its log ({self.log}):\n"
                        + "".join(self.lines)[-3000:])
                self.done.wait(left)


@dataclass
class Pod:
    name: str
    netns: str
    ip: str
    labels: dict
    spec: dict
    # Its StatefulSet's volumeClaimTemplates: a folder of its own each,
    # kept across container restarts.
    claims: set = field(default_factory=set)
    containers: list = field(default_factory=list)

    def wait_for_log(self, text, timeout, count=1):
        return self.containers[0].wait_for_log(text, timeout, count)


class PodRunner:
    def __init__(self, manifests, lab, tmp_path, namespace="default"):
        self.m = manifests
        self.lab = lab
        self.tmp = Path(tmp_path)
        self.namespace = namespace
        self.pods = []
        self._flags = {}

    # ------------------------------------------------------------ pods
    def start(self, kind, name, prepare=None):
        """Every pod of the Deployment, StatefulSet or Job `name`, started.
        prepare(pods), if given, runs once their addresses are known and
        before their containers start (e.g. to make a certificate naming
        them)."""
        pods = self.create(kind, name)
        if prepare is not None:
            prepare(pods)
        self.run(pods)
        return pods

    def create(self, kind, name):
        """The pods of `name` with their addresses, not started yet (run):
        Services select them from now on."""
        w = self.m.one(kind, name)
        template = w["spec"]["template"]
        labels = template["metadata"].get("labels", {})
        claims = {t["metadata"]["name"]
                  for t in w["spec"].get("volumeClaimTemplates", [])}
        pods = []
        for i in range(w["spec"].get("replicas", 1)):
            host = self.lab.add_host()
            pod_name = (f"{name}-{i}" if kind == "StatefulSet"
                        else f"{name}-{uuid.uuid4().hex[:5]}")
            pods.append(Pod(pod_name, host.netns, host.address, labels,
                            template["spec"], claims))
        self.pods += pods
        return pods

    def run(self, pods):
        """Starts the containers of pods made by create."""
        for pod in pods:
            for c in pod.spec["containers"]:
                pod.containers.append(self._run(pod, pod.spec, c))

    def _run(self, pod, spec, c):
        env = self._env(pod, c)
        # Cluster DNS: a Service name in a value is the pod behind it.
        env = {k: self._resolve_services(v) for k, v in env.items()}
        cmd = [expand(a, env) for a in c.get("command", [])]
        args = [expand(a, env) for a in c.get("args", [])]
        args = [self._resolve_services(a) for a in args]
        args, env = self._mount_volumes(pod, spec, c, args, env)
        assert cmd, f"{pod.name}/{c['name']}: no command (the image's default)"
        args = cmd[1:] + args
        if (bin_dir() / cmd[0]).exists():  # plexus-server, plexus-worker
            exe = str(bin_dir() / cmd[0])
            args = self._check_flags(exe, args, f"{pod.name}/{c['name']}")
        elif cmd[0] in ("python3", "python"):
            exe = sys.executable  # the image's, with plexus installed
        else:
            exe = shutil.which(cmd[0], path=env["PATH"])
            assert exe, f"{pod.name}/{c['name']}: no {cmd[0]} on PATH"
        log = self.tmp / f"{pod.name}.{c['name']}.log"
        return Container(pod, c["name"], [exe] + args, env, log)

    def _env(self, pod, c):
        env = image_env(self.tmp)
        for src in c.get("envFrom", []):
            prefix = src.get("prefix", "")
            if "configMapRef" in src:
                data = self.m.config_map(src["configMapRef"]["name"])
            else:
                data = self.m.secret(src["secretRef"]["name"])
            env.update({prefix + k: v for k, v in data.items()})
        fields = {"metadata.name": pod.name,
                  "metadata.namespace": self.namespace,
                  "status.podIP": pod.ip}
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
                continue
            src = e["valueFrom"]
            if "fieldRef" in src:
                env[e["name"]] = fields[src["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                env[e["name"]] = self.m.secret(ref["name"])[ref["key"]]
            elif "configMapKeyRef" in src:
                ref = src["configMapKeyRef"]
                env[e["name"]] = self.m.config_map(ref["name"])[ref["key"]]
            else:
                raise AssertionError(f"{e['name']}: unsupported {src}")
        return env

    def _resolve_services(self, arg):
        """Service DNS names (name, name.ns, name.ns.svc[.cluster.local])
        followed by a port become the address of the pod they select."""
        for svc in self.m.all("Service"):
            name = svc["metadata"]["name"]
            pattern = re.compile(
                rf"(?<![\w.-]){re.escape(name)}"
                rf"(\.{re.escape(self.namespace)}(\.svc(\.cluster\.local)?)?)?"
                r"(?=:\d)")
            if not pattern.search(arg):
                continue
            selector = svc["spec"]["selector"]
            backends = [p for p in self.pods
                        if all(p.labels.get(k) == v
                               for k, v in selector.items())]
            assert len(backends) == 1, (
                f"Service {name} in {arg!r}: {len(backends)} pods started "
                "behind it (start the pods it selects first)")
            arg = pattern.sub(backends[0].ip, arg)
        return arg

    def _mount_volumes(self, pod, spec, c, args, env):
        """ConfigMap and Secret volumes as folders (every key, or the
        `items` listed, each at its `path`); their mount paths in arguments
        and environment values become those folders."""
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for mount in c.get("volumeMounts", []):
            if mount["name"] in pod.claims:  # a persistent volume
                folder = self.tmp / pod.name / mount["mountPath"].strip("/")
                folder.mkdir(parents=True, exist_ok=True)
                args = [a.replace(mount["mountPath"], str(folder))
                        for a in args]
                continue
            v = volumes[mount["name"]]
            if "configMap" in v:
                source = v["configMap"]
                data = self.m.config_map(source["name"])
            elif "secret" in v:
                source = v["secret"]
                data = self.m.secret(source["secretName"])
            else:
                continue  # emptyDir (/dev/shm): the machine's own
            files = ({i["path"]: data[i["key"]] for i in source["items"]}
                     if "items" in source else data)
            folder = self.tmp / pod.name / mount["mountPath"].strip("/")
            folder.mkdir(parents=True, exist_ok=True)
            for path, value in files.items():
                (folder / path).write_text(value)
            args = [a.replace(mount["mountPath"], str(folder)) for a in args]
            env = {k: v.replace(mount["mountPath"], str(folder))
                   for k, v in env.items()}
        return args, env

    def _known_flags(self, exe):
        if exe not in self._flags:
            out = subprocess.run([exe, "--help"], capture_output=True,
                                 text=True, timeout=30).stdout
            self._flags[exe] = set(re.findall(r"(--[a-z][a-z0-9-]*)", out))
        return self._flags[exe]

    def _check_flags(self, exe, args, where):
        """The manifests' flags, each one the binary lists in --help: a
        flag it lacks fails the test, naming the container."""
        known = self._known_flags(exe)
        for a in args:
            flag = a.partition("=")[0]
            assert not flag.startswith("--") or flag in known, (
                f"{where}: {Path(exe).name} has no flag {flag}")
        return args

    def restart(self, pod):
        """What the kubelet does when a container dies (restartPolicy
        Always): the same command and environment again, in the same pod
        (same address). Kills the running one first (SIGKILL: a crash or
        an OOM kill), and reaps it."""
        old = pod.containers[0]
        if old.popen.poll() is None:
            os.killpg(old.popen.pid, 9)
        old.popen.wait()
        old.reader.join(timeout=5)
        old.popen.stdout.close()
        pod.containers[0] = Container(pod, old.name, old.cmd, old.env,
                                      old.log)
        return pod.containers[0]

    # ------------------------------------------------------------ end
    def delete_all(self, grace_s):
        """What `kubectl delete` does to every pod: SIGTERM to each
        container, `grace_s` to exit, then SIGKILL. {pod name: exit code},
        None for one that had to be killed."""
        for pod in self.pods:
            for c in pod.containers:
                if c.popen.poll() is None:
                    c.popen.terminate()
        return self.wait_all(grace_s)

    def wait(self, pod, timeout):
        """The exit code of `pod`'s container; AssertionError naming its
        output if it runs longer than `timeout`."""
        c = pod.containers[0]
        try:
            code = c.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{pod.name}/{c.name} still runs after {timeout} s; its "
                "output:\n" + "".join(c.lines)[-3000:]) from None
        # Its last lines, which callers read next (an exit is seen before
        # the reader thread has read what was written just before it).
        c.await_eof(timeout=10)
        return code

    def wait_all(self, timeout):
        """Waits for every container to exit; {pod name: exit code}, None
        for one still running after `timeout` (then killed)."""
        deadline = time.monotonic() + timeout
        codes = {}
        for pod in self.pods:
            for c in pod.containers:
                try:
                    codes[pod.name] = c.popen.wait(
                        timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    codes[pod.name] = None
        self.kill()
        return codes

    def logs(self):
        return "\n".join(f"--- {p.name}/{c.name}\n" + "".join(c.lines)[-2000:]
                         for p in self.pods for c in p.containers)

    def kill(self):
        for pod in self.pods:
            for c in pod.containers:
                if c.popen.poll() is None:
                    os.killpg(c.popen.pid, 9)
                c.popen.wait()
                c.reader.join(timeout=5)
                if not c.reader.is_alive():
                    c.popen.stdout.close()
