"""Run GLUE tasks x seeds for several checkpoints; report average and worst task. See robust_pretrain.glue.suite."""

from robust_pretrain.glue.suite import main

if __name__ == "__main__":
    main()
