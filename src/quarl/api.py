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
from typing import TYPE_CHECKING, Any

import numpy as np

from quarl.checkpoints import load_checkpoint
from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec, check_env_id
from quarl.evaluation.calibration import calibration_inputs, calibration_returns
from quarl.evaluation.episodes import EvalResult
from quarl.evaluation.episodes import evaluate as _evaluate
from quarl.evaluation.playback import Playback
from quarl.policies.base import Policy
from quarl.policies.checkpoint import Checkpoint, checked_env_spec
from quarl.quantization.api import quantize as _quantize
from quarl.quantization.config import QuantConfig
from quarl.quantization.precisions import needs_calibration

if TYPE_CHECKING:
    from quarl.evaluation.record import CellRecord
    from quarl.recovery.report import RecoveryJson


def load(path: str | Path | Any, env: str | None = None, trust_pickle: bool = False) -> Checkpoint:
    """A checkpoint of any format quarl reads (:func:`quarl.checkpoints.describe_formats`
    lists them), or an SB3 / sb3-contrib model object as you hold it after ``PPO.load`` or
    ``model.learn`` (its VecNormalize statistics come with it, and its env id where it holds
    its env: SB3 keeps none in its zip, so a model loaded without one needs ``env``);
    ``checkpoint.env_spec`` is its env (``env`` overrides it, and is needed for a bare zip).
    Raises :class:`quarl.core.errors.QuarlError` with one line on bad input."""
    try:
        return load_checkpoint_and_env(path, env, trust_pickle)
    except QuarlError as exc:  # the CLI's words, said in Python
        if "pass --env ENV_ID" not in str(exc):
            raise
        raise QuarlError(str(exc).replace("pass --env ENV_ID", "pass env=\"ENV_ID\" (a gymnasium id), or load the "
                                          "model with its env (PPO.load(path, env=...))")) from None


def load_checkpoint_and_env(path: str | Path | Any, env: str | None = None, trust_pickle: bool = False) -> Checkpoint:
    """:func:`load` for the CLI: its errors name the CLI's options (``--env``)."""
    if env is not None:
        check_env_id(env)
    if _is_sb3_model(path):
        env = env or _sb3_env_id(path)
        if env is None:
            raise QuarlError(f"this {type(path).__name__} model holds no env (SB3 keeps none in its zip; it knows only "
                             f"its spaces, {_spaces(path)}): name its env, a gymnasium id "
                             "(quarl.load(model, env=\"ENV_ID\"), "
                             f"quarl.evaluate(model, \"ENV_ID\")), or load the model with its env "
                             f"({type(path).__name__}.load(path, env=...))")
        checkpoint = _from_sb3_model(path)
    else:
        if not isinstance(path, (str, Path)):
            raise QuarlError(f"quarl.load takes a path or an SB3 model, not a {type(path).__name__}")
        checkpoint = load_checkpoint(path, trust_pickle=trust_pickle)
    checked_env_spec(checkpoint, env)
    return checkpoint


def quantize(policy: Policy | Checkpoint | Any, precision: str | QuantConfig, env_spec: EnvSpec | str | None = None,
             *, int8_weights: str | None = None, block_size: int | None = None) -> Policy:
    """``policy`` at ``precision`` (a label such as ``"int8"``, ``"int4-block"``, ``"sim6"``,
    or a :class:`QuantConfig`). A label takes ``int8_weights`` and ``block_size`` where given
    (as ``--int8-weights`` / ``--block-size`` do; any other option: pass a :class:`QuantConfig`,
    which carries its own). ``policy``: a quarl :class:`Policy`, what :func:`load`
    returns, or an SB3 model object (the env then comes from the agent unless given). Modes
    that need calibration (automatic int8 / int4, activation ranges) calibrate on
    ``env_spec`` with the fixed calibration seeds (``quarl.evaluation.calibration.CALIBRATION_SEEDS``,
    which evaluation never uses), exactly as every command does, so the same policy gets
    the same mode here and in ``quarl ptq``."""
    policy, env_spec = _policy_and_env(policy, env_spec)
    config = precision if isinstance(precision, QuantConfig) else QuantConfig.parse(
        precision, _options(int8_weights, block_size))
    calibration = returns = None
    if needs_calibration(config):
        if env_spec is None:
            raise QuarlError(NO_ENV.format(what=f"{config.label} calibrates on rollouts: it"))
        env_spec = _spec(policy, env_spec)
        calibration = calibration_inputs(policy, env_spec)
        returns = calibration_returns(env_spec)
    quantized = _quantize(policy, config, calibration, returns)
    if quantized.home_env is None and env_spec is not None:
        quantized.home_env = _spec(policy, env_spec)
    return quantized


def _options(int8_weights: str | None, block_size: int | None) -> QuantConfig:
    """The config a label is parsed onto: the options given, every other field's default."""
    return QuantConfig(int8_weights=QuantConfig.int8_weights if int8_weights is None else int8_weights,
                       block_size=QuantConfig.block_size if block_size is None else block_size)


def _spec(policy: Policy, env: EnvSpec | str) -> EnvSpec:
    """An env id taken as the env a bare policy acts in (Atari ids with the zoo's wrappers)."""
    if isinstance(env, EnvSpec):
        return env
    if not isinstance(env, str):
        raise QuarlError(f"env {env!r} is neither an EnvSpec nor a gymnasium env id")
    from quarl.envs import env_spec_for_policy

    return env_spec_for_policy(check_env_id(env), policy.input_shape)


def evaluate(policy: Policy | Checkpoint | Any, env_spec: EnvSpec | str | None = None, episodes: int = 20,
             seed: int = 0, n_envs: int = 32, max_steps: int | None = None) -> EvalResult:
    """Returns per episode (greedy, or sampled where ``policy.stochastic``); episode i is
    reset with seed ``seed + i`` (see :mod:`quarl.evaluation.episodes`). ``policy`` as
    :func:`quantize` takes it; ``env_spec``: an :class:`EnvSpec` (``quarl.load(...).env_spec``)
    or a gymnasium env id, by default the agent's own."""
    from quarl.core.validate import eval_values
    from quarl.evaluation.cells import EvalSettings

    eval_values(episodes, seed, n_envs)  # what quarl ptq checks: seeds in range, not the calibration's
    EvalSettings(episodes=episodes, seed=seed, n_envs=n_envs, max_steps=max_steps)
    policy, env_spec = _policy_and_env(policy, env_spec)
    if env_spec is None:
        raise QuarlError(NO_ENV.format(what="evaluate"))
    return _evaluate(policy, _spec(policy, env_spec), episodes=episodes, seed=seed, n_envs=n_envs, max_steps=max_steps)


def play(policy: Policy | Checkpoint | Any, env_spec: EnvSpec | str | None = None, episodes: int = 3,
         seed: int = 0, video: str | Path | None = None, camera: str | int | None = None,
         video_size: tuple[int, int] | str | None = None, max_steps: int | None = None,
         stochastic: bool | None = None) -> Playback:
    """``quarl play``: play ``episodes`` episodes (the seeds :func:`evaluate` uses) and, with
    ``video`` (a folder), record each as ``PRECISION-episode-K.mp4``, from ``camera`` (an id
    or a name) at ``video_size`` ((width, height) or ``"640x480"``; MuJoCo). ``policy`` and
    ``env_spec`` as :func:`evaluate` takes them (a quantized policy plays at its precision);
    ``stochastic`` as ``--stochastic`` / ``--deterministic`` (None: the RL Zoo's default)."""
    from quarl.core import validate
    from quarl.evaluation.cells import EvalSettings
    from quarl.evaluation.episodes import protocol
    from quarl.evaluation.playback import file_label
    from quarl.evaluation.playback import play as _play

    validate.eval_values(episodes, seed, 1)  # what quarl play checks, with the same validators
    EvalSettings(episodes=episodes, seed=seed, n_envs=1, max_steps=max_steps)
    if video is not None:
        validate.out_folder(validate.out_option(video), "video")  # a folder: not /dev/null, not a file
    if video_size is None or isinstance(video_size, str):
        size = validate.video_size(video_size)
    elif isinstance(video_size, tuple) and len(video_size) == 2 and all(
            isinstance(side, int) and not isinstance(side, bool) for side in video_size):
        size = validate.video_size(f"{video_size[0]}x{video_size[1]}")  # each side within 16..4096, as the CLI's
    else:
        raise QuarlError(f"video_size {video_size!r:.60} is neither (width, height) nor 'WIDTHxHEIGHT'")
    policy, env_spec = _policy_and_env(policy, env_spec)
    if env_spec is None:
        raise QuarlError(NO_ENV.format(what="play"))
    spec, policy = protocol(policy, _spec(policy, env_spec), stochastic)
    return _play(policy, spec, episodes=episodes, seed=seed, video=video, max_steps=max_steps,
                 camera=None if camera is None else str(camera), video_size=size,
                 name=file_label(policy.precision) + ("-sampled" if policy.stochastic else ""))


def _is_sb3_model(obj: Any) -> bool:
    try:
        from stable_baselines3.common.base_class import BaseAlgorithm
    except ImportError:  # pragma: no cover - SB3 is a dependency
        return False
    return isinstance(obj, BaseAlgorithm)


def _from_sb3_model(model: Any) -> Checkpoint:
    """The policy of an SB3 model object: saved to a temporary zip and read as every
    checkpoint is (nothing unpickled), with its VecNormalize observation statistics."""
    import dataclasses
    import tempfile

    from quarl.policies.base import ObsNormalizer

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.zip"
        model.save(path)
        checkpoint = load_checkpoint(path)
    vec_normalize = model.get_vec_normalize_env()
    if vec_normalize is not None and getattr(vec_normalize, "norm_obs", False):
        rms = vec_normalize.obs_rms
        normalizer = ObsNormalizer(np.asarray(rms.mean, np.float64), np.asarray(rms.var, np.float64),
                                   float(vec_normalize.clip_obs), float(vec_normalize.epsilon))
        checkpoint.policy = dataclasses.replace(checkpoint.policy, obs_normalizer=normalizer,
                                                meta=checkpoint.policy.meta.copy())
    checkpoint.path = Path(f"<{type(model).__name__} object>")
    return checkpoint


def _spaces(model: Any) -> str:
    """``observations Box(4,), actions Discrete(2)``: what an SB3 model without its env knows."""

    def short(space: Any) -> str:
        n = getattr(space, "n", None)
        name = type(space).__name__
        return f"{name}({n})" if n is not None else f"{name}{getattr(space, 'shape', '')}"

    return f"observations {short(model.observation_space)}, actions {short(model.action_space)}"


def _sb3_env_id(model: Any) -> str | None:
    """The gymnasium id of the env an SB3 model holds (None: it holds none)."""
    env = model.get_env()
    if env is None:
        return None
    try:
        spec = env.get_attr("spec", [0])[0]
    except Exception:  # a custom VecEnv without the attribute
        return None
    return getattr(spec, "id", None)


def _policy_and_env(policy: Any, env_spec: EnvSpec | str | None) -> tuple[Policy, EnvSpec | str | None]:
    """A quarl Policy and the env to use from what the caller holds (Policy, Checkpoint,
    SB3 model): an explicit ``env_spec`` wins, else the agent's own (a policy from a zoo
    folder or model object remembers it, through :func:`quantize` too)."""
    if isinstance(policy, Policy):
        home = policy.home_env if isinstance(policy.home_env, EnvSpec) else None
        return policy, env_spec if env_spec is not None else home
    if _is_sb3_model(policy) or isinstance(policy, (str, Path)):  # a model object, or a zip / run folder / export
        named = env_spec if isinstance(env_spec, str) else None
        if named is None and isinstance(env_spec, EnvSpec) and _is_sb3_model(policy) and _sb3_env_id(policy) is None:
            named = env_spec.env_id  # a model loaded without its env, given an EnvSpec: its id names the env
        policy = load(policy, named)
    if isinstance(policy, Checkpoint):
        if policy.env_spec is not None and policy.policy.home_env is None:
            policy.policy.home_env = policy.env_spec
        return policy.policy, env_spec if env_spec is not None else policy.env_spec

    raise QuarlError(f"expected a quarl Policy, what quarl.load returns, an SB3 model or a path, not a "
                     f"{type(policy).__name__}")


NO_ENV = ("{what} needs an env and this policy does not know its own: pass env_spec=\"CartPole-v1\" (a gymnasium "
          "id) or an EnvSpec; an SB3 model knows its env only when loaded with one (PPO.load(path, env=...)), and "
          "quarl.load(path) of a zoo folder keeps it")


def recover(checkpoint: str | Path, out: str | Path, precision: str = "int4", env: str | None = None,
            episodes: int = 20, trust_pickle: bool = False, **options: object) -> tuple[RecoveryJson, list[CellRecord]]:
    """``quarl recover``: distil the policy of ``checkpoint`` (an SB3 .zip or RL Zoo run
    folder; ``env`` for a bare zip) onto the real kernel of ``precision`` (``int8``,
    ``int4`` or a mode such as ``int4-block``), write the recovered RL Zoo folder ``out``
    and judge it against the ORIGINAL fp32 policy on ``episodes`` evaluation seeds (0 skips
    the verdict). ``options``: :class:`quarl.recovery.RecoverConfig` fields (``rounds``,
    ``lr``...). Returns (``ENV/recovery.json`` as a dict, typed
    :class:`~quarl.recovery.report.RecoveryJson`, the verdict's records: a
    :class:`~quarl.evaluation.record.CellRecord` per precision, read by attribute or as the
    row ``results.jsonl`` holds)::

        record, records = quarl.recover("../shared/zoo/dqn/CartPole-v1_1", "recovered", "int4")
        print(record["agreement"], [r.result.mean for r in records])
    """
    from quarl.evaluation.cells import EvalSettings
    from quarl.outputs import apart_from_inputs
    from quarl.recovery import RecoverConfig, run_recover

    apart_from_inputs(Path(out), [checkpoint], "out")  # the recovered folder never overwrites the checkpoint
    config = RecoverConfig(precision=precision, **options)  # type: ignore[arg-type]
    agent = load(checkpoint, env, trust_pickle)
    assert agent.env_spec is not None  # load resolves it, or refuses
    settings = EvalSettings(episodes=episodes) if episodes else None
    return run_recover(Path(agent.path), agent.env_spec, agent.policy, config, Path(out), settings,
                       trust_pickle=trust_pickle)
