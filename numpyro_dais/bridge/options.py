"""Every guide's options, declared once, in groups: frozen ``NamedTuple`` classes.

A guide class declares ``defaults``, a tuple of option groups whose field defaults are its
table of defaults; :func:`parse` turns a user's keyword arguments into those groups (an
unknown name is an error naming the closest option), :func:`option_names` lists them (read-only
after construction, :class:`~numpyro_dais.bridge.autoguide.ContinuousGuide`) and
:func:`signature` spells them out for ``help()`` and editors.
"""

import difflib
import inspect


def parse(cls, options: dict, positional: tuple = ()) -> tuple:
    """The option groups of guide ``cls`` (its ``defaults``) with the keyword ``options`` a
    user passed put in, and the ``positional`` ones, which fill the first options in order
    (at most ``cls.positional_options`` of them: numpyro's positional signature, where a
    guide keeps it). An unknown name raises a ``TypeError`` naming it and the closest
    option."""
    known = option_names(cls.defaults)
    limit = getattr(cls, "positional_options", 0)
    if len(positional) > limit:
        raise TypeError(
            f"{cls.__name__} takes at most {limit} options by position after its models "
            f"({', '.join(known[:limit])}), got {len(positional)}; pass the others by keyword."
        )
    twice = sorted(set(known[: len(positional)]) & set(options))
    if twice:
        raise TypeError(f"{cls.__name__} got multiple values for `{twice[0]}`.")
    options = {**dict(zip(known, positional, strict=False)), **options}
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean `{close[0]}`?" if close else ""
            raise TypeError(
                f"{cls.__name__} got an unexpected keyword argument `{name}`.{hint} Its "
                f"options are: {', '.join(known)} (see help({cls.__name__}))."
            )
    return tuple(
        group._replace(**{k: v for k, v in options.items() if k in group._fields})
        for group in cls.defaults
    )


def option_names(defaults) -> tuple[str, ...]:
    """Every option name of the groups ``defaults``, in order (``prefix`` and
    ``init_loc_fn``, the base guide's, among them)."""
    return tuple(name for group in defaults for name in group._fields)


def signature(init, defaults, positional: int = 0) -> inspect.Signature:
    """``init``'s signature with its ``*options`` and ``**options`` spelt out: one parameter
    per option of the groups ``defaults`` that ``init`` does not name, with its default; the
    first ``positional`` of them positional-or-keyword, the others keyword-only."""
    sig = inspect.signature(init)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    params = [p for p in sig.parameters.values() if p.kind not in variadic]
    named = {p.name for p in params}
    options = [(n, v) for group in defaults for n, v in group._asdict().items() if n not in named]
    first = [p for p in params if p.kind is not p.KEYWORD_ONLY]
    keywords = [p for p in params if p.kind is p.KEYWORD_ONLY]
    for i, (name, value) in enumerate(options):
        if i < positional:
            first.append(
                inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=value)
            )
        else:
            keywords.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=value))
    return sig.replace(parameters=first + keywords)


def declare(cls):
    """Declare guide ``cls``'s options from its ``defaults``: ``cls._options`` (their names)
    and, where ``cls`` defines ``__init__``, its signature under ``help()``
    (:func:`signature`, with ``cls.positional_options`` positional) and a public
    docstring. Returns ``cls`` (a class decorator)."""
    cls._options = option_names(cls.defaults)
    if "__init__" in cls.__dict__ and cls.defaults:
        positional = getattr(cls, "positional_options", 0)
        cls.__init__.__signature__ = signature(cls.__init__, cls.defaults, positional)
        if cls.__init__.__doc__ is None:  # not the private adapter's, under help()
            cls.__init__.__doc__ = f"Build the guide: the options are {cls.__name__}'s."
    return cls
