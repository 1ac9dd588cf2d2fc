"""Waiting for processes that are not our children, without polling."""
import os
import select
import time


def wait_for_exit(pids, timeout):
    """Blocks until every pid in `pids` has exited (or is a zombie), up to
    `timeout` seconds; returns the pids still running. Uses pidfds, which
    become readable when the process exits."""
    deadline = time.monotonic() + timeout
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            pass  # already gone
    try:
        while fds:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(list(fds), [], [], left)
            for fd in ready:
                os.close(fd)
                del fds[fd]
        return sorted(fds.values())
    finally:
        for fd in fds:
            os.close(fd)
