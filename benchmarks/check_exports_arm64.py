"""Do quarl's exports act on ARM64 as they act on x86? Each export (fp32, fp16, int8, int4
and int4 ``--portable``, written by ``quarl export`` from the zoo's agents) runs under
ONNX Runtime for aarch64 on the states quarl's own evaluation visited on x86, and plays a
few episodes there where the env runs; its outputs and actions are compared with the same
file on x86 and with the fp32 network the export's verdict compared it with.

Here (x86) the aarch64 side is emulated: qemu-user (Debian's ``qemu-user-static``) runs
Debian's arm64 ``python3.11`` (its packages unpacked into a sysroot, ``apt-get download``)
with the manylinux aarch64 wheels of onnxruntime and numpy at the x86 venv's versions
(``pip download --platform manylinux_2_28_aarch64``) and gymnasium's pure-Python wheels.
Everything is set up once, idempotently, under ``--work`` (default
``~/.cache/quarl-arm64``); the only system changes it needs are done by hand, as root::

    apt-get install qemu-user-static
    dpkg --add-architecture arm64 && apt-get update

qemu-user 7.2 serves the host's /proc/cpuinfo, in which ONNX Runtime's cpuinfo finds no
ARM core (it crashes on import): each emulated CPU gets an ARM /proc/cpuinfo in its own
sysroot view (``--cpus``: ``cortex-a53``, the Raspberry Pi 3b of the paper, no dotprod;
``cortex-a76``, a Raspberry Pi 5, with dotprod). Timings under emulation mean nothing and
are not printed; run natively on an aarch64 board (the same command, no qemu: the board's
own Python with ``pip install quarl onnxruntime``) the script also prints batch-1 latency.

Run: ``.venv/bin/python benchmarks/check_exports_arm64.py`` (first run: ~40 MB of
packages and ~3 minutes of exports; then ~3 minutes). ``--quick``: one export (DQN
CartPole int8) on one CPU, or a ``skipped: ...`` line and exit 0 where qemu or the arm64
Python is not set up. Writes ``WORK/report.json`` (``--quick``: ``report-quick.json``); ``--markdown`` prints
the table for the docs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT.parent / "shared" / "zoo"
QUARL = [sys.executable, "-m", "quarl.cli"]
AGENTS = ("dqn/CartPole-v1_1", "sac/Pendulum-v1_1", "ppo/LunarLander-v2_1")
PRECISIONS = ("fp32", "fp16", "int8", "int4", "int4-portable")
# emulated CPUs: qemu's -cpu model, the MIDR part number an ARM /proc/cpuinfo gives, what it is
CPUS = {"cortex-a53": ("0xd03", "fp asimd evtstrm crc32 cpuid", "Raspberry Pi 3b (the paper's board)"),
        "cortex-a72": ("0xd08", "fp asimd evtstrm crc32 cpuid", "Raspberry Pi 4"),
        "cortex-a76": ("0xd0b", "fp asimd evtstrm crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp",
                       "Raspberry Pi 5")}
# Debian bookworm's arm64 python3.11 and what it and onnxruntime's wheel link against
DEBS = ("libc6 libgcc-s1 libstdc++6 gcc-12-base python3.11-minimal libpython3.11-minimal libpython3.11-stdlib "
        "python3.11 libexpat1 zlib1g libssl3 libffi8 libbz2-1.0 liblzma5 libsqlite3-0 libncursesw6 libtinfo6 "
        "libreadline8 libuuid1 libcrypt1 libnsl2 libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 "
        "libkeyutils1 libcom-err2 libdb5.3 libmd0 libzstd1").split()
WHEELS = ("onnxruntime", "numpy", "gymnasium", "cloudpickle", "typing_extensions", "farama-notifications")
PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_27_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64")
NATIVE = platform.machine().lower() in ("aarch64", "arm64")


class Missing(Exception):
    """A tool or a setup step that is not there: one line, said as it is."""


# ---------------------------------------------------------------------------------------
# the aarch64 side: what runs there (numpy, onnxruntime and gymnasium only)

RUNNER = r'''
import json, platform, sys, time
job = json.load(open(sys.argv[1]))
if job.get("site"):
    sys.path.insert(0, job["site"])
import numpy as np
import onnxruntime as ort

def session(path):
    o = ort.SessionOptions()
    o.intra_op_num_threads = 1
    o.inter_op_num_threads = 1
    return ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])

def acts(meta):
    """The sidecar's recipe: raw observation -> network input, network output -> action."""
    norm, space = meta["obs_normalizer"], meta["action_space"]
    def pre(obs):
        x = np.asarray(obs)[None]
        if norm is not None:  # float64, as SB3's VecNormalize, then the model's float32
            x = np.clip((x - np.asarray(norm["mean"])) / np.sqrt(np.asarray(norm["var"]) + norm["epsilon"]),
                        -norm["clip"], norm["clip"])
        x = x.astype(np.float32)
        return x / np.float32(255.0) if meta["scale_images"] else x
    head = meta["head"]
    if head == "argmax":
        post = lambda out: out.argmax(axis=-1)[0]
    elif head in ("clip", "unscale"):
        low = np.asarray(space["low"], np.float32)
        high = np.asarray(space["high"], np.float32)
        post = (lambda out: np.clip(out, low, high)[0]) if head == "clip" else \
               (lambda out: (low + (0.5 * (out + 1.0)) * (high - low))[0])
    else:
        raise ValueError(f"head {head} is not played here")
    return pre, post

result = {"machine": platform.machine(), "python": platform.python_version(), "onnxruntime": ort.__version__,
          "numpy": np.__version__, "models": {}, "episodes": {}}
for m in job["models"]:
    s = session(m["onnx"])
    x = np.load(m["states"])
    out = np.concatenate([s.run(None, {"obs": x[i:i + 1]})[0] for i in range(len(x))])
    np.save(m["out"], out)
    row = {"states": len(x)}
    if job.get("time"):
        one = x[:1]
        for _ in range(200):
            s.run(None, {"obs": one})
        times = []
        for _ in range(2000):
            t = time.perf_counter(); s.run(None, {"obs": one}); times.append(time.perf_counter() - t)
        row["b1_us"] = round(1e6 * sorted(times)[len(times) // 2], 1)
    result["models"][m["name"]] = row
for e in job["episodes"]:
    try:
        import gymnasium as gym
        env = gym.make(e["env_id"], **e["env_kwargs"])
    except Exception as exc:
        result["episodes"][e["name"]] = {"error": (f"{type(exc).__name__}: {exc}".splitlines() or [""])[0][:200]}
        continue
    meta = json.load(open(e["sidecar"]))
    pre, post = acts(meta)
    s = session(e["onnx"])
    returns, lengths = [], []
    for seed in e["seeds"]:
        obs, _ = env.reset(seed=seed)
        ret, n, done = 0.0, 0, False
        while not done:
            obs, r, term, trunc, _ = env.step(post(s.run(None, {"obs": pre(obs)})[0]))
            ret += float(r)
            n += 1
            done = term or trunc or n == e["max_steps"]
        returns.append(ret)
        lengths.append(n)
    result["episodes"][e["name"]] = {"returns": returns, "lengths": lengths}
json.dump(result, open(job["result"], "w"))
'''


# ---------------------------------------------------------------------------------------
# setting the emulated aarch64 Python up (idempotent)


def run(cmd: list[str], what: str, **kw: Any) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if done.returncode:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise Missing(f"{what} failed (exit {done.returncode}): {last[0][:300]}")
    return done


def qemu_binary() -> str | None:
    return shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")


def sysroot_ready(work: Path) -> bool:
    return (work / "sysroot" / ".done").exists() and (work / "site" / ".done").exists()


def make_sysroot(work: Path) -> Path:
    root = work / "sysroot"
    if (root / ".done").exists():
        return root
    for tool in ("apt-get", "dpkg", "dpkg-deb"):
        if not shutil.which(tool):
            raise Missing(f"{tool} not found: the arm64 Python comes from Debian's packages (a Debian or Ubuntu host)")
    arches = run(["dpkg", "--print-foreign-architectures"], "dpkg --print-foreign-architectures").stdout.split()
    if "arm64" not in arches:
        raise Missing("apt knows no arm64 packages: as root, run `dpkg --add-architecture arm64 && apt-get update`")
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    print(f"setting up: apt-get download of {len(DEBS)} arm64 packages into {debs}", flush=True)
    run(["apt-get", "download", *(f"{p}:arm64" for p in DEBS)], "apt-get download (arm64 python3.11)", cwd=debs)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for deb in sorted(debs.glob("*_arm64.deb")):
        run(["dpkg-deb", "-x", str(deb), str(root)], f"dpkg-deb -x {deb.name}")
    if not (root / "usr" / "bin" / "python3.11").exists():
        raise Missing(f"no usr/bin/python3.11 in {root} after unpacking {debs}")
    (root / ".done").write_text(" ".join(DEBS))
    return root


def make_site(work: Path) -> Path:
    site = work / "site"
    versions = {name: metadata.version(name) for name in WHEELS}
    want = json.dumps(versions, sort_keys=True)
    if (site / ".done").exists() and (site / ".done").read_text() == want:
        return site
    wheels = work / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    print(f"setting up: pip download of the aarch64 wheels ({', '.join(f'{k} {v}' for k, v in versions.items())})",
          flush=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version",
         "3.11", *platforms, "-d", str(wheels), *(f"{k}=={v}" for k, v in versions.items())],
        "pip download of the aarch64 wheels")
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    for name, version in versions.items():
        stem = name.replace("-", "_").lower()
        found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(f"{stem}-{version}-")]
        if not found:
            raise Missing(f"no aarch64 wheel of {name} {version} in {wheels}")
        with zipfile.ZipFile(found[0]) as whl:
            whl.extractall(site)
    (site / ".done").write_text(want)
    return site


def cpu_view(work: Path, sysroot: Path, cpu: str) -> Path:
    """A sysroot per emulated CPU: links to the real one and an ARM /proc/cpuinfo (qemu
    looks a guest's paths up under -L first), which ONNX Runtime's cpuinfo reads."""
    part, features, _ = CPUS[cpu]
    view = work / f"cpu-{cpu}"
    (view / "proc").mkdir(parents=True, exist_ok=True)
    for name in ("usr", "lib", "etc"):
        link = view / name
        if not link.is_symlink() and (sysroot / name).exists():
            link.symlink_to(os.path.relpath(sysroot / name, view))
    text = "".join(f"processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\n"
                   f"CPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: {part}\nCPU revision\t: 0\n\n"
                   for i in range(os.cpu_count() or 1))
    (view / "proc" / "cpuinfo").write_text(text)
    return view


class Arm:
    """How to start the aarch64 Python: natively, or under qemu with one CPU model."""

    def __init__(self, work: Path, cpu: str) -> None:
        self.cpu = cpu
        self.work = work
        if NATIVE:
            self.prefix, self.site = [sys.executable], ""
            return
        qemu = qemu_binary()
        if qemu is None:
            raise Missing("qemu-aarch64 not found: as root, `apt-get install qemu-user-static` (Debian / Ubuntu)")
        sysroot = make_sysroot(work)
        self.site = str(make_site(work))
        view = cpu_view(work, sysroot, cpu)
        self.prefix = [qemu, "-cpu", cpu, "-L", str(view), str(sysroot / "usr" / "bin" / "python3.11")]

    def run(self, job: dict[str, Any], name: str) -> dict[str, Any]:
        runner = self.work / "arm_runner.py"
        runner.write_text(RUNNER)
        job = {**job, "site": self.site, "result": str(self.work / f"result-{name}.json"), "time": NATIVE}
        path = self.work / f"job-{name}.json"
        path.write_text(json.dumps(job))
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.work), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
        run([*self.prefix, str(runner), str(path)], f"the aarch64 Python ({self.cpu})", env=env)
        return json.loads(Path(job["result"]).read_text())


# ---------------------------------------------------------------------------------------
# the x86 side: exports, the states quarl's evaluation visits, the reference outputs


def export(agent: str, precision: str, work: Path) -> Path:
    """``quarl export`` as a user runs it (reused while the same quarl made it)."""
    import quarl

    out = work / "exports" / agent.replace("/", "-") / precision
    sidecar = out / "policy.json"
    if sidecar.exists():
        meta = json.loads(sidecar.read_text())
        onnx = out / meta["onnx"]
        if (meta["provenance"]["versions"].get("quarl") == quarl.__version__ and onnx.exists()
                and hashlib.sha256(onnx.read_bytes()).hexdigest() == meta["onnx_sha256"]):
            return out
    prec, portable = (precision.removesuffix("-portable"), ["--portable"]) if precision.endswith("-portable") \
        else (precision, [])
    shutil.rmtree(out, ignore_errors=True)
    print(f"exporting {agent} at {precision}", flush=True)
    run([*QUARL, "export", str(ZOO / agent), "--precision", prec, *portable, "--out", str(out)],
        f"quarl export {agent} --precision {precision}")
    return out


def ort_rows(onnx: Path, x: Any) -> Any:
    import numpy as np
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.intra_op_num_threads = o.inter_op_num_threads = 1
    s = ort.InferenceSession(str(onnx), o, providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, {"obs": x[i:i + 1]})[0] for i in range(len(x))])


def record(agent: str, precision: str, folder: Path, work: Path, episodes: int, max_steps: int | None,
           fp32: Any) -> dict[str, Any]:
    """Play the export on x86 as ``quarl ptq`` of its folder does, keep every state it saw,
    and its outputs there (ONNX Runtime, batch 1, as deployed)."""
    import numpy as np

    import quarl
    from quarl.evaluation.episodes import evaluate, protocol

    ckpt = quarl.load(folder)
    spec, policy = protocol(ckpt.policy, ckpt.env_spec)
    res = evaluate(policy, spec, episodes=episodes, seed=0, n_envs=1, max_steps=max_steps,
                   keep_observations=10**7, keep_every=1)
    states = np.ascontiguousarray(res.observations, np.float32)
    run_dir = work / "runs" / agent.replace("/", "-") / precision
    run_dir.mkdir(parents=True, exist_ok=True)
    np.save(run_dir / "states.npy", states)
    meta = json.loads((folder / "policy.json").read_text())
    onnx = folder / meta["onnx"]
    out = ort_rows(onnx, states)
    np.save(run_dir / "x86.npy", out)
    quarl_actions = policy.act_rows(states)  # what quarl's evaluation did at these states
    fp32_path = fp32_arithmetic(onnx, meta)
    if fp32_path is not None:
        np.save(run_dir / "x86-fp32-arithmetic.npy", ort_rows(fp32_path, states))
    return {"agent": agent, "precision": precision, "folder": folder, "run": run_dir, "meta": meta,
            "onnx": onnx, "states": states, "lengths": res.lengths.tolist(), "returns": res.returns.tolist(),
            "policy": policy, "spec": spec, "x86": out,
            "same_as_quarl": bool(np.array_equal(policy.postprocess(out), quarl_actions)),
            "sha_ok": hashlib.sha256(onnx.read_bytes()).hexdigest() == meta["onnx_sha256"],
            "fp32_actions": fp32.act_rows(states), "max_steps": max_steps}


def fp32_arithmetic(onnx: Path, meta: dict[str, Any]) -> Path | None:
    """The same file with MatMulNBits at accuracy_level 0 (fp32 activations): what ONNX
    Runtime computes where level 4 is only a hint (a CPU without its int8 kernel). None for
    a model without MatMulNBits (a --portable file is checked as ONNX Runtime fuses it)."""
    import onnx as onnx_lib
    from onnx import helper

    model = onnx_lib.load(str(onnx))
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    if not nodes:
        return None
    for node in nodes:
        kept = [a for a in node.attribute if a.name != "accuracy_level"]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("accuracy_level", 0)])
    out = onnx.with_name("fp32-arithmetic.onnx")
    onnx_lib.save(model, str(out))
    return out


# ---------------------------------------------------------------------------------------
# comparing


def kernels(meta: dict[str, Any]) -> str:
    """The kernels the model runs, from the sidecar's operators and int mode."""
    ops = {op for names in meta.get("ops", {}).values() for op in names}
    if "MatMulNBits" in ops:
        from quarl.quant.modes import MODES

        int_mode = MODES.get((meta.get("quant") or {}).get("mode", ""))
        rounds = int_mode is not None and int_mode.student is not None and int_mode.student.activations == "int8-block"
        return ("MatMulNBits, activations rounded to int8 per block" if rounds else "MatMulNBits, fp32 activations")
    if "DequantizeLinear" in ops and meta.get("portable"):
        return "DequantizeLinear + MatMul (fused back to MatMulNBits where ORT can)"
    if "MatMulInteger" in ops or "DynamicQuantizeLinear" in ops:
        return "MatMulInteger, activations rounded to uint8 per call"
    if "Cast" in ops and meta.get("precision") == "fp16":
        return "fp16 MatMul / Gemm"
    return "fp32 MatMul / Gemm"


def actions_equal(a: Any, b: Any) -> Any:
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    return np.all(a == b, axis=tuple(range(1, a.ndim))) if a.ndim > 1 else a == b


def why(rec: dict[str, Any], arm: Any, same: Any, diff: float, cpu: str) -> str:
    import numpy as np

    if diff == 0:
        return "same bits"
    what = kernels(rec["meta"])
    alt = rec["run"] / "x86-fp32-arithmetic.npy"
    if alt.exists() and "activations rounded to int8" in what:  # weight-only is fp32 arithmetic already
        gap = float(np.abs(arm.astype(np.float64) - np.load(alt)).max())
        if gap <= 1e-5 * max(1.0, float(np.abs(rec["x86"]).max())):
            return (f"{what} on x86, but ARM ({cpu}) computed MatMulNBits in fp32 (equal to x86 at accuracy_level 0 "
                    f"within {gap:.2g}): level 4 is a hint and this CPU has no int8 kernel for it")
    if rec["meta"].get("precision") == "fp16" and "asimdhp" in CPUS.get(cpu, ("", ""))[1]:
        what += (f" in fp16 arithmetic on ARM ({cpu} has fp16 vector instructions; x86 and cores without them "
                 "widen to fp32)")
    if same.all():
        return f"{what}: outputs differ in the last bits (ARM's NEON kernels sum in another order), same actions"
    x86 = rec["x86"]
    if rec["meta"]["head"] == "argmax":
        top = np.sort(x86.reshape(len(x86), -1), axis=1)
        margin = (top[:, -1] - top[:, -2])[~same]
        return (f"{what}: actions differ where x86's top two outputs are within {margin.max():.3g} of each other "
                f"(a near tie that ARM's rounding flips)")
    return f"{what}: continuous actions differ by up to {diff:.3g}"


def compare(rec: dict[str, Any], arm: Any, cpu: str) -> dict[str, Any]:
    import numpy as np

    policy, x86 = rec["policy"], rec["x86"]
    a_x86, a_arm = policy.postprocess(x86), policy.postprocess(arm)
    same = actions_equal(a_arm, a_x86)
    diff = float(np.abs(arm.astype(np.float64) - x86).max()) if len(x86) else 0.0
    first = None
    start = 0
    for episode, length in enumerate(rec["lengths"]):  # the first step of each recorded episode ARM would leave
        wrong = np.flatnonzero(~same[start:start + length])
        if len(wrong) and first is None:
            first = (episode, int(wrong[0]))
        start += length
    quant = rec["meta"].get("quant") or {}
    fp32 = rec["fp32_actions"]
    continuous = rec["meta"]["head"] in ("clip", "unscale")
    row = {"states": len(x86), "continuous": continuous, "agree_pct": round(100 * float(same.mean()), 2),
           "max_abs_diff": diff, "first_divergence": first,
           "verdict_mode": quant.get("mode", ""), "verdict_agreement": quant.get("agreement"),
           "why": why(rec, arm, same, diff, cpu)}
    # against the fp32 network the verdict judged the mode by: the share of equal actions, or
    # for continuous actions the largest distance from fp32's
    if continuous:
        row["fp32_dist_x86"] = float(np.abs(np.asarray(a_x86, np.float64) - fp32).max())
        row["fp32_dist_arm"] = float(np.abs(np.asarray(a_arm, np.float64) - fp32).max())
    else:
        row["fp32_agree_x86_pct"] = round(100 * float(actions_equal(a_x86, fp32).mean()), 2)
        row["fp32_agree_arm_pct"] = round(100 * float(actions_equal(a_arm, fp32).mean()), 2)
    return row


# ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "quarl-arm64",
                        help="where the sysroot, wheels, exports and results live")
    parser.add_argument("--agents", default=",".join(AGENTS), help="zoo agents, comma separated")
    parser.add_argument("--precisions", default=",".join(PRECISIONS),
                        help="export precisions or modes; NAME-portable exports with --portable")
    parser.add_argument("--cpus", default="cortex-a53,cortex-a76", help=f"emulated CPUs: {', '.join(CPUS)}")
    parser.add_argument("--episodes", type=int, default=3, help="episodes recorded on x86 and played on ARM")
    parser.add_argument("--max-steps", type=int, default=None, help="cut episodes (LunarLander's run to 1000)")
    parser.add_argument("--quick", action="store_true", help="DQN CartPole int8, one CPU, one episode")
    parser.add_argument("--markdown", action="store_true", help="also print the results as a Markdown table")
    args = parser.parse_args()
    work = args.work.expanduser().resolve()
    agents, precisions, cpus = args.agents.split(","), args.precisions.split(","), args.cpus.split(",")
    if args.quick:
        agents, precisions, cpus, args.episodes, args.max_steps = ["dqn/CartPole-v1_1"], ["int8"], cpus[:1], 1, 200
        if not NATIVE:
            if qemu_binary() is None:
                print("skipped: qemu-aarch64 is not installed (as root: apt-get install qemu-user-static)")
                return 0
            if not sysroot_ready(work):
                print(f"skipped: the arm64 Python is not set up in {work} (run this script once without --quick)")
                return 0
        if not (ZOO / agents[0]).exists():
            print(f"skipped: no zoo agent at {ZOO / agents[0]}")
            return 0
    if NATIVE:
        cpus = [platform.processor() or "native"]
    for cpu in cpus:
        if not NATIVE and cpu not in CPUS:
            parser.error(f"--cpus: {cpu!r} is not one of {', '.join(CPUS)}")
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        arms = [Arm(work, cpu) for cpu in cpus]  # set up (and fail) before minutes of exports
        import quarl

        records: list[dict[str, Any]] = []
        for agent in agents:
            if not (ZOO / agent).exists():
                raise Missing(f"no zoo agent at {ZOO / agent}")
            fp32 = quarl.load(ZOO / agent).policy
            for precision in precisions:
                folder = export(agent, precision, work)
                records.append(record(agent, precision, folder, work, args.episodes, args.max_steps, fp32))
        print(f"recorded {sum(len(r['states']) for r in records)} states of {len(records)} exports on x86 "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
        job = {"models": [{"name": f"{r['agent']}:{r['precision']}", "onnx": str(r["onnx"]),
                           "states": str(r["run"] / "states.npy"), "out": ""} for r in records],
               "episodes": [{"name": f"{r['agent']}:{r['precision']}", "onnx": str(r["onnx"]),
                             "sidecar": str(r["folder"] / "policy.json"), "env_id": r["spec"].env_id,
                             "env_kwargs": dict(r["spec"].env_kwargs), "seeds": list(range(args.episodes)),
                             "max_steps": args.max_steps or -1} for r in records
                            if not r["spec"].wrappers and r["spec"].frame_stack == 1]}
        # the runner's own episodes on x86 first: it must replay quarl's evaluation exactly
        x86_job = {**job, "models": []}
        x86 = run_here(work, x86_job)
        reports: list[dict[str, Any]] = []
        for arm in arms:
            for m, r in zip(job["models"], records, strict=True):
                m["out"] = str(r["run"] / f"arm-{arm.cpu}.npy")
            t0 = time.perf_counter()
            got = arm.run(job, arm.cpu)
            print(f"ran {len(records)} exports on aarch64 ({arm.cpu}, {'native' if NATIVE else 'emulated'}: "
                  f"python {got['python']}, onnxruntime {got['onnxruntime']}, numpy {got['numpy']}; "
                  f"{time.perf_counter() - t0:.0f} s)", flush=True)
            reports += report(records, got, x86, arm.cpu, job)
    except Missing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_rows(reports, args.markdown)
    written = work / ("report-quick.json" if args.quick else "report.json")  # a smoke run keeps the full report
    written.write_text(json.dumps(reports, indent=1))
    print(f"wrote {written} ({time.perf_counter() - start:.0f} s)")
    return 0


def run_here(work: Path, job: dict[str, Any]) -> dict[str, Any]:
    runner = work / "arm_runner.py"
    runner.write_text(RUNNER)
    job = {**job, "site": "", "result": str(work / "result-x86.json")}
    (work / "job-x86.json").write_text(json.dumps(job))
    run([sys.executable, str(runner), str(work / "job-x86.json")], "the episode runner on x86")
    return json.loads(Path(job["result"]).read_text())


def report(records: list[dict[str, Any]], got: dict[str, Any], x86: dict[str, Any], cpu: str,
           job: dict[str, Any]) -> list[dict[str, Any]]:
    import numpy as np

    rows = []
    for m, r in zip(job["models"], records, strict=True):
        arm = np.load(m["out"])
        row = {"agent": r["agent"], "precision": r["precision"], "cpu": cpu,
               "kernels": kernels(r["meta"]), **compare(r, arm, cpu),
               "x86_runs_quarls_file": r["sha_ok"] and r["same_as_quarl"]}
        if "b1_us" in got["models"].get(m["name"], {}):
            row["arm_b1_us"] = got["models"][m["name"]]["b1_us"]
        name = m["name"]
        here, there = x86["episodes"].get(name), got["episodes"].get(name)
        quarl_returns = r["returns"]
        if there is None or "error" in there:
            error = (there or {}).get("error", "env has wrappers")
            row["episodes"] = ("not played on ARM (" + ("Box2D not installed" if "Box2D" in error else error) +
                               "): actions compared along the recorded x86 episodes")
        else:
            replay_ok = here is not None and "error" not in here and np.allclose(here["returns"], quarl_returns,
                                                                                 rtol=0, atol=1e-9)
            same = there["returns"] == (here or {}).get("returns") and there["lengths"] == (here or {}).get("lengths")
            gap = max(abs(a - b) for a, b in zip(there["returns"], quarl_returns, strict=True))
            row["arm_returns"] = there["returns"]
            row["episodes"] = (f"{len(there['returns'])} played on ARM: returns "
                               + ("equal to x86's" if same else f"differ from x86's by up to {gap:.3g}")
                               + ("" if replay_ok else " (warning: the runner's x86 episodes are not quarl's)"))
        row["x86_returns"] = [round(v, 2) for v in quarl_returns]
        rows.append(row)
    return rows


def print_rows(rows: list[dict[str, Any]], markdown: bool) -> None:
    for row in rows:
        first = row["first_divergence"]
        print(f"{row['agent']:<22} {row['precision']:<14} {row['cpu']:<11} ARM acts "
              + ("the same" if row["agree_pct"] == 100 else "DIFFERENTLY")
              + f": agree {row['agree_pct']:.2f}% of {row['states']} states, max diff {row['max_abs_diff']:.3g}"
              + (f", first at episode {first[0]} step {first[1]}" if first else "")
              + f"; vs fp32 {fp32_cell(row)}"
              + (f" (verdict: {row['verdict_mode']}, {100 * row['verdict_agreement']:.1f}% on calibration)"
                 if row["verdict_agreement"] is not None else "")
              + (f"; b1 {row['arm_b1_us']} us" if "arm_b1_us" in row else ""))
        print(f"    why: {row['why']}; episodes: {row['episodes']}")
    if markdown:
        print("\n| agent | export | CPU | kernels | ARM = x86 actions | max output diff | first divergence | "
              "vs fp32 (equal actions, or largest distance) | ARM episodes |")
        print("|---|---|---|---|---|---|---|---|---|")
        for row in rows:
            first = row["first_divergence"]
            print(f"| {row['agent']} | {row['precision']}"
                  f"{' (' + row['verdict_mode'] + ')' if row['verdict_mode'] else ''}"
                  f" | {row['cpu']} | {row['kernels']} | {row['agree_pct']:.2f}% of {row['states']} "
                  f"| {row['max_abs_diff']:.3g} | {f'ep {first[0]} step {first[1]}' if first else 'none'} "
                  f"| {fp32_cell(row)} | {row['episodes']} |")


def fp32_cell(row: dict[str, Any]) -> str:
    if row["continuous"]:
        return f"x86 {row['fp32_dist_x86']:.3g} / ARM {row['fp32_dist_arm']:.3g} away"
    return f"x86 {row['fp32_agree_x86_pct']:.1f}% / ARM {row['fp32_agree_arm_pct']:.1f}%"


if __name__ == "__main__":
    sys.exit(main())
