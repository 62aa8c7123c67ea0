"""Argument checks shared by the engine and the guides: errors that name the argument."""


def check_choice(name: str, value, choices):
    """Raise ``ValueError`` naming ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {sorted(choices)}, got {value!r}.")


class SubsamplingNotSupportedError(ValueError, NotImplementedError):
    """A guide whose dynamics need the full data set met a subsampled plate.

    Both a ``ValueError`` (the type of this package's other refusals) and a
    ``NotImplementedError`` (the type numpyro's own ``AutoDAIS`` raises for a subsampled
    plate), so code written against either catches it.
    """
