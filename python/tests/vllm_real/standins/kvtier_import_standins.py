"""Import-time stand-ins for the packages vLLM imports that this machine's package indexes lack.

vLLM imports these at module level (structured-output backends, the gpt-oss and Mistral
parsers, the OpenAI server's helpers) although the scheduler, the connector factory and the
model-runner mixin never call them. A module of one of these roots that no real install
provides is made on import: any attribute is a class that accepts any arguments (so ``from x
import Y``, subclassing and type annotations work, pydantic included), and ``pybase64`` is the
standard library's ``base64``. A real install always wins. Loaded by a ``.pth`` file in the
test environment only (python/tests/vllm_real/env.py); never part of kvtier.
"""

from __future__ import annotations

import base64
import importlib.abc
import importlib.machinery
import sys
import types

ROOTS = frozenset(
    {
        "blake3",
        "compressed_tensors",
        "depyf",
        "ijson",
        "llguidance",
        "lmformatenforcer",
        "mistral_common",
        "model_hosting_container_standards",
        "openai_harmony",
        "outlines_core",
        "partial_json_parser",
        "prometheus_fastapi_instrumentator",
        "pybase64",
        "setproctitle",
        "xgrammar",
    }
)


def _any_schema(cls, source, handler):  # noqa: ARG001 - pydantic's hook signature
    from pydantic_core import core_schema

    return core_schema.any_schema()


class _AnyType(type):
    """The type of a stand-in class: its attributes are stand-in classes too."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _standin(f"{cls.__qualname__}.{name}")


def _standin(qualname: str) -> type:
    return _AnyType(
        qualname.rsplit(".", 1)[-1],
        (),
        {
            "__qualname__": qualname,
            "__init__": lambda self, *a, **k: None,
            "__call__": lambda self, *a, **k: None,
            "__get_pydantic_core_schema__": classmethod(_any_schema),
        },
    )


class _StandinModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _standin(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        # Last on sys.meta_path: asked only when no real install provides the module.
        if fullname.partition(".")[0] not in ROOTS:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _StandinModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        module.__kvtier_standin__ = True
        if module.__name__ == "pybase64":
            for name in ("b64encode", "b64decode", "standard_b64encode", "standard_b64decode",
                         "urlsafe_b64encode", "urlsafe_b64decode"):
                setattr(module, name, getattr(base64, name))


sys.meta_path.append(_Finder())
