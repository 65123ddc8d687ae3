"""``quarl.play`` (the API) and :mod:`quarl.evaluation.playback`: videos from a chosen MuJoCo camera at
a chosen size, progress per episode, and cameras a model lacks refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import quarl
from quarl.core.errors import QuarlError


@pytest.fixture(scope="module")
def cheetah():
    from stable_baselines3 import SAC

    return SAC("MlpPolicy", "HalfCheetah-v4", seed=0, device="cpu")


@pytest.mark.slow  # over 10 s: run with -m slow
def test_a_video_from_a_named_camera_at_a_set_size_with_progress(cheetah, tmp_path: Path) -> None:
    import imageio

    from quarl.evaluation.playback import play

    seen: list[tuple[int, float]] = []
    checkpoint = quarl.load(cheetah)
    result = play(checkpoint.policy, checkpoint.env_spec, episodes=2, video=str(tmp_path / "videos"), camera="track",
                  video_size=(160, 96), max_steps=40, on_episode=lambda i, r: seen.append((i, r)))
    assert [p.name for p in result.videos] == ["episode-episode-0.mp4", "episode-episode-1.mp4"]
    assert sorted(i for i, _ in seen) == [0, 1]
    np.testing.assert_allclose(sorted(r for _, r in seen), sorted(result.result.returns))
    reader = imageio.get_reader(str(result.videos[0]))
    assert tuple(reader.get_meta_data()["size"]) == (160, 96)
    frames = sum(1 for _ in reader)
    assert 40 <= frames <= 42  # the reset frame and one per step
    # the API takes the SB3 model and an env id, and plays the same seeds as evaluate
    api = quarl.play(cheetah, "HalfCheetah-v4", episodes=1, video=tmp_path / "api", camera="0", max_steps=40)
    assert api.result.returns[0] == pytest.approx(result.result.returns[0])
    assert quarl.evaluate(cheetah, "HalfCheetah-v4", episodes=1, max_steps=40).returns[0] == pytest.approx(
        api.result.returns[0])
    assert [p.name for p in api.videos] == ["fp32-episode-0.mp4"]  # named as the CLI names them
    # a path, a camera id as an int, a size as typed on the command line; sampling named apart
    cheetah.save(tmp_path / "sac.zip")
    by_path = quarl.play(str(tmp_path / "sac.zip"), "HalfCheetah-v4", episodes=1, video=tmp_path / "api", camera=0,
                         video_size="160x96", max_steps=40, stochastic=True)
    assert [p.name for p in by_path.videos] == ["fp32-sampled-episode-0.mp4"]
    assert by_path.result.returns[0] != pytest.approx(api.result.returns[0])  # it sampled


@pytest.mark.parametrize("camera, env_id, message", [
    ("0", "InvertedPendulum-v4", "has no camera '0': its cameras are none but the free camera"),
    ("side", "HalfCheetah-v4", r"has no camera 'side': its cameras are 0 \(track\)"),
    ("a b", "HalfCheetah-v4", "neither a camera id"),
    ("0", "CartPole-v1", "set a MuJoCo env's renderer; CartPole-v1 renders its own way"),
])
def test_a_camera_the_env_lacks_is_one_line(camera: str, env_id: str, message: str, tmp_path: Path) -> None:
    """MuJoCo aborts the whole process on a fixed camera id out of range: checked first."""
    from stable_baselines3 import SAC

    from quarl.envs import EnvSpec
    from quarl.evaluation.playback import play

    model = SAC("MlpPolicy", "Pendulum-v1", seed=0, device="cpu") if env_id == "CartPole-v1" else \
        SAC("MlpPolicy", env_id, seed=0, device="cpu")
    policy = quarl.load(model).policy
    with pytest.raises(QuarlError, match=message):
        play(policy, EnvSpec(env_id), episodes=1, video=tmp_path, camera=camera, max_steps=5)


def test_a_video_size_out_of_bounds_and_a_camera_without_a_video_are_refused(cheetah, tmp_path: Path) -> None:
    from quarl.evaluation.playback import play

    checkpoint = quarl.load(cheetah)
    with pytest.raises(QuarlError, match=r"video size 8x8000: each side must be 16..4096"):
        play(checkpoint.policy, checkpoint.env_spec, video=tmp_path, video_size=(8, 8000))
    with pytest.raises(QuarlError, match="needs a video folder"):
        play(checkpoint.policy, checkpoint.env_spec, camera="track")


def test_play_records_from_a_camera_at_a_size_and_refuses_bad_ones_in_one_line(cheetah, tmp_path: Path) -> None:
    """As a user types it: ``quarl play ZIP --video DIR --camera track --video-size 160x96``."""
    import imageio
    from typer.testing import CliRunner

    from quarl.cli import app

    cheetah.save(tmp_path / "sac.zip")
    base = ["play", str(tmp_path / "sac.zip"), "--env", "HalfCheetah-v4", "--episodes", "1", "--max-steps", "30"]
    ok = CliRunner().invoke(app, [*base, "--video", str(tmp_path / "v"), "--camera", "track", "--video-size", "160x96"])
    assert ok.exit_code == 0, ok.output
    assert "fp32 episodes" in ok.output and "1/1" in ok.output  # the progress bar
    assert tuple(imageio.get_reader(str(tmp_path / "v" / "fp32-episode-0.mp4")).get_meta_data()["size"]) == (160, 96)
    for extra, message in [(["--video", str(tmp_path / "v"), "--video-size", "160by96"], "is not WIDTHxHEIGHT"),
                           (["--video", str(tmp_path / "v"), "--video-size", "99999x2"], "each side must be 16..4096"),
                           (["--camera", "track"], "give --video DIR too"),
                           (["--video", str(tmp_path / "v"), "--camera", "9"],
                            "has no camera '9': its cameras are 0 (track)")]:
        bad = CliRunner().invoke(app, [*base, *extra])
        assert bad.exit_code == 2 and message in bad.output, (extra, bad.output)
        assert "Traceback" not in bad.output


def test_a_mujoco_video_follows_the_agent_by_default(cheetah, tmp_path: Path) -> None:
    """The free camera stays where the cheetah started (empty floor from about step 40):
    without --camera the video is recorded from the model's tracking camera, frame for frame
    what --camera track records; a model with no such camera keeps its default view."""
    import imageio

    from quarl.evaluation.playback import following_camera, play

    checkpoint = quarl.load(cheetah)
    default = play(checkpoint.policy, checkpoint.env_spec, episodes=1, video=tmp_path / "default", video_size=(64, 48),
                   max_steps=12)
    chosen = play(checkpoint.policy, checkpoint.env_spec, episodes=1, video=tmp_path / "track", camera="track",
                  video_size=(64, 48), max_steps=12)
    assert default.camera == "track" and chosen.camera == "track"

    def frames(result):
        return np.stack([frame for frame in imageio.get_reader(str(result.videos[0]))]).astype(np.int16)

    assert np.array_equal(frames(default), frames(chosen))
    from quarl.envs import EnvSpec

    assert following_camera(EnvSpec("InvertedPendulum-v4")) is None
    assert following_camera(EnvSpec("CartPole-v1")) is None
    assert play(checkpoint.policy, checkpoint.env_spec, episodes=1, max_steps=5).camera is None  # no video, no camera


def test_a_classic_control_video_prints_nothing_of_sdls_own(tmp_path: Path) -> None:
    """pygame's SDL printed "error: XDG_RUNTIME_DIR is invalid or not set" on a machine
    without a display server, as if quarl had failed."""
    import os

    from stable_baselines3 import PPO

    from tests import forked_cli

    PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, device="cpu").save(tmp_path / "cartpole.zip")
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "SDL_VIDEODRIVER")}
    # a process of its own whose stdout and stderr are what SDL writes to (pygame is loaded there, not before)
    r = forked_cli.run(tmp_path, "play", str(tmp_path / "cartpole.zip"), "--env", "CartPole-v1", "--episodes", "1",
                       "--max-steps", "5", "--video", str(tmp_path / "videos"), env=env)
    assert r.returncode == 0, r.stderr
    assert "XDG_RUNTIME_DIR" not in r.stdout + r.stderr and (tmp_path / "videos" / "fp32-episode-0.mp4").exists()
