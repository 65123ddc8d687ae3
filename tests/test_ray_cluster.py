"""ActorQ on a real two-node Ray cluster on the loopback address: a head and a second
node started with ``ray start`` (each with its own CPUs), the driver joining with
``--address 127.0.0.1:PORT``. Only the processes these tests start are stopped; never
``ray stop``, which would stop every Ray on the machine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

RAY = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
QUARL = [sys.executable, "-m", "quarl.cli"]
# one authentication mode for every process, whatever ~/.ray holds: a head that finds a
# token file turns token authentication on, and a node or driver without it cannot join
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One ``ray start --block`` in its own process group: SIGTERM to the group stops this
    node's raylet, workers and (for a head) GCS, and nothing else."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] = ENV) -> None:
        self.log = log.open("w")
        self.proc = subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", *args], stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


def _nodes_alive(address: str) -> int:
    code = ("import ray, logging; ray.init(address=%r, _node_ip_address='127.0.0.1', logging_level=logging.ERROR);"
            "print(sum(n['Alive'] for n in ray.nodes()))" % address)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=ENV)
    return int(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else 0


def _start_cluster(tmp_path: Path, head_cpus: int, second_cpus: int | None) -> tuple[str, list[Node]]:
    port = _free_port()
    address = f"127.0.0.1:{port}"
    nodes = [Node(["--head", "--node-ip-address", "127.0.0.1", "--port", str(port), f"--num-cpus={head_cpus}",
                   "--include-dashboard=false"], tmp_path / "head.log")]
    if second_cpus is not None:
        time.sleep(5)
        nodes.append(Node([f"--address={address}", "--node-ip-address", "127.0.0.1", f"--num-cpus={second_cpus}"],
                          tmp_path / "second.log"))
    want = len(nodes)
    for _ in range(30):
        if _nodes_alive(address) >= want:
            return address, nodes
        time.sleep(2)
    for node in nodes:
        node.stop()
    pytest.fail(f"the Ray cluster did not come up: {(tmp_path / 'head.log').read_text()[-2000:]}")


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[tuple[str, list[Node]]]:
    address, nodes = _start_cluster(tmp_path, head_cpus=2, second_cpus=2)
    try:
        yield address, nodes
    finally:
        for node in reversed(nodes):
            node.stop()


def test_actors_spread_over_two_nodes_and_survive_the_second_leaving(two_nodes, tmp_path: Path) -> None:
    address, (head, second) = two_nodes
    out = tmp_path / "run"
    run = subprocess.Popen(
        [*QUARL, "actorq", "run", "CartPole-v1", "--address", address, "--actors", "2", "--actor-precision", "int8",
         "--policy-layers", "64,64", "--lr", "1e-3", "--batch-size", "64", "--samples-per-insert", "4",
         "--target-reward", "150", "--eval-seconds", "3", "--eval-episodes", "3", "--max-minutes", "5",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        nodes_file = out / "actor_nodes.json"
        deadline = time.time() + 180
        placed: dict = {}
        while time.time() < deadline and run.poll() is None:
            if nodes_file.exists():
                placed = json.loads(nodes_file.read_text())
                if len({v[0] for v in placed["actors"].values()}) == 2:
                    break
            time.sleep(0.5)
        assert len({v[0] for v in placed.get("actors", {}).values()}) == 2, f"actors not on two nodes: {placed}"
        driver = placed["driver_node"]
        assert driver in {v[0] for v in placed["actors"].values()}
        second.stop()  # the second node leaves mid-run
        output, _ = run.communicate(timeout=400)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reached"], output[-3000:]
    assert summary["restarts"] >= 1
    moved = [v for v in summary["actor_nodes"].values() if len(v) > 1]
    assert moved, summary["actor_nodes"]
    for nodes in moved:  # the actor that lived on the second node now runs on the head
        assert nodes[0] != driver and nodes[-1] == driver
    assert "restarting it" in output


def test_a_cluster_with_no_free_cpu_is_refused_in_one_line(tmp_path: Path) -> None:
    address, nodes = _start_cluster(tmp_path, head_cpus=0, second_cpus=None)
    try:
        r = subprocess.run([*QUARL, "actorq", "run", "CartPole-v1", "--address", address, "--actors", "2",
                            "--policy-layers", "32", "--out", str(tmp_path / "run")],
                           capture_output=True, text=True, timeout=300, env=ENV)
    finally:
        for node in nodes:
            node.stop()
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    # what the run starts is said first (one line), then the refusal (one line)
    assert len(lines) == 2 and lines[0].startswith("starting 2 int8 actors"), r.stderr
    assert "has 0 free CPUs and --actors 2 needs one each" in lines[1], r.stderr


def test_losing_the_cpus_the_actors_need_is_one_line(tmp_path: Path) -> None:
    """Head with 1 CPU, second node with 2, two actors: when the second node leaves, no
    node can hold the restarted actor, and the run stops in one line instead of hanging."""
    address, nodes = _start_cluster(tmp_path, head_cpus=1, second_cpus=2)
    out = tmp_path / "run"
    try:
        run = subprocess.Popen([*QUARL, "actorq", "run", "CartPole-v1", "--address", address, "--actors", "2",
                                "--policy-layers", "32", "--target-reward", "1e9", "--max-minutes", "5", "--out",
                                str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        deadline = time.time() + 180
        while time.time() < deadline and not (out / "actor_nodes.json").exists() and run.poll() is None:
            time.sleep(0.5)
        assert (out / "actor_nodes.json").exists(), run.communicate(timeout=30)
        nodes[1].stop()
        stdout, stderr = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
        for node in reversed(nodes):
            node.stop()
    assert run.returncode == 2, stderr[-2000:]
    errors = [line for line in stderr.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1 and "the Ray cluster lost nodes: 1 CPUs are left for --actors 2" in errors[0], \
        stderr[-2000:]


def test_a_remote_clusters_workers_answer_as_the_cpu_kind_asked(tmp_path: Path) -> None:
    """QUARL_CPU_KIND set for a run reaches the workers of a cluster started without it (a
    remote node's workers do not inherit the driver's environment)."""
    clean = {k: v for k, v in ENV.items() if k != "QUARL_CPU_KIND"}
    port = _free_port()
    address = f"127.0.0.1:{port}"
    head = Node(["--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus=1",
                 "--include-dashboard=false"], tmp_path / "head.log", env=clean)
    code = ("import os, ray\nfrom quarl.core.ray_cluster import start_ray\n"
            f"start_ray({address!r}, 1)\n"
            "print('worker:', ray.get(ray.remote(lambda: os.environ.get('QUARL_CPU_KIND'))"
            ".options(num_cpus=1).remote()))\n")
    try:
        for _ in range(30):
            if _nodes_alive(address) >= 1:
                break
            time.sleep(2)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                           env={**clean, "QUARL_CPU_KIND": "avx2"})
    finally:
        head.stop()
    assert "worker: avx2" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
