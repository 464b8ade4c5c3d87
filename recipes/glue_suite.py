"""Checkpoints x tasks x seeds (GLUE by default, ``--family`` for others); average and worst task.

See robust_pretrain.evaluation.suite.
"""

from robust_pretrain.evaluation.suite import main

if __name__ == "__main__":
    raise SystemExit(main())
