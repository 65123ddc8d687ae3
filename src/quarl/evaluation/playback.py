"""Watch a policy play: ``quarl play POLICY --precision int8 --video DIR``.

Episodes are played by :func:`quarl.evaluation.episodes.evaluate` on one env, so episode ``i``
meets seed ``seed + i`` and scores exactly what ``quarl ptq`` scores for it. With a video
folder, gymnasium's ``RecordVideo`` sits on the bare env (before the RL Zoo's wrappers), so
a video is a whole game as a person sees it, not the agent's cropped grey frames; it needs
no display (frames are rendered off screen, ``MUJOCO_GL=egl`` for MuJoCo).
"""

from __future__ import annotations

import dataclasses
import errno
import gc
import os
import re
import signal
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypedDict

import gymnasium as gym
import numpy as np

from quarl.core.atomic import write_atomic
from quarl.core.errors import QuarlError
from quarl.core.table import Row
from quarl.envs import EnvSpec, make_env
from quarl.evaluation.episodes import EvalResult, evaluate
from quarl.policies.base import Policy


@dataclasses.dataclass
class Playback:
    result: EvalResult
    videos: list[Path]
    """One .mp4 per episode, in episode order (empty without a video folder)."""
    camera: str | None = None
    """The MuJoCo camera the videos were recorded from (None: the env's default view)."""


FOLLOWING_CAMERAS = ("track",)
"""Camera names of gymnasium's MuJoCo models that follow the agent (HalfCheetah, Hopper,
Walker2d, Ant, Humanoid...): recorded from by default, since the free camera stays where
the agent started and loses a runner within a few dozen steps."""


def _is_mujoco(env_id: str) -> bool:
    try:
        entry = gym.spec(env_id)
    except gym.error.Error:
        return False
    return "mujoco" in str(getattr(entry, "entry_point", ""))


def following_camera(env_spec: EnvSpec) -> str | None:
    """The MuJoCo model's camera that follows the agent (:data:`FOLLOWING_CAMERAS`), if it has one."""
    if not _is_mujoco(env_spec.env_id):
        return None
    import mujoco

    probe = gym.make(env_spec.env_id, **env_spec.env_kwargs)
    try:
        model = getattr(probe.unwrapped, "model", None)
        if model is None:
            return None
        names = {mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)}
    finally:
        probe.close()
    return next((name for name in FOLLOWING_CAMERAS if name in names), None)


def _recorder(folder: Path, prefix: str) -> Callable[[gym.Env], gym.Env]:
    def wrap(env: gym.Env) -> gym.Env:
        with warnings.catch_warnings():  # "overwriting existing videos": play removed its old ones itself
            warnings.simplefilter("ignore", UserWarning)
            return WholeVideos(env, str(folder), episode_trigger=lambda _: True, name_prefix=prefix,
                               disable_logger=True)

    return wrap


class WholeVideos(gym.wrappers.RecordVideo):
    """gymnasium's ``RecordVideo`` whose files are whole or absent: each episode's frames are
    encoded into a temporary beside the video and renamed over it
    (:func:`quarl.core.atomic.write_atomic`), and ffmpeg's exit status is read
    (:func:`encode_video`). moviepy ignores it: under a file-size limit or on a full disk
    RecordVideo left a cut mp4 and play said it wrote it."""

    def stop_recording(self) -> None:
        frames, name = [np.asarray(frame) for frame in self.recorded_frames], self._video_name  # rgb_array frames
        self.recorded_frames, self.recording, self._video_name = [], False, None  # close() does not write it again
        if frames:
            fps = self.frames_per_sec
            write_atomic(Path(self.video_folder) / f"{name}.mp4", lambda tmp: encode_video(frames, fps, tmp))
        if self.gc_trigger and self.gc_trigger(self.episode_id):
            gc.collect()


def encode_video(frames: Sequence[np.ndarray], fps: float, path: Path) -> None:
    """``frames`` (RGB, one size) as an H.264 mp4 at ``path``, as RecordVideo's moviepy writes
    it (its ffmpeg writer and options); ffmpeg failing (it exits non-zero where a write
    failed: EFBIG, ENOSPC) is an OSError carrying its reason."""
    import tempfile

    from moviepy.video.io.ffmpeg_writer import FFMPEG_VideoWriter

    height, width = frames[0].shape[:2]
    with tempfile.TemporaryFile("w+") as log:  # ffmpeg's messages: a pipe nobody reads could fill and stall it
        writer = FFMPEG_VideoWriter(str(path), (width, height), fps, logfile=log)
        process = writer.proc
        try:
            for frame in frames:
                writer.write_frame(np.ascontiguousarray(frame, np.uint8))
        except OSError:  # ffmpeg stopped reading: its reason is in its log, read below
            pass
        finally:
            writer.close()
        if process.returncode == 0:
            return
        log.seek(0)
        lines = [line.strip() for line in log.read()[-4096:].splitlines() if line.strip()]
    # subprocess sets SIGXFSZ back to its default in ffmpeg: killed at the limit
    if process.returncode == -signal.SIGXFSZ:
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    for code, said in ((errno.EFBIG, "File too large"), (errno.ENOSPC, "No space left"), (errno.EDQUOT, "quota")):
        if any(said in line for line in lines):
            raise OSError(code, os.strerror(code))
    raise OSError(errno.EIO, f"ffmpeg exited with status {process.returncode}"
                  + (f": {lines[-1][:160]}" if lines else ""))


MAX_VIDEO_SIDE = 4096
"""A video frame's width or height at most (pixels)."""
MAX_CAMERAS = 1000
"""A camera id at most (a MuJoCo model has a few; an id past its cameras is refused by name)."""
VIDEO_FRAMES_CAP = 4 * 2**30
"""Bytes of RGB frames one recorded episode may hold: gymnasium's RecordVideo keeps every
frame of an episode until it ends and is encoded (4096 x 4096 frames are 48 MiB each: a
1,000-step episode took 48 GiB)."""


def check_frame_memory(env_id: str, size: tuple[int, int] | None, max_steps: int | None) -> None:
    """Refuse, before any env renders, a ``--video-size`` whose frames for one episode (its
    ``max_steps``, else the env's time limit) would not fit :data:`VIDEO_FRAMES_CAP`: the
    size is capped by what an episode holds, frames are not streamed."""
    if size is None:
        return
    width, height = size
    frame = width * height * 3
    try:
        limit = gym.spec(env_id).max_episode_steps
    except gym.error.Error:
        limit = None
    steps = max_steps if max_steps is not None else limit
    fit = VIDEO_FRAMES_CAP // frame - 1  # the frame of the reset is kept too
    if steps is None:
        raise QuarlError(f"--video-size {width}x{height}: {env_id} has no time limit and every frame of an episode is "
                         f"held until it ends: give --max-steps (at most {fit:,} frames of {frame / 2**20:.1f} MiB fit "
                         f"the {VIDEO_FRAMES_CAP / 2**30:g} GiB allowed)")
    if (steps + 1) * frame > VIDEO_FRAMES_CAP:
        raise QuarlError(f"--video-size {width}x{height}: an episode of up to {steps:,} steps holds "
                         f"{steps + 1:,} frames of {frame / 2**20:.1f} MiB ({(steps + 1) * frame / 2**30:.1f} GiB) "
                         "until it ends, more than "
                         f"the {VIDEO_FRAMES_CAP / 2**30:g} GiB allowed: ask a smaller --video-size, or --max-steps "
                         f"{fit:,} or fewer")


class RenderKwargs(TypedDict, total=False):
    """The env kwargs of a MuJoCo env's renderer (:func:`render_kwargs`)."""

    camera_id: int
    camera_name: str
    width: int
    height: int


def render_kwargs(env_id: str, camera: str | None = None, size: tuple[int, int] | None = None) -> RenderKwargs:
    """The env kwargs that set a MuJoCo env's camera (a camera id such as ``"0"`` or a name
    such as ``"track"``, as gymnasium's MuJoCo envs take them) and its frame size (width,
    height); other envs take neither, and asking is refused in one line."""
    out: RenderKwargs = {}
    if camera is None and size is None:
        return out
    try:
        entry = gym.spec(env_id)
    except gym.error.Error:
        entry = None
    entry_point = str(getattr(entry, "entry_point", ""))
    if "mujoco" not in entry_point:
        raise QuarlError(f"--camera and --video-size set a MuJoCo env's renderer; {env_id} renders its own way")
    if camera is not None:
        camera = camera.strip()
        if camera.isascii() and camera.isdigit():
            from quarl.core.validate import whole

            out["camera_id"] = whole(camera, "--camera", 0, MAX_CAMERAS, f"a camera id 0..{MAX_CAMERAS} or a name")
        elif camera.isidentifier():
            out["camera_name"] = camera
        else:
            raise QuarlError(f"camera {camera!r} is neither a camera id (0, 1, ...) nor a camera name (e.g. track)")
    if size is not None:
        width, height = size
        if not (16 <= width <= MAX_VIDEO_SIDE and 16 <= height <= MAX_VIDEO_SIDE):
            raise QuarlError(f"video size {width}x{height}: each side must be 16..{MAX_VIDEO_SIDE} pixels")
        out["width"], out["height"] = int(width), int(height)
    return out


def _check_camera(env: gym.Env, env_id: str, camera: str) -> None:
    """A camera the model has (MuJoCo aborts the process on a fixed camera id out of range)."""
    import mujoco

    model = getattr(env.unwrapped, "model", None)
    if model is None:
        return
    names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) or str(i) for i in range(model.ncam)]
    if camera.strip() not in names and camera.strip() not in [str(i) for i in range(model.ncam)]:
        env.close()
        have = ", ".join(f"{i} ({n})" for i, n in enumerate(names)) or "none but the free camera (leave --camera out)"
        raise QuarlError(f"{env_id} has no camera {camera!r}: its cameras are {have}")


def play(policy: Policy, env_spec: EnvSpec, episodes: int = 3, seed: int = 0, video: str | Path | None = None,
         max_steps: int | None = None, name: str = "episode", camera: str | None = None,
         video_size: tuple[int, int] | None = None,
         on_episode: Callable[[int, float], None] | None = None) -> Playback:
    """Play ``episodes`` deterministic episodes on one env; with ``video`` (a folder), record
    each one as ``VIDEO/NAME-episode-K.mp4``, from ``camera`` at ``video_size`` (MuJoCo,
    see :func:`render_kwargs`; no camera given: the one following the agent where the model
    has one, :func:`following_camera`). ``on_episode(index, return)`` is called as each one ends
    (a progress bar: recording a long MuJoCo episode takes seconds)."""
    video = Path(video) if video is not None else None
    if video is not None and camera is None:
        camera = following_camera(env_spec)
    extra = render_kwargs(env_spec.env_id, camera, video_size)
    check_frame_memory(env_spec.env_id, video_size, max_steps)
    if video is None:
        if extra:
            raise QuarlError("a camera or video size needs a video folder to record into")
        env = make_env(env_spec)
    else:
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # pygame (classic control) asks for a sound device
        # frames are drawn off screen: without a display server SDL would print "error: XDG_RUNTIME_DIR is
        # invalid" as if it were quarl's
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        video.mkdir(parents=True, exist_ok=True)
        for old in video.glob(f"{name}-episode-*.mp4"):  # a replay replaces, never mixes with, an old one
            old.unlink()
        spec = dataclasses.replace(env_spec, env_kwargs={**env_spec.env_kwargs, "render_mode": "rgb_array", **extra})
        try:
            env = make_env(spec, on_made=_recorder(video, name))
        except QuarlError as exc:
            raise QuarlError(f"{env_spec.env_id} cannot render frames for a video: {exc}") from None
        except (ValueError, KeyError) as exc:  # MuJoCo: an unknown camera name or id
            raise QuarlError(f"{env_spec.env_id} cannot record from camera {camera!r}: "
                             f"{(str(exc).splitlines() or [''])[0][:160]}") from None
        if camera is not None:
            _check_camera(env, env_spec.env_id, camera)
    try:
        result = evaluate(policy, env_spec, episodes=episodes, seed=seed, n_envs=1, max_steps=max_steps, envs=[env],
                          on_episode=on_episode)
    finally:
        env.close()  # RecordVideo writes the last episode's file on close
    videos = sorted(video.glob(f"{name}-episode-*.mp4"), key=lambda p: int(p.stem.rsplit("-", 1)[1])) if video else []
    return Playback(result, videos, camera if video is not None else None)


def file_label(precision: str) -> str:
    """A policy's precision as a file name part: ``int8 (onnx)`` -> ``int8-onnx``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", precision).strip("-")


def episode_rows(returns: Iterable[float], lengths: Iterable[int], seed: int) -> list[Row]:
    """``play``'s table: each episode with the seed it played, its return and length."""
    return [{"episode": i, "seed": seed + i, "return": round(float(r), 2), "length": int(n)}
            for i, (r, n) in enumerate(zip(returns, lengths, strict=True))]
