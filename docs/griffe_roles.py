"""A Griffe extension (registered in ``mkdocs.yml``) that turns the Sphinx roles of the
docstrings (``:meth:`x```, ``:func:``, ``:class:``, ``:attr:``, ``:mod:``, ``:data:``,
``:exc:``) into cross-references.

mkdocstrings reads the docstrings as Markdown, where a role would show literally
(":meth:get_transform"). Each role's target is resolved the way Sphinx does, from the
docstring's own scope outwards (the method's class, its module, ...; a leading ``.`` is
relative to the module's package; ``~`` shows the last name only), and written as an
optional autoref: a link where the target is rendered on the site, plain code elsewhere.
"""

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:meth|func|class|attr|mod|data|exc|obj):`(~?)([\w.]+)(\(\))?`")
PACKAGE = "numpyro_dais"


def _lookup(loader, path):
    try:
        return loader.modules_collection[path]
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _candidates(obj, name):
    if name.startswith("."):
        module = obj if obj.is_module else obj.module
        package = module if module.is_package else module.parent
        dots = len(name) - len(name.lstrip("."))
        for _ in range(dots - 1):
            package = package.parent
        yield f"{package.path}.{name.lstrip('.')}"
        return
    yield name
    scope = obj
    while scope is not None:
        yield f"{scope.path}.{name}"
        scope = scope.parent
    yield f"{PACKAGE}.{name}"


def _public_path(loader, target):
    """The path under which the site renders ``target``: ``numpyro_dais.<Name>[.member]`` for
    what the package exports, the canonical path otherwise."""
    canonical = target.canonical_path
    package = _lookup(loader, PACKAGE)
    for name in (package.exports or []) if package is not None else []:
        exported = _lookup(loader, f"{PACKAGE}.{name}")
        if exported is None:
            continue
        prefix = exported.canonical_path
        if canonical == prefix or canonical.startswith(prefix + "."):
            return f"{PACKAGE}.{name}{canonical[len(prefix) :]}"
    return canonical


def rewrite(text, obj, loader):
    def replace(match):
        short, name, call = match.group(1), match.group(2), match.group(3) or ""
        shown = name.lstrip(".").rsplit(".", 1)[-1] if short else name.lstrip(".")
        for path in _candidates(obj, name):
            target = _lookup(loader, path)
            if target is not None:
                identifier = _public_path(loader, target)
                code = f"<code>{shown}{call}</code>"
                return f'<autoref identifier="{identifier}" optional>{code}</autoref>'
        return f"`{shown}{call}`"

    return ROLE.sub(replace, text)


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring of the package once it is loaded."""

    def on_package(self, *, pkg, loader, **kwargs):
        def walk(obj):
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, obj, loader)
            for member in obj.members.values():
                if not member.is_alias:
                    walk(member)

        walk(pkg)
