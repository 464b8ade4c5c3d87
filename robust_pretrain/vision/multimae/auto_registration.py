"""Let transformers' Auto classes find the MM-MAE classes, importing them only when an MM-MAE entry is looked up.

``import robust_pretrain`` stays light (standard library only), ``AutoModel.from_pretrained(<MM-MAE checkpoint>)``
works after it without ``trust_remote_code``, a text-only script never loads the MM-MAE modelling code, and no import
order can break: nothing is imported while transformers imports itself.

How: an import hook waits for transformers to execute one of its Auto modules, then gives that module's mappings a
registry of extra classes (their ``_extra_content`` dict) that is a :class:`_LoadOnLookup` - an attribute assignment,
no import. Looking up an MM-MAE key in such a registry (the ``"multimae"`` model type, the ``MultiMAEConfig`` class) or,
for the config and image-processor mappings, listing its entries, first imports the MM-MAE module that registers
itself there (``AutoConfig.register`` and the like at its end), unless a transformers or robust_pretrain module is still
being imported at that moment, in which case the MM-MAE entry simply is not there yet.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, ItemsView, Iterator, KeysView, Sequence, ValuesView
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, NamedTuple

MODEL_TYPE = "multimae"
"""``MultiMAEConfig.model_type``: the key of the MM-MAE config in ``CONFIG_MAPPING``."""
CONFIG_MODULE = "robust_pretrain.vision.multimae.configuration_multimae"
_GUARDED_PACKAGES = ("transformers", "robust_pretrain")


def _is_model_type(key: object) -> bool:
    return key == MODEL_TYPE


def _is_config_class(key: object) -> bool:
    return isinstance(key, type) and key.__module__ == CONFIG_MODULE and key.__qualname__ == "MultiMAEConfig"


def _model_mappings(module: ModuleType) -> list[Any]:
    lazy_mapping = sys.modules["transformers.models.auto.auto_factory"]._LazyAutoMapping
    return [value for value in vars(module).values() if isinstance(value, lazy_mapping)]


class Registrant(NamedTuple):
    """An MM-MAE module that registers its classes with the mappings of one transformers Auto module when imported."""

    module: str
    matches: Callable[[object], bool]
    """Whether a key looked up in the mapping is the MM-MAE one."""
    on_listing: bool
    """Whether listing the mapping's entries (keys, values, items, length) imports the module too."""
    mappings: Callable[[ModuleType], list[Any]]
    """The mappings of the Auto module the registrant registers with."""


#: transformers Auto module -> the MM-MAE module that registers with its mappings. Models are imported only for an
#: MM-MAE config (a listing of model classes, e.g. by a text pipeline, must not load them); the config and the image
#: processor also for a listing (``AutoImageProcessor`` finds a class by its name in the listing).
REGISTRANTS = {
    "transformers.models.auto.configuration_auto": Registrant(
        CONFIG_MODULE, _is_model_type, True, lambda module: [module.CONFIG_MAPPING]
    ),
    "transformers.models.auto.modeling_auto": Registrant(
        "robust_pretrain.vision.multimae.modeling_multimae", _is_config_class, False, _model_mappings
    ),
    "transformers.models.auto.image_processing_auto": Registrant(
        "robust_pretrain.vision.multimae.image_processing_multimae",
        _is_config_class,
        True,
        lambda module: [module.IMAGE_PROCESSOR_MAPPING],
    ),
}


def _initializing(module: ModuleType) -> bool:
    """Whether the module's body is still running (importlib's own flag on its spec)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def import_in_progress() -> bool:
    """Whether a module of transformers or of this package is being imported right now (in any thread)."""
    return any(
        _initializing(module)
        for name, module in list(sys.modules.items())
        if name.partition(".")[0] in _GUARDED_PACKAGES
    )


class _LoadOnLookup(dict):
    """The registry of extra classes of one Auto mapping: imports its MM-MAE registrant on first need."""

    def __init__(self, entries: dict, registrant: Registrant) -> None:
        super().__init__(entries)
        self.registrant = registrant

    def _load(self) -> None:
        # In sys.modules: registered, or being imported right now (it registers when its body ends).
        if self.registrant.module not in sys.modules and not import_in_progress():
            importlib.import_module(self.registrant.module)

    def _load_for(self, key: object) -> None:
        if self.registrant.matches(key):
            self._load()

    def _load_for_listing(self) -> None:
        if self.registrant.on_listing:
            self._load()

    def __contains__(self, key: object) -> bool:
        self._load_for(key)
        return super().__contains__(key)

    def __getitem__(self, key: Any) -> Any:
        self._load_for(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._load_for(key)
        return super().get(key, default)

    def keys(self) -> KeysView:
        self._load_for_listing()
        return super().keys()

    def values(self) -> ValuesView:
        self._load_for_listing()
        return super().values()

    def items(self) -> ItemsView:
        self._load_for_listing()
        return super().items()

    def __iter__(self) -> Iterator:
        self._load_for_listing()
        return super().__iter__()

    def __len__(self) -> int:
        self._load_for_listing()
        return super().__len__()


def _install(module: ModuleType, registrant: Registrant) -> None:
    for mapping in registrant.mappings(module):
        if not isinstance(mapping._extra_content, _LoadOnLookup):
            mapping._extra_content = _LoadOnLookup(mapping._extra_content, registrant)


class _InstallAfterExec:
    """Finds transformers' Auto modules with the other finders and installs the registries right after their body."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        registrant = REGISTRANTS.get(fullname)
        if registrant is None:
            return None
        spec = next(filter(None, (finder.find_spec(fullname, path, target) for finder in self._other_finders())), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _install(module, registrant)

        spec.loader.exec_module = exec_module  # this loader instance serves this one module
        return spec

    def _other_finders(self) -> Iterator[Any]:
        return (finder for finder in list(sys.meta_path) if finder is not self and hasattr(finder, "find_spec"))


def install_auto_registration() -> None:
    """Install the hook once, and the registries of the Auto modules transformers has already loaded."""
    if not any(isinstance(finder, _InstallAfterExec) for finder in sys.meta_path):
        sys.meta_path.insert(0, _InstallAfterExec())
    for auto_module, registrant in REGISTRANTS.items():
        module = sys.modules.get(auto_module)
        if module is not None and not _initializing(module):
            _install(module, registrant)
