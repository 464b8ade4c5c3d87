"""Fine-tune an MM-MAE (or ViT) checkpoint on semseg, depth or classification; see robust_pretrain.vision.finetune."""

from robust_pretrain.vision.finetune.recipe import main

if __name__ == "__main__":
    raise SystemExit(main())
