"""Issue 46 ("trust"): what a user or a file hands quarl is answered in one line (exit 2 at
the CLI, a QuarlError in the API) naming the value and what is allowed, or does the right
thing: counts read back from recover's files are checked integers in range, training's
class arguments are classes quarl maps, a trusted pickle of the wrong type is one line."""

from __future__ import annotations

import json
import pickle
import re
import shutil
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest
import stable_baselines3 as sb3

import quarl
from quarl.core.errors import QuarlError
from tests.conftest import run_cli

RECOVERY_V1 = Path(__file__).parent / "data" / "recovery_v1" / "folder"


def _one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text[-2000:]
    return lines[0]


def _error_line(stderr: str) -> str:
    """The one error line (a resumed run first notes the --hp it continues with)."""
    errors = [line for line in stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-2000:]
    return errors[0]


# ------------------------------------------------------------------ recover's counts


def _set(record: dict, path: str, value: object) -> None:
    *parents, last = path.split(".")
    for key in parents:
        record = record[int(key) if key.isdigit() else key]
    record[int(last) if last.isdigit() else last] = value


class _RecoveredAgain(Exception):
    pass


def _again(*args: object, **kwargs: object) -> None:
    raise _RecoveredAgain


@pytest.mark.parametrize("field,value,message", [
    ("labelled_states", 1e308, "field labelled_states: Input should be a valid integer (got 1e+308)"),
    ("updates", 10**400, "field updates: Input should be less than or equal to 1000000000000"),
    ("rounds.0.new_states", 10**400, "field rounds.0.new_states: Input should be less than or equal to 1000000000000"),
    ("rounds.1.round", 10**6, "field rounds.1.round: Input should be less than or equal to 1000"),
    ("rounds.0.wall_s", 1e300, "field rounds.0.wall_s: Input should be less than or equal to 1000000000"),
    ("seeds.0", 10**400, "field seeds.0: Input should be less than or equal to 2147483647"),
    ("against_fp32.seeds.1", -5, "field against_fp32.seeds.1: Input should be greater than or equal to 0"),
    ("provenance.cores", 10**400, "field provenance.cores: Input should be less than or equal to 1048576"),
])
def test_a_recovery_json_claiming_an_impossible_count_is_never_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture, field: str,
                                                                      value: object, message: str) -> None:
    """A finished recovery whose recovery.json claims 10**400 states was reused as it was
    (and 1e308 was printed as a count): now loading the folder is one line naming the
    field, and a rerun of recover says so and recovers again instead of reusing it."""
    from quarl.recovery import load_recovered, run_recover, workflow
    from tests.test_recovery_files import CONFIG

    out = tmp_path / "rec"
    shutil.copytree(RECOVERY_V1, out)
    path = out / "CartPole-v1" / "recovery.json"
    record = json.loads(path.read_text())
    _set(record, field, value)
    path.write_text(json.dumps(record, indent=1))
    with pytest.raises(QuarlError) as refused:
        load_recovered(out)
    assert "\n" not in str(refused.value) and message in str(refused.value), refused.value
    checkpoint = tmp_path / "agent.zip"
    shutil.copy(out / "CartPole-v1" / "original.zip", checkpoint)
    agent = quarl.load(checkpoint, env="CartPole-v1")
    assert agent.env_spec is not None
    monkeypatch.setattr(workflow, "recover_stages", _again)
    with caplog.at_level("WARNING"), pytest.raises(_RecoveredAgain):
        run_recover(checkpoint, agent.env_spec, agent.policy, CONFIG, out)
    assert f"{message}" in caplog.text and "recovering again" in caplog.text


def test_the_recovery_json_as_written_is_still_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounds take every value a real recovery writes (the v1 folder is reused)."""
    from quarl.recovery import run_recover, workflow
    from tests.test_recovery_files import CONFIG

    out = tmp_path / "rec"
    shutil.copytree(RECOVERY_V1, out)
    checkpoint = tmp_path / "agent.zip"
    shutil.copy(out / "CartPole-v1" / "original.zip", checkpoint)
    agent = quarl.load(checkpoint, env="CartPole-v1")
    assert agent.env_spec is not None
    monkeypatch.setattr(workflow, "recover_stages", _again)
    record, _ = run_recover(checkpoint, agent.env_spec, agent.policy, CONFIG, out)
    assert record["labelled_states"] == json.loads((out / "CartPole-v1" / "recovery.json").read_text())[
        "labelled_states"]


# ------------------------------------------------------------------ training's class arguments


@pytest.mark.parametrize("kwargs,message", [
    ("dict(activation_fn='os.system')", "--hp policy_kwargs activation_fn='os.system': not an activation quarl maps; "
                                        "allowed nn.ReLU, nn.Tanh, nn.ELU, nn.LeakyReLU, nn.GELU, nn.SiLU"),
    ("dict(activation_fn=SmallCNN)", "activation_fn=<class 'quarl.policies.extractors.SmallCNN'>: not an activation"),
    ("dict(optimizer_class='print')", "--hp policy_kwargs optimizer_class='print': not an optimizer quarl maps; "
                                      "allowed th.optim.Adam, th.optim.RMSprop, RMSpropTFLike"),
    ("dict(features_extractor_class=nn.ReLU)", "features_extractor_class=<class 'torch.nn.modules.activation.ReLU'>: "
                                               "not a features extractor quarl maps; allowed SmallCNN"),
])
def test_a_class_argument_that_is_no_class_quarl_maps_is_one_line(tmp_path: Path, kwargs: str, message: str) -> None:
    """'os.system' reached SB3 as a string and died in a 136-line TypeError traceback."""
    r = run_cli("train", "ppo", "CartPole-v1", "-n", "64", "--out", str(tmp_path), "--hp", f"policy_kwargs={kwargs}")
    assert r.returncode == 2 and message in _one_line(r.stderr)
    assert not list(tmp_path.glob("ppo/*/*.zip"))


def test_a_mapped_activation_still_trains(tmp_path: Path) -> None:
    from quarl.training.sb3_train import TrainConfig, train

    result = train(TrainConfig("ppo", "CartPole-v1", timesteps=64, out=tmp_path, eval_freq=0, tensorboard=False,
                               hyperparams={"n_steps": 64, "batch_size": 64, "n_envs": 1,
                                            "policy_kwargs": "dict(activation_fn=nn.Tanh, net_arch=[8])"}))
    assert result.model is not None
    assert [type(m).__name__ for m in result.model.policy.mlp_extractor.policy_net] == ["Linear", "Tanh"]


def test_a_resumed_runs_settings_naming_no_class_are_one_line_naming_the_file(tmp_path: Path) -> None:
    """The same string in a run's quarl-train.json (what --resume trains with) was the same
    traceback: now one line naming the file."""
    run = tmp_path / "ppo" / "CartPole-v1_1"
    run.mkdir(parents=True)
    model = sb3.PPO("MlpPolicy", gym.make("CartPole-v1"), seed=0, device="cpu", n_steps=64)
    model.num_timesteps = 64
    model.save(run / "rl_model_64_steps.zip")
    (run / "quarl-train.json").write_text(json.dumps({"hyperparams": {"policy_kwargs": {"activation_fn": "os.system"}},
                                                      "timesteps": 128}))
    r = run_cli("train", "ppo", "CartPole-v1", "-n", "128", "--out", str(tmp_path), "--resume")
    assert r.returncode == 2 and _error_line(r.stderr).startswith(
        f"error: {run / 'quarl-train.json'} (the --hp this run started with): --hp policy_kwargs "
        "activation_fn='os.system': not an activation quarl maps"), r.stderr


# ------------------------------------------------------------------ trusted pickles of the wrong type


@pytest.fixture(scope="module")
def normalized_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PPO CartPole run with VecNormalize, checkpointed at 64 and 128 steps (unfinished)."""
    from quarl.training.sb3_train import TrainConfig, train

    out = tmp_path_factory.mktemp("normalized")
    config = TrainConfig("ppo", "CartPole-v1", timesteps=128, out=out, eval_freq=0, checkpoint_freq=64,
                         tensorboard=False, hyperparams={"n_steps": 64, "batch_size": 64, "n_envs": 1,
                                                         "normalize": True, "policy_kwargs": "dict(net_arch=[8])"})
    run = train(config).run_dir
    (run / "CartPole-v1.zip").unlink()  # as if killed after its last checkpoint
    return out


@pytest.mark.parametrize("obj,message", [
    (5, "rl_model_128_steps.vecnormalize.pkl holds a builtins.int, not a VecNormalize"),
    ({"obs_rms": 1}, "rl_model_128_steps.vecnormalize.pkl holds a builtins.dict, not a VecNormalize"),
])
def test_a_trusted_vecnormalize_pickle_of_another_type_is_one_line_on_resume(normalized_run: Path, tmp_path: Path,
                                                                            obj: object, message: str) -> None:
    """--resume --trust-pickle with a vecnormalize.pkl that unpickles to an int was an
    AttributeError traceback: trusted code still gets a one-line error for the wrong type."""
    out = tmp_path / "out"
    shutil.copytree(normalized_run, out)
    run = out / "ppo" / "CartPole-v1_1"
    (run / "rl_model_128_steps.vecnormalize.npz").unlink()
    (run / "rl_model_128_steps.vecnormalize.pkl").write_bytes(pickle.dumps(obj))
    r = run_cli("train", "ppo", "CartPole-v1", "-n", "192", "--out", str(out), "--resume", "--trust-pickle")
    line = _error_line(r.stderr)
    assert r.returncode == 2 and message in line and line.endswith("refused"), r.stderr


def test_a_trusted_vecnormalize_of_another_shape_is_one_line(normalized_run: Path, tmp_path: Path) -> None:
    """A real VecNormalize whose ret_rms was replaced by a number (trusted, so unpickled)."""
    from stable_baselines3.common.running_mean_std import RunningMeanStd
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from quarl.training.sb3_train import TrainConfig, train

    venv = VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")]))
    venv.ret_rms = 3
    venv.venv = None
    out = tmp_path / "out"
    shutil.copytree(normalized_run, out)
    run = out / "ppo" / "CartPole-v1_1"
    (run / "rl_model_128_steps.vecnormalize.npz").unlink()
    (run / "rl_model_128_steps.vecnormalize.pkl").write_bytes(pickle.dumps(venv))
    config = TrainConfig("ppo", "CartPole-v1", timesteps=192, out=out, eval_freq=0, tensorboard=False,
                         trust_pickle=True)
    with pytest.raises(QuarlError, match=r"vecnormalize.pkl: its ret_rms is a int, not running statistics"):
        train(config, resume=True)
    venv.ret_rms = RunningMeanStd(shape=())  # a VecNormalize of the right shape resumes
    (run / "rl_model_128_steps.vecnormalize.pkl").write_bytes(pickle.dumps(venv))
    resumed = train(replace(config, timesteps=192), resume=True)
    assert resumed.resumed_from == 128


def test_a_trusted_replay_pickle_of_another_type_is_one_line(tmp_path: Path) -> None:
    """SB3's own load_replay_buffer asserted the type (an AssertionError traceback)."""
    from quarl.training.sb3_train import TrainConfig, train

    config = TrainConfig("dqn", "CartPole-v1", timesteps=200, out=tmp_path, eval_freq=0, checkpoint_freq=100,
                         tensorboard=False, hyperparams={"learning_starts": 50, "train_freq": 16, "gradient_steps": 1,
                                                         "policy_kwargs": "dict(net_arch=[8])"})
    run = train(config).run_dir
    (run / "CartPole-v1.zip").unlink()
    (run / "rl_model_200_steps.replay.npz").unlink()
    (run / "rl_model_200_steps.replay.pkl").write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(QuarlError, match=r"replay.pkl holds a builtins.list, not a replay buffer "
                                         r"\(stable_baselines3.common.buffers.ReplayBuffer\): refused"):
        train(replace(config, timesteps=300, trust_pickle=True), resume=True)


# ------------------------------------------------------------------ one line missing


def _model_summary(**config: object) -> dict:
    from tests.test_actorq_model import _summary

    summary = _summary("fp32", 1, 500.0, 2.0)
    summary["config"].update(config)
    return summary


@pytest.mark.parametrize("field,value,message", [
    ("samples_per_insert", "abc", "config field samples_per_insert: 'abc' is not a number above 0, at most "
                                  "1,000,000,000: refused"),
    ("samples_per_insert", 0, "config field samples_per_insert: 0 is not a number above 0, at most 1,000,000,000: "
                              "refused"),
    ("samples_per_insert", "nan", "config field samples_per_insert: 'nan' is not a number above 0, at most "
                                  "1,000,000,000: refused"),
    ("actors", "1e400", "config field actors: '1e400' is not a whole number in 1..4,096: refused"),
    ("push_period", -5, "config field push_period: -5 is not a whole number in 1..1,000,000,000,000: refused"),
    ("batch_size", 2.5, "config field batch_size: 2.5 is not a whole number in 1..1,000,000,000: refused"),
])
def test_actorq_model_on_a_run_config_it_cannot_model_is_one_line(tmp_path: Path, field: str, value: object,
                                                                  message: str) -> None:
    """'abc' was a ValueError traceback, 0 a ZeroDivisionError, '1e400' actors an
    OverflowError; 'nan' and -5 modelled nothing and exited 0."""
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(_model_summary(**{field: value})))
    r = run_cli("actorq", "model", str(tmp_path / "runs"), "--actors", "1,2", "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and _one_line(r.stderr) == f"error: {run / 'summary.json'}: {message}"
    assert not (tmp_path / "out" / "model.json").exists()


@pytest.mark.parametrize("atoms,message", [
    ("1000000000", "--n-atoms 1,000,000,000 must be in 2..10,000 (D4PG's is 51)"),
    ("1", "--n-atoms 1 must be in 2..10,000"),  # the projection divided by n_atoms - 1
])
def test_n_atoms_is_bounded_before_a_critic_is_built(tmp_path: Path, atoms: str, message: str) -> None:
    """A billion atoms asked torch for 2 TB (a RuntimeError traceback)."""
    r = run_cli("actorq", "run", "Pendulum-v1", "--algo", "d4pg", "--local", "--n-atoms", atoms, "--policy-layers", "8",
                "--out", str(tmp_path / "aq"))
    assert r.returncode == 2 and message in _one_line(r.stderr)


def test_a_critic_priced_with_its_atoms() -> None:
    from quarl.actorq.config import ActorQConfig

    with pytest.raises(QuarlError, match=r"--critic-layers 20000 with 10,000 outputs: layers \[1, 20000, 10000\] "
                                         r"hold 200050000 parameters"):
        ActorQConfig.flat("Pendulum-v1", "d4pg", critic_layers=(20000,), n_atoms=10_000, local=True)
    assert ActorQConfig.flat("Pendulum-v1", "d4pg", n_atoms=2, local=True).options.n_atoms == 2


HUGE = "9" * 5000


@pytest.mark.parametrize("variable,message", [
    ("QUARL_DECIDE_EPISODES", "QUARL_DECIDE_EPISODES='999999999999999999999999'... (5,000 characters) is out of range: "
                              "allowed 0 (off) to 100,000"),
    ("QUARL_WORKERS", "QUARL_WORKERS='999999999999999999999999'... (5,000 characters) is out of range: allowed 1..256"),
    ("QUARL_MAX_PARAMETERS", "QUARL_MAX_PARAMETERS='999999999999999999999999'... (5,000 characters): more fp32 "
                             "parameters than this machine's"),
])
def test_a_5000_digit_environment_variable_is_one_short_line(tiny_run: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch, variable: str,
                                                             message: str) -> None:
    """Python's int() refuses past 4,300 digits: a ValueError traceback (or, for the
    parameter cap, 'not a whole number' with all 5,000 digits echoed)."""
    monkeypatch.setenv(variable, HUGE)
    r = run_cli("ptq", str(tiny_run), "--precisions", "fp32", "--episodes", "1", "--out", str(tmp_path / "o"))
    line = _one_line(r.stderr)
    assert r.returncode == 2 and message in line and len(line) < 300, line


@pytest.mark.parametrize("value,message", [
    ("10^30", "QUARL_MAX_PARAMETERS='10^30' is not a whole number of parameters"),
    ("1" + "0" * 30, "QUARL_MAX_PARAMETERS='100000000000000000000000'... (31 characters): more fp32 parameters than "
                     "this machine's"),
    ("0", "QUARL_MAX_PARAMETERS=0 must be at least 1"),
])
def test_a_parameter_cap_beyond_the_machine_is_refused(monkeypatch: pytest.MonkeyPatch, value: str,
                                                       message: str) -> None:
    """10^30 let a 10^18-parameter network through to torch's allocator (a RuntimeError)."""
    from quarl.core.limits import machine_memory, max_parameters

    monkeypatch.setenv("QUARL_MAX_PARAMETERS", value)
    with pytest.raises(QuarlError, match=re.escape(message)):
        max_parameters()
    monkeypatch.setenv("QUARL_MAX_PARAMETERS", str(machine_memory() // 4))  # the most this machine holds is taken
    assert max_parameters() == machine_memory() // 4


def test_a_5000_digit_camera_is_one_short_line() -> None:
    from quarl.evaluation.playback import render_kwargs

    with pytest.raises(QuarlError) as refused:
        render_kwargs("HalfCheetah-v4", HUGE)
    assert str(refused.value) == ("--camera='999999999999999999999999'... (5,000 characters) is out of range: allowed "
                                  "a camera id 0..1000 or a name")
    assert render_kwargs("HalfCheetah-v4", "1") == {"camera_id": 1}


@pytest.fixture(scope="module")
def cheetah_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stable_baselines3 import SAC

    path = tmp_path_factory.mktemp("cheetah") / "sac.zip"
    SAC("MlpPolicy", "HalfCheetah-v4", seed=0, device="cpu", buffer_size=100).save(path)
    return path


def test_a_video_size_whose_frames_do_not_fit_is_refused_before_a_frame_is_drawn(cheetah_zip: Path,
                                                                                 tmp_path: Path) -> None:
    """quarl play --video-size 4096x4096 kept every 48 MiB frame of a 1,000-step episode
    (47 GiB) until the episode ended: the size is capped by what an episode holds (frames
    are not streamed), refused before the env renders, from the CLI and the API."""
    from quarl.evaluation.playback import check_frame_memory

    r = run_cli("play", str(cheetah_zip), "--env", "HalfCheetah-v4", "--video", str(tmp_path / "v"), "--video-size",
                "4096x4096")
    assert r.returncode == 2 and _one_line(r.stderr) == (
        "error: --video-size 4096x4096: an episode of up to 1,000 steps holds 1,001 frames of 48.0 MiB (46.9 GiB) "
        "until it ends, more than the 4 GiB allowed: ask a smaller --video-size, or --max-steps 84 or fewer")
    assert not list((tmp_path / "v").glob("*.mp4"))
    with pytest.raises(QuarlError, match="an episode of up to 100 steps holds 101 frames of 48.0 MiB"):
        quarl.play(str(cheetah_zip), "HalfCheetah-v4", episodes=1, video=tmp_path / "api", video_size=(4096, 4096),
                   max_steps=100)
    check_frame_memory("HalfCheetah-v4", (4096, 4096), 84)  # 85 frames of 48 MiB: 4.0 GiB
    check_frame_memory("HalfCheetah-v4", (640, 480), None)  # 1,001 frames of 0.9 MiB


@pytest.mark.parametrize("call,message", [
    (lambda agent, tmp: quarl.evaluate(agent, episodes=2, seed=-5), "--seed -5 is out of range: allowed 0.."),
    (lambda agent, tmp: quarl.evaluate(agent, episodes=2, seed=10_000),
     "evaluation seeds 10000..10001 would reach the calibration seeds 10000..10199"),
    (lambda agent, tmp: quarl.evaluate(agent, episodes=2, max_steps=0), "max steps 0 must be in 1..1,000,000,000"),
    (lambda agent, tmp: quarl.evaluate(agent, episodes=2, n_envs=0), "--n-envs 0 must be in 1..1024"),
    (lambda agent, tmp: quarl.play(agent, episodes=1, seed=-5), "--seed -5 is out of range"),
    (lambda agent, tmp: quarl.play(agent, episodes=1, max_steps=0), "max steps 0 must be in 1..1,000,000,000"),
    (lambda agent, tmp: quarl.play(agent, episodes=1, video="/dev/null"), "video /dev/null is a file: give a folder"),
    (lambda agent, tmp: quarl.play(agent, episodes=1, video=tmp, video_size=(4097, 16)),
     "--video-size '4097x16': each side must be 16..4096 pixels"),
    (lambda agent, tmp: quarl.play(agent, episodes=1, seed=10_150), "would reach the calibration seeds"),
])
def test_the_api_checks_what_the_cli_checks(tiny_run: Path, tmp_path: Path, call, message: str) -> None:
    """quarl.evaluate(seed=-5) was gymnasium's own error, play(video='/dev/null') a
    FileExistsError, and evaluate took the calibration seeds the int mode was chosen on
    (the CLI refuses them): the API runs the CLI's validators."""
    agent = quarl.load(tiny_run)
    with pytest.raises(QuarlError, match=re.escape(message)):
        call(agent, tmp_path / "videos")
    assert quarl.evaluate(agent, episodes=2, seed=10_200).steps > 0  # above the calibration seeds
