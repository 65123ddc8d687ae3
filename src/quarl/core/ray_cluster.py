"""Starting or joining Ray, shared by the two parallel runners (ActorQ's fleet and the
study's cells), which are the only modules that use it."""

from __future__ import annotations

import logging
import os
import socket
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
    env = {"env_vars": {"OMP_NUM_THREADS": "1", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}}
    if address and address != "auto":
        check_reachable(address)
    import signal
    import threading

    # Ray's driver installs a failure handler on SIGTERM that dumps a C++ stack trace and
    # aborts; the caller's handler (quarl's CLI: checkpoint, clean shutdown) is put back
    handlers = ({s: signal.getsignal(s) for s in (signal.SIGTERM,)}
                if threading.current_thread() is threading.main_thread() else {})
    try:
        if address:
            # a loopback cluster: else the driver registers under this machine's LAN address (None: Ray's own)
            node_ip = "127.0.0.1" if _is_loopback(address) else None
            ray.init(address=address, runtime_env=env, log_to_driver=False, logging_level=logging.ERROR,
                     _node_ip_address=node_ip)
        else:
            import psutil

            from quarl.core import lifeline

            before = {p.pid for p in psutil.Process().children()}
            # "local": a new Ray of our own even when another one runs on this machine
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, runtime_env=env, log_to_driver=False,
                     logging_level=logging.ERROR)
            # its GCS and raylet end with this process, but the raylet's agents wait 60 s for
            # the dead GCS first (measured after kill -9 of quarl study); a reaper ends them at once
            lifeline.reap_after_exit([p.pid for p in psutil.Process().children() if p.pid not in before])
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
