"""``quarl play``: a policy at one precision, each episode's return and length, and videos."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from quarl.cli import early, registry_options
from quarl.cli.common import out_console, progress, setup, user_errors
from quarl.cli.groups import acting_options, common_options, int_mode_options, loading_options, with_options
from quarl.cli.options import CheckpointArg, EnvOpt, MaxStepsOpt, SeedOpt, is_export, load, load_choice, protocol
from quarl.core import validate
from quarl.core.errors import QuarlError


@user_errors
@load_choice
@with_options(acting_options, int_mode_options, loading_options, common_options)
def play(
    checkpoint: Path = CheckpointArg,
    *,
    env: Optional[str] = EnvOpt,
    precision: str = typer.Option("fp32", help="one precision, as in ptq's --precisions (int8 chooses its mode on the "
                                               "calibration seeds, as ptq does)"),
    episodes: int = typer.Option(3, "--episodes", help="episodes to play (episode i uses seed + i, as in ptq)"),
    seed: int = SeedOpt,
    sticky_actions: Optional[float],
    stochastic: Optional[bool],
    video: Optional[Path] = typer.Option(None, "--video", parser=validate.out_option,
                                         help="record each episode as VIDEO/<precision>-episode-K.mp4 (no display "
                                              "needed)"),
    camera: Optional[str] = typer.Option(None, "--camera", help="MuJoCo camera to record from: an id (0, 1, ...) or "
                                                               "a name (e.g. track); default the env's own view"),
    video_size: Optional[str] = typer.Option(None, "--video-size", help="video frame size WIDTHxHEIGHT, e.g. 640x480 "
                                                                        "(MuJoCo; default the env's own)"),
    max_steps: Optional[int] = MaxStepsOpt,
    int8_weights: str,
    block_size: int,
    trust_pickle: bool,
    trust_gym_packages: bool,
    gym_packages: Optional[str],
    verbose: bool,
) -> None:
    """Play a policy at one precision, print each episode's return and length (the same
    numbers ptq gets on those seeds) and, with --video, record each episode.

    Example: quarl play ../shared/zoo/ppo/LunarLander-v2_1 --precision int8 --episodes 2 --video videos

    Example: quarl play ../shared/zoo/ppo/HalfCheetah-v3_1 --video videos --camera track --video-size 640x480
    """
    setup(verbose)
    registry_options.check_eval_values(episodes, seed, 1, max_steps)  # before torch loads: a typo answers at once
    validate.count(max_steps, 1, "--max-steps")
    early.precisions(precision)
    from quarl.api import quantize
    from quarl.evaluation.playback import play as play_episodes
    from quarl.evaluation.reports import print_table
    from quarl.workflows import episode_rows, file_label

    options = registry_options.quant_options(int8_weights, block_size)
    labels = registry_options.precisions(precision, **options)
    if len(labels) != 1:
        raise QuarlError(f"--precision {precision!r} names {len(labels)} precisions: play takes one")
    registry_options.eval_settings(episodes, seed, 1, max_steps)
    validate.count(max_steps, 1, "--max-steps")
    validate.out_folder(video, "--video")
    size = validate.video_size(video_size)
    if (camera is not None or size is not None) and video is None:
        raise QuarlError("--camera and --video-size set how --video records: give --video DIR too")
    ckpt, spec = load(checkpoint, env, trust_pickle)
    spec, ckpt.policy = protocol(ckpt.policy, spec, stochastic, sticky_actions)
    if video is not None:  # the camera and the frames' memory checked before any progress bar
        from quarl.evaluation.playback import check_frame_memory, render_kwargs

        render_kwargs(spec.env_id, camera, size)
        check_frame_memory(spec.env_id, size, max_steps)
    if is_export(checkpoint):
        if labels[0] != "fp32":
            raise QuarlError(f"{checkpoint} is an exported model: it plays as exported ({ckpt.policy.precision}); "
                             "drop --precision")
        policy = ckpt.policy
    else:
        policy = ckpt.policy if labels[0] == "fp32" else quantize(ckpt.policy, labels[0], spec, **options)
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
    out_console.print(f"{ckpt.algo} {spec.env_id} at {file_label(policy.precision)}" + (f" (mode {mode})" if mode else "") +
                      f": mean return {result.mean:.2f} over {episodes} episodes" +
                      (", sampled actions" if policy.stochastic else ""), soft_wrap=True)
    if video is not None:
        seen = f", camera {played.camera}" + (" (follows the agent; --camera to choose)" if camera is None else "") \
            if played.camera else ""
        out_console.print(f"wrote {len(rows)} video{'s' * (len(rows) != 1)} to {video}/ ({name}-episode-0.mp4"
                          + (" ...)" if len(rows) > 1 else ")") + seen, soft_wrap=True)
