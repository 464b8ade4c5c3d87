"""Fine-tune any BERT-family checkpoint on one GLUE task (paper protocol); see robust_pretrain.glue.finetune."""

from robust_pretrain.glue.finetune import main

if __name__ == "__main__":
    raise SystemExit(main())
