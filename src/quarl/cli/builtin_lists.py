"""The help lists of the built-in registries, written by ``python -m quarl.cli.help_lists``
(:mod:`quarl.cli.help_lists`); ``tests/test_cli_help.py`` holds them equal to the registries."""

BUILTIN_LISTS: dict[str, str] = {
    'precisions': (
        'comma list of fp32, fp16, bf16, int8 / int4 (real kernels, a fast mode that agrees with fp32), '
        'int8-block, int8-dyn-channel, int8-dyn-tensor, int8-weight-only, int8-static, int4-mixed, '
        'int4-block, int4-weight-only, int4-block-head8, int4-weight-only-head8, sim2..sim16 (simulated n-bit'
        ' weights)'
    ),
    'precision_labels': (
        'fp32,fp16,bf16,int8,int4,int8-block,int8-dyn-channel,int8-dyn-tensor,int8-weight-only,int8-static,in'
        't4-mixed,int4-block,int4-weight-only,int4-block-head8,int4-weight-only-head8,sim2,sim3,sim4,sim5,sim'
        '6,sim7,sim8,sim9,sim10,sim11,sim12,sim13,sim14,sim15,sim16'
    ),
    'precision_allowed': (
        'fp32, fp16, bf16, int8, int4 (int8 / int4: real kernels, automatic mode), int8-block, '
        'int8-dyn-channel, int8-dyn-tensor, int8-weight-only, int8-static, int4-mixed, int4-block, '
        'int4-weight-only, int4-block-head8, int4-weight-only-head8, sim2..sim16 (simulated n-bit weights)'
    ),
    'train_algorithms': (
        'a2c, ppo, dqn, ddpg, td3, sac, qrdqn, tqc or trpo (qrdqn, tqc, trpo: sb3-contrib)'
    ),
    'train_precisions': (
        'fp32, bf16 or fp16'
    ),
    'actor_precisions': (
        'fp32, fp16, bf16, int8 or int4'
    ),
    'wire_bits': (
        '32, 16 or 8..2'
    ),
}
