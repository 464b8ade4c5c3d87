"""Renders the scenes of ``scripts/vision_evidence.sh`` (evidence for the README's vision table) once.

    python scripts/vision_evidence.py scenes OUT_DIR --num_train 512 --num_eval 256 [--scene_seed 0 --scene_size 64]

Writes the generated scenes' downstream splits (``downstream_train`` / ``downstream_test``, exactly the images
``finetune_dense.py`` renders for ``--num_train_scenes`` / ``--num_eval_scenes``) into a local ``datasets`` folder
(parquet + a README declaring the splits), so the suite's cells load them instead of rendering them again. The tables
come from ``scripts/evidence_tables.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

SPLITS = ("downstream_train", "downstream_test")
DATASET_README = """---
configs:
- config_name: default
  data_files:
  - split: downstream_train
    path: downstream_train.parquet
  - split: downstream_test
    path: downstream_test.parquet
---
Generated scenes (robust_pretrain.vision.scenes), {description}. Written by scripts/vision_evidence.py.
"""


def write_scenes(out_dir: Path, num_train: int, num_eval: int, scene_seed: int, scene_size: int) -> None:
    from robust_pretrain.vision import scenes

    out_dir.mkdir(parents=True, exist_ok=True)
    config = scenes.SceneConfig(image_size=scene_size)
    for split, count in zip(SPLITS, (num_train, num_eval), strict=True):
        scenes.generate_scenes(count, split, scene_seed, config).to_parquet(str(out_dir / f"{split}.parquet"))
    description = (
        f"generator v{scenes.GENERATOR_VERSION}, seed {scene_seed}, {scene_size} px: {num_train} "
        f"downstream_train / {num_eval} downstream_test"
    )
    (out_dir / "README.md").write_text(DATASET_README.format(description=description), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scenes = parser.add_subparsers(dest="command", required=True).add_parser("scenes")
    scenes.add_argument("out_dir", type=Path)
    scenes.add_argument("--num_train", type=int, required=True)
    scenes.add_argument("--num_eval", type=int, required=True)
    scenes.add_argument("--scene_seed", type=int, default=0)
    scenes.add_argument("--scene_size", type=int, default=64)
    args = parser.parse_args()
    write_scenes(args.out_dir, args.num_train, args.num_eval, args.scene_seed, args.scene_size)


if __name__ == "__main__":
    main()
