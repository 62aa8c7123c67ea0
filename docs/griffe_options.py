"""A Griffe extension (registered in ``mkdocs.yml``) that shows an annealed preset's
options in its signature.

A preset takes ``**options`` and declares their defaults once, as option groups
(``numpyro_dais.annealed.options``); at run time its ``__init__`` carries the spelt-out signature
(``__signature__``), which static analysis cannot see. This extension copies that runtime
signature into the rendered one, so the site shows ``AutoDAIS(model, *, K=4, ...)`` as
``help(AutoDAIS)`` does.
"""

import importlib
import inspect

import griffe

KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: griffe.ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: griffe.ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: griffe.ParameterKind.var_keyword,
}


def _default(value):
    if value is inspect.Parameter.empty:
        return None
    return getattr(value, "__name__", None) or repr(value)


class PresetSignatures(griffe.Extension):
    """Replace ``__init__(self, model, **options)`` of every class whose runtime class
    declares option ``defaults`` with its runtime signature."""

    def on_package(self, *, pkg, **kwargs):
        def walk(obj):
            for member in obj.members.values():
                if member.is_alias:
                    continue
                if member.is_class:
                    self._expand(member)
                if member.is_module or member.is_class:
                    walk(member)

        walk(pkg)

    @staticmethod
    def _expand(cls):
        init = cls.members.get("__init__")
        if init is None or init.is_alias:
            return
        module = importlib.import_module(cls.module.path)
        runtime = getattr(module, cls.name, None)
        if runtime is None or "defaults" not in vars(runtime):
            return
        signature = inspect.signature(runtime.__init__)
        init.parameters = griffe.Parameters(
            *(
                griffe.Parameter(p.name, kind=KINDS[p.kind], default=_default(p.default))
                for p in signature.parameters.values()
            )
        )
