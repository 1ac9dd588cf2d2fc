"""deploy/slurm/plexus.sbatch: the server on the first node, a worker per
node with srun, the data-parallel example as the job's program.

Under a real Slurm where one can start: the test starts munged, slurmctld
and two slurmd (nodes n0 and n1, both on this machine; Debian's slurm-wlm,
scripts/setup.sh) with a configuration of its own in a temporary folder,
and submits the script with `sbatch --wait --nodes=2`. Where slurmd cannot start (no
root, no Slurm installed, a container that forbids it) the test runs the
script with bash, with the variables Slurm would set (SLURM_JOB_ID,
SLURM_JOB_NODELIST, ...) and an `srun` and `scontrol` that run each
command once on this node. The test's output says which ("Slurm mode: ...")
and the simulated mode is also a warning in the summary.
"""
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import warnings

import pytest

from conftest import PLEXUS_PYTHONPATH, ROOT
from plexus._binaries import bin_dir
from tls_cert import self_signed

SCRIPT = ROOT / "deploy" / "slurm" / "plexus.sbatch"
JOB = ROOT / "tests" / "deploy_job.py"
DEVICES = 2
JOB_TIMEOUT_S = 240  # the whole job: cluster up, 100 steps, down


_drawn_ports = set()


def free_port():
    """A port free now, not handed out before by this test run, and below
    the kernel's ephemeral range. Free now is not enough: the port is used
    seconds later, once Slurm is up, and meanwhile the kernel may give it to
    an outgoing connection as its local port (an ASan run saw the server
    refused: "0.0.0.0:36641: Address already in use"); ports below the
    range are never given that way. Two draws must differ too: the server
    and the workers' data planes collided when the kernel handed the same
    port twice."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, max(10001, ephemeral_low))
        if port in _drawn_ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue  # in use
        _drawn_ports.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range in 200 tries")


class Daemons:
    """slurmctld and slurmd in the foreground, children of this test, and
    munged (which detaches; its pid file); stop() ends them."""

    def __init__(self, folder):
        self.folder = folder
        self.procs = {}
        self.pid_files = []  # daemons that detached (munged)

    def start(self, name, cmd):
        log = open(self.folder / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True, env=DAEMON_ENV)
        log.close()

    def stop(self):
        for f in self.pid_files:
            try:
                os.kill(int(f.read_text().split()[0]), 15)
            except (OSError, ValueError, IndexError):
                pass  # gone already
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for name, p in self.procs.items():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def tail(self):
        out = []
        for f in sorted(self.folder.glob("*.log")) + sorted(
                self.folder.glob("*.out")):
            out.append(f"--- {f.name}\n" + f.read_text(errors="replace")[-1500:])
        return "\n".join(out)


# The daemons' environment: not the sanitizer runtime the ASan stage
# preloads into this process (they are not built for it; a job's own
# processes still get it, through sbatch's environment).
DAEMON_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun",
                  "scontrol")


def start_slurm(folder, nodes):
    """A Slurm cluster of `nodes` nodes on this machine (n0, n1, ...: one
    slurmd each, on ports of their own, NodeAddr 127.0.0.1): (Daemons, the
    environment its commands need), or (None, why it cannot start)."""
    missing = [b for b in SLURM_BINARIES
               if not shutil.which(b, path="/usr/sbin:/usr/bin:"
                                   + os.environ.get("PATH", ""))]
    if missing:
        return None, f"not installed: {', '.join(missing)}"
    if os.geteuid() != 0:
        return None, "slurmd needs root"
    d = Daemons(folder)
    munge = folder / "munge"
    munge.mkdir(mode=0o700)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    sock = munge / "munge.sock"
    # munged daemonizes once its socket is there (its parent exits after
    # the child has started): a command that returns when it is ready.
    r = subprocess.run(["/usr/sbin/munged", "--force", f"--socket={sock}",
                        f"--key-file={key}", f"--pid-file={munge}/munged.pid",
                        f"--log-file={folder}/munged.log",
                        f"--seed-file={munge}/seed"],
                       capture_output=True, text=True, timeout=30,
                       env=DAEMON_ENV)
    if r.returncode != 0:
        return None, f"munged: {r.stderr.strip()}"
    d.pid_files.append(munge / "munged.pid")
    (folder / "state").mkdir()
    conf = folder / "slurm.conf"
    cpus = max(1, os.cpu_count() // nodes)
    node_lines = "".join(
        f"NodeName=n{i} NodeHostname={socket.gethostname()} "
        f"NodeAddr=127.0.0.1 Port={free_port()} CPUs={cpus} State=UNKNOWN\n"
        for i in range(nodes))
    conf.write_text(f"""\
ClusterName=plexustest
SlurmctldHost={socket.gethostname()}
SlurmctldPort={free_port()}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
{node_lines}PartitionName=plexus Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    env = dict(os.environ, SLURM_CONF=str(conf))
    d.start("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(conf)])
    for i in range(nodes):
        (folder / f"spool-n{i}").mkdir()
        d.start(f"slurmd-n{i}", ["/usr/sbin/slurmd", "-D", "-N", f"n{i}",
                                 "-f", str(conf)])
    # srun waits until the nodes can run a step (or fails): the cluster
    # works.
    try:
        r = subprocess.run(["srun", f"--nodes={nodes}", "--time=1", "true"],
                           env=env,
                           capture_output=True, text=True, timeout=60)
        ok, why = r.returncode == 0, r.stderr.strip()
    except subprocess.TimeoutExpired:
        ok, why = False, "srun did not run a step within 60 s"
    if not ok:
        tail = d.tail()
        d.stop()
        return None, f"{why}\n{tail}"
    return d, env


SHIMS = {
    # One node: each step runs its command once, here; --output=FILE
    # (%N: the node's name) as srun does. The script passes every srun
    # option as --name or --name=value.
    "srun": r"""#!/bin/bash
out=""
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in --output=*) out=${1#--output=};; esac
  shift
done
out=${out//%N/$(hostname -s)}
out=${out//%n/0}
export SLURM_PROCID=0 SLURM_NODEID=0 SLURM_LOCALID=0
if [ -n "$out" ]; then exec "$@" >"$out" 2>&1; else exec "$@"; fi
""",
    # No steps to list: the script signals the srun stand-in itself.
    "squeue": "#!/bin/bash\nexit 0\n",
    "scontrol": r"""#!/bin/bash
case "$1 $2" in
  "show hostnames") tr ',' '\n' <<<"$3";;
  "show node") echo "NodeName=$3 NodeAddr=$3";;
  *) echo "scontrol stand-in: $*" >&2; exit 1;;
esac
""",
}


def job_env(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [PLEXUS_PYTHONPATH] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                               else []))
    env.update(PLEXUS_PYTHON=sys.executable, PLEXUS_BIN_DIR=str(bin_dir()),
               PLEXUS_DEVICES_PER_HOST=str(DEVICES),
               PLEXUS_PORT=str(free_port()), PLEXUS_DATA_PORT=str(free_port()),
               PLEXUS_LOG_DIR=str(tmp_path / "plexus-logs"),
               PLEXUS_WAIT_S="60")
    env.pop("PLEXUS_CLUSTER_SECRET", None)  # the script draws one
    for k in ("PLEXUS_ADDRESS", "PLEXUS_TLS_CERT", "PLEXUS_TLS_KEY",
              "PLEXUS_TLS_CA"):
        env.pop(k, None)
    return env


SLURM_NODES = 2  # slurmd daemons of the real Slurm, all on this machine


# "slurm": a real Slurm of two nodes where one can start (else as
# "simulated", saying why); "simulated": always as where slurmd cannot
# start, so that that path is run too.
@pytest.mark.parametrize("want", ["slurm", "simulated"])
def test_the_sbatch_script_runs_the_data_parallel_example(tmp_path, want):
    result = tmp_path / "result.json"
    slurm_dir = tmp_path / "slurm"
    slurm_dir.mkdir()
    if want == "slurm":
        daemons, env_or_why = start_slurm(slurm_dir, SLURM_NODES)
    else:
        daemons, env_or_why = None, None
    out = tmp_path / "job.out"
    env = job_env(tmp_path)
    try:
        if daemons:
            nodes = [f"n{i}" for i in range(SLURM_NODES)]
            mode = (f"a real Slurm of {SLURM_NODES} nodes on this machine "
                    "(munged, slurmctld and a slurmd per node, started by the "
                    "test), sbatch --wait")
            # The nodes share this machine's addresses: each worker takes a
            # free data port.
            env.update(SLURM_CONF=env_or_why["SLURM_CONF"],
                       PLEXUS_DATA_PORT="0")
            cmd = ["sbatch", "--wait", f"--nodes={len(nodes)}",
                   f"--output={out}", f"--chdir={tmp_path}", str(SCRIPT)]
        else:
            nodes = [socket.gethostname().split(".")[0]]
            why = (f"slurmd could not start here: {env_or_why.splitlines()[0]}"
                   if env_or_why else "as where slurmd cannot start")
            mode = (f"simulated ({why}): the script ran with bash, the Slurm "
                    "variables set by the test and a one-node srun, scontrol "
                    "and squeue; the control plane on TLS")
            if want == "slurm":
                warnings.warn(f"Slurm mode: {mode}")
            shims = tmp_path / "shims"
            shims.mkdir()
            for name, text in SHIMS.items():
                (shims / name).write_text(text)
                (shims / name).chmod(0o755)
            # This path also runs the control plane on TLS: a certificate
            # naming the node, the CA for the workers and the program.
            cert, key = self_signed(tmp_path, f"DNS:{socket.gethostname()}",
                                    common_name="plexus-server")
            env.update(PLEXUS_TLS_CERT=str(cert), PLEXUS_TLS_KEY=str(key),
                       PLEXUS_TLS_CA=str(cert))
            env.update(PATH=f"{shims}:{env['PATH']}", SLURM_JOB_ID="4242",
                       SLURM_JOB_NAME="plexus",
                       SLURM_JOB_NODELIST=socket.gethostname(),
                       SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1",
                       SLURM_SUBMIT_DIR=str(tmp_path), SLURM_NODEID="0",
                       SLURM_CPUS_ON_NODE=str(os.cpu_count()))
            cmd = ["bash", str(SCRIPT)]
        cmd += [sys.executable, str(JOB), "--hosts", str(len(nodes)),
                "--devices-per-host", str(DEVICES), "--steps", "100",
                "--out", str(result)]
        print(f"Slurm mode: {mode}")
        with open(out, "ab") as f:
            r = subprocess.run(cmd, env=env, cwd=tmp_path, timeout=JOB_TIMEOUT_S,
                               stdout=f, stderr=subprocess.STDOUT)
    finally:
        if daemons:
            daemons.stop()
    text = out.read_text(errors="replace") if out.exists() else ""
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                     for p in sorted((tmp_path / "plexus-logs").glob("*.log")))
    assert r.returncode == 0, f"{mode}: exit code {r.returncode}\n{text}\n{logs}"
    got = json.loads(result.read_text())
    assert got["max_rel_err"] <= 1e-5, got
    assert got["final_loss"] < got["threshold"], got
    # One worker per node, named as the node; the job and the steps exited
    # cleanly.
    assert got["hosts"] == nodes, got
    ports = {a.rpartition(":")[2] for a in got["data_addresses"]}
    assert len(ports) == len(nodes), got
    if env["PLEXUS_DATA_PORT"] != "0":
        assert ports == {env["PLEXUS_DATA_PORT"]}, got
    assert "plexus: done, exit code 0" in text, text
    assert "wait_for" not in text, text  # nothing reaped twice at exit
    server_log = (tmp_path / "plexus-logs" / "server.log").read_text()
    assert ("(TLS;" if "PLEXUS_TLS_CERT" in env else "(plain text;") in \
        server_log, server_log
    assert len(list((tmp_path / "plexus-logs").glob("worker-*.log"))) == \
        len(nodes)
    assert "a server or worker step exited" not in text, text


def test_plexus_down_with_an_address_leaves_another_clusters_state_alone(
        tmp_path):
    # The Slurm script stops its server with `plexus down --address`; a
    # state file of a cluster `plexus up` started (another address, another
    # secret, another server pid) must be neither used nor removed.
    import plexus
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    state = state_dir / "cluster.json"
    state.write_text(json.dumps({"address": "127.0.0.1:1", "pid": other.pid,
                                 "secret": "00" * 32}))
    try:
        with plexus.local(hosts=1) as cluster:
            env = dict(os.environ, PLEXUS_STATE_DIR=str(state_dir),
                       PLEXUS_CLUSTER_SECRET=cluster._secret)
            env["PYTHONPATH"] = os.pathsep.join(
                [PLEXUS_PYTHONPATH] + ([env["PYTHONPATH"]]
                                       if env.get("PYTHONPATH") else []))
            r = subprocess.run([sys.executable, "-m", "plexus", "down",
                                "--address", cluster.address], env=env,
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            # This cluster's server went down (the admin credential from
            # the environment).
            assert cluster.process.wait(timeout=15) == 0
        assert other.poll() is None, "the other cluster's server was killed"
        assert state.exists()
    finally:
        other.kill()
        other.wait()
