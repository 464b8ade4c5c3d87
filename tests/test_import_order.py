"""No import order breaks transformers or the MM-MAE Auto registration; a text-only script never loads the MM-MAE
modelling code. Each order runs in a fresh interpreter (one subprocess per order)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tiny_vision import tiny_config

import robust_pretrain
from robust_pretrain.vision.multimae import auto_registration, modeling_multimae  # noqa: F401 (registers the models)
from robust_pretrain.vision.multimae.configuration_multimae import MultiMAEConfig
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor
from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining

CHECKOUT = Path(robust_pretrain.__file__).resolve().parents[1]
MODELING = "robust_pretrain.vision.multimae.modeling_multimae"
PROCESSING = "robust_pretrain.vision.multimae.image_processing_multimae"
#: the MM-MAE model and the modules it is built from: none of them loads with text-only code
MM_MAE_MODULES = (MODELING,) + tuple(
    f"robust_pretrain.vision.multimae.{name}"
    for name in ("patch_grid", "modality_values", "encoder", "decoder", "pretraining", "heads")
)
MODEL_CLASSES = ("BertModel", "ViTModel", "DPTForDepthEstimation", "SegformerForSemanticSegmentation")

# Loads the checkpoint at CHECKPOINT through every Auto class and reports what it got (last line of stdout).
LOAD_THROUGH_AUTO_CLASSES = f"""
import json, sys
from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoModelForPreTraining
modeling_loaded_before = {MODELING!r} in sys.modules
config = AutoConfig.from_pretrained(CHECKPOINT)
model = AutoModelForPreTraining.from_pretrained(CHECKPOINT)
encoder = AutoModel.from_pretrained(CHECKPOINT)
from_config = AutoModel.from_config(config)
processor = AutoImageProcessor.from_pretrained(CHECKPOINT)
print(json.dumps({{
    "classes": [type(x).__name__ for x in (config, model, encoder, from_config, processor)],
    "weights": sum(float(p.double().sum()) for p in model.parameters()),
    "modeling_loaded_before": modeling_loaded_before,
}}))
"""


def run_fresh(script: str, checkpoint: Path | None = None) -> dict:
    """Run ``script`` in a fresh interpreter importing this checkout; return the JSON of its last stdout line."""
    prelude = f"import sys\nsys.path.insert(0, {str(CHECKOUT)!r})\nCHECKPOINT = {str(checkpoint)!r}\n"
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # offline, as conftest set it
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, float]:
    """A saved MM-MAE model and image processor, and the sum of the model's weights."""
    folder = tmp_path_factory.mktemp("mm-mae")
    torch.manual_seed(0)
    model = MultiMAEForPreTraining(tiny_config())
    model.save_pretrained(folder)
    MultiMAEImageProcessor(size={"height": 16, "width": 16}, num_classes=5).save_pretrained(folder)
    return folder, sum(float(p.detach().double().sum()) for p in model.parameters())


def assert_loaded(report: dict, weights: float) -> None:
    assert report["classes"] == [
        "MultiMAEConfig",
        "MultiMAEForPreTraining",
        "MultiMAEModel",
        "MultiMAEModel",
        "MultiMAEImageProcessor",
    ]
    assert report["weights"] == pytest.approx(weights, rel=1e-12)


ORDERS = {
    **{
        f"package-then-{name}": f"""
            import robust_pretrain
            from transformers import {name}
            assert not set({MM_MAE_MODULES!r}) & set(sys.modules)  # a transformers model loads no MM-MAE code
            """
        for name in MODEL_CLASSES
    },
    **{f"{name}-then-package": f"from transformers import {name}\nimport robust_pretrain\n" for name in MODEL_CLASSES},
    "auto-classes-then-package": """
        from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoModelForPreTraining
        import robust_pretrain
        """,
    "package-then-auto-classes": f"""
        import robust_pretrain
        from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoModelForPreTraining
        assert not set({MM_MAE_MODULES!r}) & set(sys.modules)
        """,
    "transformers-then-package": "import transformers\nimport robust_pretrain\n",
    "mm-mae-model-then-transformers-model": """
        from robust_pretrain.vision import MultiMAEForPreTraining
        from transformers import BertModel, DPTForDepthEstimation
        """,
    "mm-mae-processor-then-package": """
        from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor
        from transformers import ViTModel
        import robust_pretrain
        """,
}


@pytest.mark.slow
@pytest.mark.parametrize("order", sorted(ORDERS))
def test_every_import_order_loads_the_checkpoint_through_the_auto_classes(order, checkpoint):
    folder, weights = checkpoint
    report = run_fresh(textwrap.dedent(ORDERS[order]) + LOAD_THROUGH_AUTO_CLASSES, folder)
    assert_loaded(report, weights)
    if order.startswith("package-then-"):
        assert report["modeling_loaded_before"] is False  # loaded by the first MM-MAE lookup, not before


@pytest.mark.slow
def test_a_text_only_script_never_loads_the_mm_mae_code():
    report = run_fresh(
        f"""
        import json
        import robust_pretrain
        from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments
        from robust_pretrain.pretraining.pos_mlm import recipe as pos_mlm
        from transformers import AutoConfig, AutoModelForMaskedLM, BertConfig
        config = BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=16)
        model = AutoModelForMaskedLM.from_config(config)
        names = [c.__name__ for c in AutoModelForMaskedLM._model_mapping]  # a listing, as error messages make
        print(json.dumps({{"model": type(model).__name__, "bert": type(AutoConfig.for_model("bert")).__name__,
                          "loaded": sorted(set({MM_MAE_MODULES + (PROCESSING,)!r}) & set(sys.modules))}}))
        """
    )
    assert report == {"model": "BertForMaskedLM", "bert": "BertConfig", "loaded": []}


@pytest.mark.slow
def test_importing_the_package_imports_neither_torch_nor_transformers():
    report = run_fresh(
        "import json, robust_pretrain\nprint(json.dumps(sorted({'torch', 'transformers'} & set(sys.modules))))"
    )
    assert report == []


def test_the_registries_cover_every_auto_class_the_model_registers_with():
    """In this process: every mapping an MM-MAE class is registered in got its load-on-lookup registry, so an
    interpreter that has not loaded the MM-MAE code yet would find it there too."""
    import transformers.models.auto.image_processing_auto as image_processing_auto
    import transformers.models.auto.modeling_auto as modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    assert auto_registration.MODEL_TYPE == MultiMAEConfig.model_type
    registered = [
        mapping
        for mapping in auto_registration._model_mappings(modeling_auto)
        if MultiMAEConfig in dict.keys(mapping._extra_content)
    ]
    assert len(registered) == 5
    for mapping in [*registered, CONFIG_MAPPING, image_processing_auto.IMAGE_PROCESSOR_MAPPING]:
        assert isinstance(mapping._extra_content, auto_registration._LoadOnLookup)
    assert CONFIG_MAPPING["multimae"] is MultiMAEConfig
    assert not auto_registration.import_in_progress()
