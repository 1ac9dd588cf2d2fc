"""The one launcher of Plexus processes from Python: plexus-server (the
embedded cluster of plexus.local and `plexus up`) and plexus-server and
plexus-worker on Ray hosts (plexus.ray).

Every process it starts gets:
  - argv: the binary and its flags, plus `--ready-fd N`, the write end of
    a pipe on which the process writes one line once it is ready (the
    server its address, a worker its id) and, for the server, one line per
    worker that did not exit cleanly as it exits; the read end is the
    caller's (read_ready_line), to close when done;
  - `--die-with-parent` unless told otherwise: the binary sets
    PR_SET_PDEATHSIG itself, so it dies with the thread that started it
    (no preexec_fn, which is unsafe in a threaded process);
  - the environment of this process, with the cluster secret in
    $PLEXUS_CLUSTER_SECRET (never on a command line, where `ps` shows it)
    and the caller's variables set or, given as None, removed;
  - stdin from /dev/null; stdout and stderr appended to `log_path`, or
    without one stdout to /dev/null and stderr this process's;
  - a session (and process group) of its own with new_session=True, so
    that os.killpg(process.pid, ...) reaches it and whatever it forked.

Imports nothing from the package: the clusters sit on top of it.
"""
import os
import select
import signal
import subprocess


def spawn(argv, *, secret, env=None, log_path=None, new_session=False,
          die_with_parent=True):
    """Starts `argv` as above; returns (its subprocess.Popen, the read end
    of its ready pipe)."""
    read_end, write_end = os.pipe()
    argv = list(argv) + ["--ready-fd", str(write_end)]
    if die_with_parent:
        argv.append("--die-with-parent")
    full_env = dict(os.environ, PLEXUS_CLUSTER_SECRET=secret)
    for name, value in (env or {}).items():
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    log = open(log_path, "ab") if log_path else None
    try:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL,
            stdout=log or subprocess.DEVNULL, stderr=log,
            start_new_session=new_session, pass_fds=(write_end,),
            env=full_env)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
        if log:
            log.close()
    return process, read_end


def read_ready_line(fd, timeout):
    """The line a spawned process writes on its ready pipe once ready,
    stripped; "" if the pipe ended first (the process exited); None if
    nothing came within `timeout` seconds."""
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return None
    return os.read(fd, 256).decode().strip()


def describe_exit(returncode):
    """A process's exit in words: "exited with code 3", "was killed by
    signal 9 (SIGKILL)", "still running" (None)."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "?"
        return f"was killed by signal {-returncode} ({name})"
    return f"exited with code {returncode}"
