"""``quarl play``: a policy at one precision, each episode's return and length, and videos."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quarl.cli import early, registry_options
from quarl.cli.app import app
from quarl.cli.command import command
from quarl.cli.common import out_console, progress, setup, user_errors
from quarl.cli.loading import load, protocol
from quarl.cli.settings import (
    EVALUATION,
    INT_OPTIONS,
    LOADING,
    Acting,
    BlockSize,
    CheckpointArg,
    Env,
    Evaluation,
    GymPackages,
    Int8Weights,
    IntOptions,
    LoadBest,
    LoadCheckpoint,
    Loading,
    LoadLastCheckpoint,
    MaxSteps,
    Seed,
    StickyActions,
    Stochastic,
    TrustGymPackages,
    TrustPickle,
    Verbose,
)
from quarl.core import validate
from quarl.core.errors import QuarlError

Precision = Annotated[str, typer.Option(
    "--precision", help="one precision, as in ptq's --precisions (int8 chooses its mode on the calibration seeds, as "
                        "ptq does)")]
PlayEpisodes = Annotated[int, typer.Option("--episodes", help="episodes to play (episode i uses seed + i, as in ptq)")]
Video = Annotated[Path | None, typer.Option(
    "--video", parser=validate.out_option, help="record each episode as VIDEO/<precision>-episode-K.mp4 (no display "
                                                "needed)")]
Camera = Annotated[str | None, typer.Option(
    "--camera", help="MuJoCo camera to record from: an id (0, 1, ...) or a name (e.g. track); default the env's own "
                     "view")]
VideoSize = Annotated[str | None, typer.Option(
    "--video-size", help="video frame size WIDTHxHEIGHT, e.g. 640x480 (MuJoCo; default the env's own)")]


@command(app, "play", renames={"--precisions": "--precision"})
@user_errors
def play(
    checkpoint: CheckpointArg,
    *,
    env: Env = None,
    precision: Precision = "fp32",
    episodes: PlayEpisodes = 3,
    seed: Seed = EVALUATION.seed,
    sticky_actions: StickyActions = None,
    stochastic: Stochastic = None,
    video: Video = None,
    camera: Camera = None,
    video_size: VideoSize = None,
    max_steps: MaxSteps = None,
    int8_weights: Int8Weights = INT_OPTIONS.int8_weights,
    block_size: BlockSize = INT_OPTIONS.block_size,
    trust_pickle: TrustPickle = False,
    trust_gym_packages: TrustGymPackages = False,
    gym_packages: GymPackages = None,
    verbose: Verbose = False,
    load_best: LoadBest = LOADING.load_best,
    load_checkpoint: LoadCheckpoint = None,
    load_last_checkpoint: LoadLastCheckpoint = LOADING.load_last_checkpoint,
) -> None:
    """Play a policy at one precision, print each episode's return and length (the same
    numbers ptq gets on those seeds) and, with --video, record each episode.

    Example: quarl play ../shared/zoo/ppo/LunarLander-v2_1 --precision int8 --episodes 2 --video videos

    Example: quarl play ../shared/zoo/ppo/HalfCheetah-v3_1 --video videos --camera track --video-size 640x480
    """
    setup(verbose)
    checkpoint = Loading(trust_pickle, load_best, load_checkpoint, load_last_checkpoint).policy_path(checkpoint, env)
    evaluation = Evaluation(episodes, seed, 1, max_steps).checked()  # before torch loads: a typo answers at once
    validate.count(max_steps, 1, "--max-steps")
    early.precisions(precision)
    from quarl.api import quantize
    from quarl.evaluation.playback import episode_rows, file_label
    from quarl.evaluation.playback import play as play_episodes
    from quarl.evaluation.reports import print_table

    configs = registry_options.configs(precision, IntOptions(int8_weights, block_size).config())
    if len(configs) != 1:
        raise QuarlError(f"--precision {precision!r} names {len(configs)} precisions: play takes one")
    config = configs[0]
    evaluation.settings()
    validate.count(max_steps, 1, "--max-steps")
    validate.out_folder(video, "--video")
    size = validate.video_size(video_size)
    if (camera is not None or size is not None) and video is None:
        raise QuarlError("--camera and --video-size set how --video records: give --video DIR too")
    ckpt, spec = load(checkpoint, env, trust_pickle)
    spec, ckpt.policy = protocol(ckpt.policy, spec, Acting(stochastic, sticky_actions))
    if video is not None:  # the camera and the frames' memory checked before any progress bar
        from quarl.evaluation.playback import check_frame_memory, render_kwargs

        render_kwargs(spec.env_id, camera, size)
        check_frame_memory(spec.env_id, size, max_steps)
    from quarl.policies.onnx_artifact import ExportedModel

    if ckpt.payload_of(ExportedModel) is not None:
        if config.precision != "fp32":
            raise QuarlError(f"{checkpoint} is an exported model: it plays as exported ({ckpt.policy.precision}); "
                             "drop --precision")
        policy = ckpt.policy
    else:
        policy = ckpt.policy if config.precision == "fp32" else quantize(ckpt.policy, config, spec)
    name = file_label(policy.precision) + ("-sampled" if policy.stochastic else "")  # a greedy play keeps its own
    with progress() as bar:  # recording a long MuJoCo episode takes seconds: say where it is
        task = bar.add_task(f"{name} episodes", total=episodes)
        played = play_episodes(policy, spec, episodes, seed, video, max_steps, name=name, camera=camera,
                               video_size=size, on_episode=lambda *_: bar.advance(task))
    result = played.result
    rows = episode_rows(result.returns, result.lengths, seed)
    quant = policy.meta.get("quant")
    mode = quant["mode"] if quant is not None else None
    print_table(rows, None, out_console)
    out_console.print(f"{ckpt.algo} {spec.env_id} at {file_label(policy.precision)}"
                      + (f" (mode {mode})" if mode else "") +
                      f": mean return {result.mean:.2f} over {episodes} episodes" +
                      (", sampled actions" if policy.stochastic else ""), soft_wrap=True)
    if video is not None:
        seen = f", camera {played.camera}" + (" (follows the agent; --camera to choose)" if camera is None else "") \
            if played.camera else ""
        out_console.print(f"wrote {len(rows)} video{'s' * (len(rows) != 1)} to {video}/ ({name}-episode-0.mp4"
                          + (" ...)" if len(rows) > 1 else ")") + seen, soft_wrap=True)
