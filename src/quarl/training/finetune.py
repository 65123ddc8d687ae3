"""QAT fine-tuning of a trained agent with its own algorithm, on the grid of the real kernel
it will run on: what ``quarl recover --finetune-steps N`` runs where distillation alone does
not keep the reward.

The agent is rebuilt with the RL Zoo's hyperparameters for its algorithm and env (its
architecture from the checkpoint), its saved tensors loaded (``policy.pth`` and SAC's
entropy coefficient, read as plain tensors: nothing is unpickled), its acting layers put
on the student's grid (:class:`quarl.quant.student.StudentLinear`, wrapping the same
parameters, so SB3's optimizers and target updates see the same tensors) and trained for
``steps`` env steps at a tenth of the zoo's learning rate. An off-policy agent first
refills its replay buffer with its own episodes (its final exploration, no updates) so
the first updates are not made on an empty or random buffer. Observation normalization is
the checkpoint's, frozen."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import VecEnv, VecNormalize
from torch import nn

from quarl.core.errors import QuarlError
from quarl.core.limits import load_torch, open_zip, read_zip_entry, torch_file_cap
from quarl.envs import EnvSpec
from quarl.policies.base import Policy
from quarl.quant.layers import linear_layers
from quarl.quant.student import KernelSpec, StudentLinear, layer_bits, make_student, sb3_tensors
from quarl.training.guard import NonFiniteGuard, NonFiniteTraining, raise_if_non_finite
from quarl.training.hp_checks import check_net_arch
from quarl.training.hyperparams import TRAINERS, SB3Kwargs
from quarl.training.periodic_saves import check_algorithm, read_checkpoint_data
from quarl.training.train_setup import TrainSetup, prepare
from quarl.training.vec_env import training_vec_env

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

log = logging.getLogger(__name__)

LR_FACTOR = 0.1
"""Fine-tuning runs at this share of the zoo's (initial) learning rate."""
REFILL_STEPS = 5_000
"""Env steps an off-policy agent plays with its own policy before its first update."""
OFF_POLICY = ("dqn", "qrdqn", "sac", "td3", "ddpg", "tqc", "crossq")


def _read_tensors(zip_path: Path, entry: str) -> dict[str, object] | None:
    """The tensors by name of the zip's ``entry`` (``torch.load(weights_only=True)``: nothing
    unpickled), None where the zip has no such entry."""
    with open_zip(zip_path, "a Stable-Baselines3 checkpoint") as archive:
        if entry not in archive.namelist():
            return None
        raw = read_zip_entry(archive, entry, str(zip_path))
    loaded = load_torch(raw, torch_file_cap(), "an SB3 checkpoint's tensors", f"{zip_path}:{entry}")
    if not isinstance(loaded, dict):
        raise QuarlError(f"{zip_path}:{entry}: a {type(loaded).__name__}, not tensors by name: refused")
    return loaded


def _data_policy_kwargs(zip_path: Path, policy: Policy) -> SB3Kwargs:
    """The architecture the checkpoint was built with: its plain policy_kwargs (net_arch,
    n_quantiles, log_std_init, use_sde...) and the activation the loaded network uses; the
    zip must be one of ``policy.algo``'s (an A2C zip in a ppo folder fine-tuned as PPO)."""
    from quarl.policies.sb3 import ACTIVATIONS

    _, data = read_checkpoint_data(zip_path, "a Stable-Baselines3 checkpoint")
    check_algorithm(zip_path, data, policy.algo, "fine-tune")
    policy_kwargs = data.get("policy_kwargs") or {}
    if not isinstance(policy_kwargs, dict):
        raise QuarlError(f"{zip_path}:data: field policy_kwargs: a {type(policy_kwargs).__name__}, not a mapping: "
                         "refused")

    def plain(v: Any) -> bool:
        if isinstance(v, dict):
            return all(isinstance(k, str) and plain(x) for k, x in v.items())
        if isinstance(v, list):
            return all(plain(x) for x in v)
        return isinstance(v, (int, float, str, bool))

    kwargs: SB3Kwargs = {k: v for k, v in policy_kwargs.items()
                         if not k.startswith(":") and plain(v) and not k.endswith("_class")}
    # the MLP's activation: the first one after the first Linear layer (a CNN's own are ReLU)
    modules = list(policy.network.modules())[1:]
    first = next((i for i, m in enumerate(modules) if isinstance(m, nn.Linear)), None)
    if first is not None:
        kwargs["activation_fn"] = next((type(m) for m in modules[first + 1:] if type(m) in ACTIVATIONS.values()),
                                       nn.ReLU)
    return kwargs


def _wrap(sb3_policy: nn.Module, policy: Policy, spec: KernelSpec) -> list[tuple[str, StudentLinear]]:
    """Put the acting layers of ``sb3_policy`` (found by the SB3 names the loader gave
    quarl's network) on the student's grid, in place."""
    wrapped = []
    layers = linear_layers(policy.network)
    for i, (_, layer) in enumerate(layers):
        if not isinstance(layer, nn.Linear) or i in spec.keep:
            continue
        name = getattr(layer, "sb3_name", None)
        if name is None:
            raise QuarlError("this policy's layers carry no SB3 names: it cannot be fine-tuned with its algorithm")
        parent, _, attr = name.rpartition(".")
        owner = sb3_policy.get_submodule(parent) if parent else sb3_policy
        target = getattr(owner, attr)
        if not isinstance(target, nn.Linear):
            raise QuarlError(f"{name} of the SB3 policy is a {type(target).__name__}, not the Linear layer quarl "
                             "loaded")
        student = StudentLinear(target, spec, layer_bits(spec, i, len(layers)))
        setattr(owner, attr, student)
        wrapped.append((name, student))
    return wrapped


def _unwrap(sb3_policy: nn.Module, wrapped: list[tuple[str, StudentLinear]]) -> None:
    for name, student in wrapped:
        parent, _, attr = name.rpartition(".")
        setattr(sb3_policy.get_submodule(parent) if parent else sb3_policy, attr, student.layer)


def _set_lr(model: BaseAlgorithm, lr: float) -> None:
    from stable_baselines3.common.utils import update_learning_rate

    model.learning_rate = lr
    model.lr_schedule = lambda _: lr
    optimizers = [getattr(model.policy, "optimizer", None), getattr(getattr(model, "actor", None), "optimizer", None),
                  getattr(getattr(model, "critic", None), "optimizer", None)]
    for optimizer in optimizers:
        if optimizer is not None:
            update_learning_rate(optimizer, lr)


class _Report(BaseCallback):
    """Hands ``progress`` the env steps done, every 1,000."""

    def __init__(self, progress: Callable[[int], None] | None) -> None:
        super().__init__()
        self.progress = progress

    def _on_step(self) -> bool:
        if self.progress is not None and self.num_timesteps % 1000 == 0:
            self.progress(self.num_timesteps)
        return True


def _check_rewards(algo: str, env_id: str, setup: TrainSetup) -> None:
    """Refuse an on-policy agent trained on normalized rewards (their statistics are not read)."""
    if setup.normalize is not None and setup.normalize.get("norm_reward", True) and algo not in OFF_POLICY:
        raise QuarlError(f"{algo} {env_id} was trained on normalized rewards, whose statistics quarl does not "
                         "read: fine-tune it with the RL Zoo, or recover it by distillation alone")


def _model_kwargs(zip_path: Path, policy: Policy, setup: TrainSetup) -> tuple[SB3Kwargs, SB3Kwargs]:
    """(the algorithm's kwargs, its policy's kwargs): the zoo's, with the architecture the
    checkpoint was built with, priced before anything is built."""
    kwargs = dict(setup.model_kwargs)
    algo_cls = TRAINERS[policy.algo].algo_class()
    accepted = inspect.signature(algo_cls.policy_aliases[setup.policy].__init__).parameters
    policy_kwargs = {**(kwargs.pop("policy_kwargs", None) or {}),
                     **{k: v for k, v in _data_policy_kwargs(zip_path, policy).items() if k in accepted}}
    check_net_arch(policy_kwargs, f"{zip_path}'s policy_kwargs")  # a crafted data entry never sizes the build
    kwargs.pop("learning_starts", None)
    if "use_sde" in policy_kwargs:  # gSDE is the algorithm's option (SB3 hands it to the policy)
        kwargs["use_sde"] = bool(policy_kwargs.pop("use_sde"))
    # updates from the first step (the buffer is refilled first); PPO / A2C have no such option
    if policy.algo in OFF_POLICY:
        kwargs["learning_starts"] = 0
    return kwargs, policy_kwargs


def _env(setup: TrainSetup, policy: Policy, seed: int) -> VecEnv:
    """The training envs, normalized (where the zoo normalizes) with the checkpoint's
    statistics, frozen."""
    env = training_vec_env(setup, setup.n_envs, seed, training=True)
    if isinstance(env, VecNormalize):
        rms = env.obs_rms
        if policy.obs_normalizer is None or not isinstance(rms, RunningMeanStd):
            env.close()
            raise QuarlError("the RL Zoo normalizes this env's observations but the checkpoint holds no statistics")
        rms.mean = np.asarray(policy.obs_normalizer.mean, np.float64)
        rms.var = np.asarray(policy.obs_normalizer.var, np.float64)
        env.training, env.norm_reward = False, False
    return env


def _load_agent(model: BaseAlgorithm, zip_path: Path, policy: Policy, env_spec: EnvSpec, start: nn.Module | None
                ) -> None:
    """The checkpoint's tensors into ``model`` (read as plain tensors), then ``start``'s
    acting weights where given."""
    state = _read_tensors(zip_path, "policy.pth")
    if state is None:
        raise QuarlError(f"{zip_path} has no policy.pth: not a Stable-Baselines3 checkpoint, nothing to fine-tune")
    try:
        model.policy.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        detail = " ".join(line.strip() for line in str(exc).splitlines()[1:3])[:300]
        raise QuarlError(f"{zip_path}'s network is not what the RL Zoo's {policy.algo} {env_spec.env_id} "
                         f"hyperparameters build ({detail}): fine-tuning needs the zoo's architecture") from None
    variables = _read_tensors(zip_path, "pytorch_variables.pth") or {}
    for name, value in variables.items():  # SAC / TQC's entropy coefficient
        if isinstance(value, torch.Tensor) and isinstance(getattr(model, name, None), torch.Tensor):
            getattr(model, name).data.copy_(value)
    if start is not None:  # the distilled student's acting weights
        named = sb3_tensors(policy.network, start, on_grid=False)
        own = model.policy.state_dict()
        own.update({k: v for k, v in named.items() if k in own})
        model.policy.load_state_dict(own)


def _tuning_settings(model: BaseAlgorithm, setup: TrainSetup, lr_factor: float) -> None:
    """``lr_factor`` of the zoo's (initial) learning rate; DQN's exploration at its final rate."""
    rate = setup.model_kwargs.get("learning_rate", 3e-4)
    _set_lr(model, lr_factor * float(rate(1.0) if callable(rate) else rate))
    if hasattr(model, "exploration_schedule"):  # DQN, QR-DQN: act at the final exploration, not from 1.0 again
        final = float(getattr(model, "exploration_final_eps", 0.05))
        setattr(model, "exploration_schedule", lambda _: final)  # no SB3 base class declares it
        setattr(model, "exploration_rate", final)


def _learn(model: BaseAlgorithm, algo: str, zip_path: Path, steps: int, progress: Callable[[int], None] | None
           ) -> None:
    """``steps`` env steps of the algorithm's own updates; an off-policy agent first refills
    its buffer with its own play (no updates). A NaN or inf ends it in one line."""
    try:
        try:
            if algo in OFF_POLICY and isinstance(model, OffPolicyAlgorithm):
                gradient_steps = model.gradient_steps
                model.gradient_steps = 0
                model.learn(min(REFILL_STEPS, getattr(model, "buffer_size", REFILL_STEPS)),
                            callback=NonFiniteGuard([_Report(progress)]))
                model.gradient_steps = gradient_steps
                model.learn(steps, callback=NonFiniteGuard([_Report(progress)]), reset_num_timesteps=False)
            else:
                model.learn(steps, callback=NonFiniteGuard([_Report(progress)]))
        except (ValueError, RuntimeError) as exc:  # torch's argument checks on NaN logits, inside SB3's train()
            raise_if_non_finite(model, exc)
            raise
    except NonFiniteTraining as exc:
        raise QuarlError(f"fine-tuning {zip_path}: {exc}; nothing of it is kept") from None


def _student(model: BaseAlgorithm, policy: Policy, spec: KernelSpec) -> nn.Module:
    """A student on ``spec``'s grid holding the fine-tuned acting weights."""
    student = make_student(policy.network, spec)
    tuned = model.policy.state_dict()
    with torch.no_grad():
        for (_, mine) in linear_layers(student):
            name = getattr(mine, "sb3_name", None)
            if name is None or f"{name}.weight" not in tuned:
                continue
            mine.weight.copy_(tuned[f"{name}.weight"].reshape(mine.weight.shape))
            if mine.bias is not None:
                mine.bias.copy_(tuned[f"{name}.bias"].reshape(mine.bias.shape))
    return student


def finetune(zip_path: Path, policy: Policy, env_spec: EnvSpec, spec: KernelSpec, start: nn.Module | None,
             steps: int, seed: int = 0, lr_factor: float = LR_FACTOR,
             progress: Callable[[int], None] | None = None) -> nn.Module:
    """A student (see :func:`quarl.quant.student.make_student`) fine-tuned from the agent
    of ``zip_path`` with its own algorithm for ``steps`` env steps; ``start``: a student
    whose weights the acting network starts from (the distilled one), else the checkpoint's."""
    algo = policy.algo
    if algo not in TRAINERS:
        raise QuarlError(f"fine-tuning needs an algorithm quarl trains ({', '.join(TRAINERS)}), not {algo!r}")
    if steps < 1 or steps > 100_000_000:
        raise QuarlError(f"fine-tuning steps {steps} must be in 1..100,000,000")
    setup = prepare(algo, env_spec.env_id, policy.action_space)
    _check_rewards(algo, env_spec.env_id, setup)
    kwargs, policy_kwargs = _model_kwargs(zip_path, policy, setup)
    torch.manual_seed(seed)
    env = _env(setup, policy, seed)
    model = TRAINERS[algo].algo_class()(setup.policy, env, seed=seed, verbose=0, device="cpu",
                                        policy_kwargs=policy_kwargs, **kwargs)
    _load_agent(model, zip_path, policy, env_spec, start)
    _tuning_settings(model, setup, lr_factor)
    wrapped = _wrap(model.policy, policy, spec)
    try:
        _learn(model, algo, zip_path, steps, progress)
    finally:
        _unwrap(model.policy, wrapped)
        env.close()
    return _student(model, policy, spec)
