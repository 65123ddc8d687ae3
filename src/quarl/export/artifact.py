"""``quarl export``: a policy's acting network as an ONNX file (fp32, fp16 or a real int mode)
with a JSON sidecar describing how to feed it and read its output.

The sidecar holds what a deployment needs besides the network: the observation
normalization (mean, var, clip), whether images are divided by 255, and the action head
(argmax, or the action bounds a [-1, 1] output is scaled to).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from quarl.core import validate
from quarl.core.atomic import write_all_atomic
from quarl.core.errors import QuarlError
from quarl.core.provenance import provenance
from quarl.envs import EnvSpec
from quarl.evaluation.calibration import calibration_inputs, calibration_returns
from quarl.policies.base import Policy
from quarl.policies.onnx_artifact import (
    ARTIFACT_NAME,
    NORMALIZER_FORMULA,
    SIDECAR_FORMAT,
    PortableCheck,
    SidecarJson,
    SidecarRecord,
)
from quarl.quant.backends.onnxruntime import OrtEngine, export_onnx
from quarl.quant.summary import QuantSummary
from quarl.quantization import precisions as registry
from quarl.quantization.api import quantize
from quarl.quantization.choice import Returns
from quarl.quantization.config import QuantConfig, as_config

# ------------------------------------------------------------------ the sidecar OUT.json, as written (JSON objects)


def _space(space: gym.spaces.Space) -> dict[str, object]:
    """A space as :class:`~quarl.policies.onnx_artifact.SpaceRecord` reads it back."""
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "discrete", "n": int(space.n)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "multi_discrete", "nvec": [int(v) for v in np.asarray(space.nvec).ravel()]}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "multi_binary", "n": int(np.prod(space.shape))}
    if not isinstance(space, gym.spaces.Box):
        raise QuarlError(f"an export describes Discrete, MultiDiscrete, MultiBinary and Box spaces, not {space}")
    return {"type": "box", "shape": list(space.shape), "low": _finite(space.low), "high": _finite(space.high)}


def _finite(values: np.ndarray) -> list[float | None]:
    """Bounds as strict JSON: an unbounded side is ``null`` (JSON has no Infinity)."""
    return [float(v) if np.isfinite(v) else None for v in np.asarray(values, np.float64).ravel()]


def sidecar(policy: Policy, precision: str) -> dict[str, object]:
    """How to feed ``policy``'s ONNX model and read its output: the first fields of its
    :class:`~quarl.policies.onnx_artifact.SidecarRecord`."""
    norm = policy.obs_normalizer
    described: dict[str, object] = {
        "format": SIDECAR_FORMAT,
        "algo": policy.algo,
        "precision": precision,
        "input": {"name": "obs", "shape": [None, *policy.input_shape], "dtype": "float32"},
        "observation_space": _space(policy.observation_space),
        "action_space": _space(policy.action_space),
        "head": policy.head,
        "n_quantiles": policy.n_quantiles,
        "scale_images": policy.scale_images,
        "obs_normalizer": None if norm is None else {"mean": np.asarray(norm.mean).tolist(),
                                                     "var": np.asarray(norm.var).tolist(),
                                                     "clip": float(norm.clip), "epsilon": float(norm.epsilon),
                                                     "dtype": "float64", "formula": NORMALIZER_FORMULA},
    }
    if "exploration_rate" in policy.meta:
        described["exploration_rate"] = float(policy.meta["exploration_rate"])
    return described


def onnx_ops(model: bytes) -> dict[str, object]:
    """The operators an ONNX model uses, by domain (``""``: standard ONNX), its opsets, and
    which runtimes run it: a ``com.microsoft`` operator (MatMulNBits, the int4 modes) runs in
    ONNX Runtime only."""
    import onnx

    graph = onnx.load_from_string(model)
    ops: dict[str, list[str]] = {}
    for node in graph.graph.node:
        ops.setdefault(node.domain or "ai.onnx", [])
        if node.op_type not in ops[node.domain or "ai.onnx"]:
            ops[node.domain or "ai.onnx"].append(node.op_type)
    opsets = {o.domain or "ai.onnx": int(o.version) for o in graph.opset_import}
    portable = set(ops) <= {"ai.onnx"}
    return {"ops": {d: sorted(v) for d, v in sorted(ops.items())}, "opsets": opsets,
            "runtimes": "any ONNX runtime with these opsets" if portable else
            "ONNX Runtime (contrib operators: " + ", ".join(sorted(set(ops) - {"ai.onnx"})) + ")"}


class _HalfInside(nn.Module):
    """The network in fp16 between float32 input and output (the sidecar's float32 ``obs``)."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = copy.deepcopy(network).half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x.half()).float()


def fp16_model(policy: Policy) -> bytes:
    """The policy's network with fp16 weights and fp16 arithmetic, float32 at its input and
    output (Cast nodes), checked to load in ONNX Runtime's CPU provider."""
    import onnxruntime as ort

    model = export_onnx(_HalfInside(policy.network), policy.input_shape)
    try:
        ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    except Exception as exc:  # a layer with no fp16 CPU kernel
        raise QuarlError(f"ONNX Runtime's CPU provider cannot run this network in fp16 ({str(exc).splitlines()[0]}): "
                         "export fp32 or an int precision") from None
    return model


def quantized_model(policy: Policy, config: QuantConfig, calibration: np.ndarray | None = None,
                    returns: Returns | None = None) -> tuple[bytes, QuantSummary | None]:
    """The ONNX model of ``policy`` at ``config``'s precision (``fp32``, ``fp16``, or a real int
    one: ``int8``, ``int4``, ``int8-dyn-channel``...) and the int mode's summary (which mode,
    fp32 layers, agreement with fp32 on ``calibration``)."""
    if config.precision == "fp32":  # a QAT policy exports as it acts (n-bit weights, fake-quantized outputs)
        return export_onnx(policy.network, policy.input_shape), None
    if config.precision == "fp16":
        return fp16_model(policy), None
    if not registry.get(config.precision).real_int:
        raise QuarlError(f"export precision {config.label!r} has no ONNX model: allowed fp32, fp16, int8, int4 and "
                         "their modes")
    quantized = quantize(policy, config, calibration=calibration, returns=returns)
    assert isinstance(quantized.engine, OrtEngine)  # every real int mode runs on ONNX Runtime
    return quantized.engine.model, quantized.meta.get("quant")


def export_policy(policy: Policy, precision: str | QuantConfig, out: Path, calibration: np.ndarray | None = None,
                  env_spec: EnvSpec | None = None, returns: Returns | None = None,
                  portable: bool = False) -> SidecarJson:
    """Write ``OUT.onnx`` and ``OUT.json`` of ``policy`` at ``precision`` (a config, or a label
    parsed once with the default options); returns the sidecar with the file sizes. With
    ``env_spec`` the sidecar names the env, and ``quarl ptq OUT.onnx`` evaluates the file.
    ``portable``: MatMulNBits rewritten as standard ONNX (:mod:`quarl.quant.portable`),
    checked against the contrib model on ``calibration`` (recorded under ``portable``)."""
    if policy.stochastic and policy.head in ("clip", "unscale"):
        # the ONNX model gives the mean action; a sidecar saying "sampled" would promise what it cannot do
        raise QuarlError(f"--stochastic: an export holds {policy.algo}'s mean action alone, not its noise: export with "
                         "--deterministic (sampled play is measured on the checkpoint itself)")
    config = as_config(precision)
    model, quant = quantized_model(policy, config, calibration, returns)
    check = None
    if portable:
        from quarl.quant.portable import portable_model

        contrib, model = model, portable_model(model)
        check = _portable_check(contrib, model, calibration, policy)
    # the summary as the JSON object written (write_artifact also takes a recovered kernel's own)
    return write_artifact(policy, config.label, out, model, quant, env_spec, check)


def _portable_check(contrib: bytes, portable: bytes, states: np.ndarray | None,
                    policy: Policy) -> dict[str, PortableCheck]:
    """How the portable model computes against the ONNX Runtime one on ``states``: in fp32
    arithmetic (graph optimizations off, as a runtime without ONNX Runtime's fusion runs
    it) and as ONNX Runtime runs it by default (it fuses DequantizeLinear + MatMul back
    into MatMulNBits): the largest output difference and how often the actions agree."""
    import onnxruntime as ort

    if states is None or not len(states):
        return {}
    x = np.ascontiguousarray(states[:512], np.float32)
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(contrib, providers=["CPUExecutionProvider"]).run(None, {"obs": x})[0]
    out: dict[str, PortableCheck] = {}
    for name, options in (("fp32_arithmetic", plain), ("onnxruntime_default", ort.SessionOptions())):
        got = ort.InferenceSession(portable, options, providers=["CPUExecutionProvider"]).run(None, {"obs": x})[0]
        out[name] = {"max_abs_diff": float(np.abs(got - ref).max()),
                     "action_agreement": float(np.mean(np.all(policy.postprocess(got) == policy.postprocess(ref),
                                                              axis=tuple(range(1, policy.postprocess(got).ndim)))))}
    return out


def write_artifact(policy: Policy, precision: str, out: Path, model: bytes, quant: QuantSummary | None,
                   env_spec: EnvSpec | None = None, portable: dict[str, PortableCheck] | None = None) -> SidecarJson:
    """Write ``model`` (``policy``'s network at ``precision``) as ``OUT.onnx`` with its
    sidecar ``OUT.json``; ``quant``: the int mode's summary as JSON (a
    :class:`~quarl.quant.summary.QuantSummary`'s fields), ``portable``: the check of a
    ``--portable`` model. Returns ``OUT.json`` as written."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx_path = out.with_suffix(".onnx")
    fields: dict[str, object] = {
        **sidecar(policy, precision), "onnx": onnx_path.name, "onnx_bytes": len(model), **onnx_ops(model),
        "onnx_sha256": hashlib.sha256(model).hexdigest(), "env": None if env_spec is None else env_spec.to_json(),
        "policy_sha256": policy.fingerprint(), "provenance": provenance(),
        # how the int mode was judged: a sampling policy on its sampled actions
        # (quarl.quantization.candidates.sampled_agreement)
        "acting": "sampled" if policy.stochastic else "greedy"}
    if portable is not None:
        fields["portable"] = portable
    if quant is not None:
        summary = quant.copy()
        summary.pop("tried", None)
        fields["quant"] = summary
    meta = SidecarRecord.written(**fields)
    # the model and its sidecar together: a full disk never leaves a new model beside an old sidecar
    write_all_atomic([(onnx_path, model), (out.with_suffix(".json"), json.dumps(meta, indent=1, allow_nan=False))])
    return meta


@dataclass(frozen=True)
class Exported:
    onnx: Path
    sidecar: Path
    meta: SidecarJson
    """The sidecar as written."""


def export_checkpoint(policy: Policy, env_spec: EnvSpec, config: QuantConfig, out: Path, max_steps: int | None = None,
                      portable: bool = False) -> Exported:
    """``policy`` at ``config`` (parsed once, by the command) as OUT/policy.onnx and its sidecar
    OUT/policy.json: every precision but fp32 calibrates on the calibration seeds' states
    (episodes cut at ``max_steps``), and an automatic int mode is judged on the calibration
    episodes."""
    validate.count(max_steps, 1, "--max-steps", unset="")
    calibration = None if config.precision == "fp32" else calibration_inputs(policy, env_spec, max_steps)
    returns = calibration_returns(env_spec, max_steps)
    stem = out / ARTIFACT_NAME
    meta = export_policy(policy, config, stem, calibration, env_spec, returns, portable=portable)
    return Exported(stem.with_suffix(".onnx"), stem.with_suffix(".json"), meta)
