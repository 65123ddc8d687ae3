"""The Python API: what the CLI does, in three calls (and ``recover``, a fourth).

```python
import quarl

agent = quarl.load("../shared/zoo/ppo/LunarLander-v2_1")        # policy + its env
int8 = quarl.quantize(agent.policy, "int8", agent.env_spec)      # mode chosen on calibration seeds
print(int8.meta["quant"]["mode"], quarl.evaluate(int8, agent.env_spec, episodes=20).mean)
```
"""

from __future__ import annotations

from pathlib import Path

from quarl.envs import EnvSpec, check_env_id, make_env
from quarl.evaluation import EvalResult
from quarl.evaluation import evaluate as _evaluate
from quarl.policies.base import Policy
from quarl.policies.sb3 import Checkpoint, load_checkpoint, resolve_env_spec
from quarl.measure import calibration_inputs, calibration_returns
from quarl.quant.precisions import needs_calibration
from quarl.quant.api import quantize as _quantize
from quarl.quant.config import QuantConfig


def load(path: str | Path, env: str | None = None, trust_pickle: bool = False) -> Checkpoint:
    """An SB3 zip, RL Zoo run folder, legacy stable-baselines pickle or exported ONNX
    model; ``checkpoint.env_spec`` is its env (``env`` overrides it, and is needed for a
    bare zip). Raises :class:`quarl.errors.QuarlError` with one line on bad input."""
    if env is not None:
        check_env_id(env)
    checkpoint = load_checkpoint(path, trust_pickle=trust_pickle)
    checkpoint.env_spec = resolve_env_spec(checkpoint, env)
    probe = make_env(checkpoint.env_spec)
    try:
        checkpoint.policy.check_env(probe)
    finally:
        probe.close()
    return checkpoint


def quantize(policy: Policy, precision: str | QuantConfig, env_spec: EnvSpec | str | None = None,
             **options: object) -> Policy:
    """``policy`` at ``precision`` (a label such as ``"int8"``, ``"int4-block"``, ``"sim6"``,
    or a :class:`QuantConfig`). Modes that need calibration (automatic int8 / int4,
    activation ranges) calibrate on ``env_spec`` with the fixed calibration seeds
    (``quarl.measure.CALIBRATION_SEEDS``, which evaluation never uses), exactly as every
    command does, so the same policy gets the same mode here and in ``quarl ptq``."""
    config = precision if isinstance(precision, QuantConfig) else QuantConfig.parse(precision, **options)
    calibration = returns = None
    if needs_calibration(config):
        if env_spec is None:
            from quarl.errors import QuarlError

            raise QuarlError(f"{config.label} calibrates on rollouts: pass the env_spec (or an env id)")
        env_spec = _spec(policy, env_spec)
        calibration = calibration_inputs(policy, env_spec)
        returns = calibration_returns(env_spec)
    return _quantize(policy, config, calibration, returns)


def _spec(policy: Policy, env: EnvSpec | str) -> EnvSpec:
    """An env id taken as the env a bare policy acts in (Atari ids with the zoo's wrappers)."""
    if isinstance(env, EnvSpec):
        return env
    if not isinstance(env, str):
        from quarl.errors import QuarlError

        raise QuarlError(f"env {env!r} is neither an EnvSpec nor a gymnasium env id")
    from quarl.envs import env_spec_for_policy

    return env_spec_for_policy(check_env_id(env), policy.input_shape)


def evaluate(policy: Policy, env_spec: EnvSpec | str, episodes: int = 20, seed: int = 0, n_envs: int = 32,
             max_steps: int | None = None) -> EvalResult:
    """Returns per episode (greedy, or sampled where ``policy.stochastic``); episode i is
    reset with seed ``seed + i`` (see :mod:`quarl.evaluation`). ``env_spec``: an
    :class:`EnvSpec` (``quarl.load(...).env_spec``) or a gymnasium env id."""
    return _evaluate(policy, _spec(policy, env_spec), episodes=episodes, seed=seed, n_envs=n_envs, max_steps=max_steps)


def recover(checkpoint: str | Path, out: str | Path, precision: str = "int4", env: str | None = None,
            episodes: int = 20, trust_pickle: bool = False, **options: object) -> tuple[dict, list[dict]]:
    """``quarl recover``: distil the policy of ``checkpoint`` (an SB3 .zip or RL Zoo run
    folder; ``env`` for a bare zip) onto the real kernel of ``precision`` (``int8``,
    ``int4`` or a mode such as ``int4-block``), write the recovered RL Zoo folder ``out``
    and judge it against the ORIGINAL fp32 policy on ``episodes`` evaluation seeds (0 skips
    the verdict). ``options``: :class:`quarl.recovery.RecoverConfig` fields (``rounds``,
    ``lr``...). Returns (``ENV/recovery.json`` as a dict, the verdict's records)::

        record, records = quarl.recover("../shared/zoo/dqn/CartPole-v1_1", "recovered", "int4")
        print(record["agreement"], [r["mean"] for r in records])
    """
    from quarl.measure import EvalSettings
    from quarl.recovery import RecoverConfig, run_recover

    config = RecoverConfig(precision=precision, **options)  # type: ignore[arg-type]
    checkpoint = load(checkpoint, env, trust_pickle)
    settings = EvalSettings(episodes=episodes) if episodes else None
    return run_recover(Path(checkpoint.path), checkpoint.env_spec, checkpoint.policy, config, Path(out), settings,
                       trust_pickle=trust_pickle)
