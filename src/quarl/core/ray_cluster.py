"""Starting or joining Ray, shared by the two parallel runners (ActorQ's fleet and the
study's cells), which are the only modules that use it."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from typing import Any

from quarl.core.errors import QuarlError
from quarl.core.validate import digits


def check_reachable(address: str) -> None:
    """Fail in seconds, not minutes, when nothing listens at ``address`` (host:port)."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not digits(port):
        raise QuarlError(f"--address {address!r} is not HOST:PORT (e.g. 10.0.0.5:6379, or ray://HOST:10001)")
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            pass
    except OSError as exc:
        raise QuarlError(f"cannot reach Ray at --address {address!r}: {exc.strerror or exc}") from None


def start_ray(address: str | None, num_cpus: int) -> bool:
    """Start a local Ray with ``num_cpus`` slots, or join the cluster at ``address``;
    True when this call started it (and must shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    # one thread per worker: two threads on shared cores are slower and noisier
    env_vars = {"OMP_NUM_THREADS": "1", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    from quarl.core.cpu_kind import CPU_KIND_ENV

    if os.environ.get(CPU_KIND_ENV):  # a remote node's workers answer as the kind this run was asked to (docs/ptq.md)
        env_vars[CPU_KIND_ENV] = os.environ[CPU_KIND_ENV]
    env = {"env_vars": env_vars}
    if address and address != "auto":
        check_reachable(address)
    import signal
    import threading

    # Ray's driver installs a failure handler on SIGTERM that dumps a C++ stack trace and
    # aborts; the caller's handler (quarl's CLI: checkpoint, clean shutdown) is put back
    handlers = ({s: signal.getsignal(s) for s in (signal.SIGTERM,)}
                if threading.current_thread() is threading.main_thread() else {})
    terminated = False
    try:
        if address:
            # a loopback cluster: else the driver registers under this machine's LAN address (None: Ray's own)
            node_ip = "127.0.0.1" if _is_loopback(address) else None
            ray.init(address=address, runtime_env=env, log_to_driver=False, logging_level=logging.ERROR,
                     _node_ip_address=node_ip)
        else:
            from quarl.core import lifeline

            # every process of this Ray writes its logs under a folder of its own, and a
            # reaper started before the first of them ends whatever holds a file there once
            # this process ends: its GCS and raylet end with it (the kernel's parent-death
            # signal), but the raylet's agents waited 60 s for the dead GCS (measured after
            # kill -9 of quarl study), and a kill while Ray starts, before any reaper knew
            # their pids, left them for good
            temp_dir = tempfile.mkdtemp(prefix="quarl-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
            lifeline.reap_after_exit([], marker=temp_dir)
            # "local": a new Ray of our own even when another one runs on this machine
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, runtime_env=env, log_to_driver=False,
                     logging_level=logging.ERROR, _temp_dir=temp_dir)
    except SystemExit as exc:  # Ray's own SIGTERM handler, installed first thing in ray.init, exits
        if exc.code != signal.SIGTERM or not callable(handlers.get(signal.SIGTERM)):
            raise
        terminated = True
    except Exception as exc:  # ConnectionError, RuntimeError, ValueError, and Ray's bare Exception on a start timeout
        where = f"--address {address!r}" if address else "a local Ray"
        hint = ""
        if address and os.environ.get("RAY_AUTH_MODE") != "token":  # Ray's default for new clusters
            hint = " (a cluster with token authentication needs RAY_AUTH_MODE=token here too)"
        raise QuarlError(f"cannot start or reach {where}: {str(exc).splitlines()[0]}{hint}") from None
    finally:
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)
    if terminated:  # a SIGTERM while Ray started: what was started stops, then the caller's handler runs
        try:
            ray.shutdown()
        except Exception:  # a half-started Ray: the reaper ends what is left
            pass
        handler = handlers[signal.SIGTERM]
        assert callable(handler)
        handler(signal.SIGTERM, None)
    return True


def _is_loopback(address: str) -> bool:
    import ipaddress

    host = address.split("://", 1)[-1].rpartition(":")[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_cpus(ray_module: Any) -> float:
    """CPUs the Ray cluster has free now (``ray_module``: the imported ``ray``)."""
    return float(ray_module.available_resources().get("CPU", 0.0))
