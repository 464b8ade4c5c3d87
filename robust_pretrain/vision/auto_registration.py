"""Register the MM-MAE classes with transformers' Auto classes as soon as transformers loads them.

``import robust_pretrain`` must stay fast (light commands never import transformers), yet
``AutoModel.from_pretrained(<MM-MAE checkpoint>)`` must work after it without ``trust_remote_code``. So importing
the package only installs an import hook (standard library only): when transformers executes one of its Auto
modules, the matching MM-MAE module is imported right after, and that module registers itself at its end
(``AutoConfig`` with the config, the ``AutoModel*`` classes with the models, ``AutoImageProcessor`` with the
processor). If transformers is already loaded, registration happens at once.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

#: transformers Auto module -> the MM-MAE module that registers with it when imported
REGISTRANTS = {
    "transformers.models.auto.configuration_auto": "robust_pretrain.vision.configuration_multimae",
    "transformers.models.auto.modeling_auto": "robust_pretrain.vision.modeling_multimae",
    "transformers.models.auto.image_processing_auto": "robust_pretrain.vision.image_processing_multimae",
}


def _import_registrant(name: str) -> None:
    if name in sys.modules:  # imported, or being imported: it registers itself when its body finishes
        return
    if importlib.util.find_spec(name) is not None:
        importlib.import_module(name)


class _RegisterAfterImport:
    """A meta path finder: finds transformers' Auto modules as the path finder does, and imports their registrant
    right after executing them."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        registrant = REGISTRANTS.get(fullname)
        if registrant is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _import_registrant(registrant)

        spec.loader.exec_module = exec_module  # this loader instance serves this one module
        return spec


def install_auto_registration() -> None:
    """Install the hook once; register at once with the Auto modules transformers has already loaded."""
    if not any(isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
    for auto_module, registrant in REGISTRANTS.items():
        if auto_module in sys.modules:
            _import_registrant(registrant)
