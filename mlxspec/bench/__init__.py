"""`mlxspec bench`: does speculation pay on this machine with this pair?

    prompts.py  the builtin suite and users' JSONL files
    runner.py   interleaved runs of vanilla, speculative settings and the mlx-lm peer
    peer.py     mlx-lm's speculative decoding, timed like the engine
    neartie.py  greedy output check: a differing output is a rounding divergence or a bug
                (judged by a float32 reference pass, `mlxspec.reference`)
    summary.py  medians and pairwise speedups, overall, per category, per draft length
    report.py   terminal tables, JSON and CSV; plot.py the optional PNG
"""
