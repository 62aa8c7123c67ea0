"""Argument checks shared by the engine and the guides: errors that name the argument."""


def check_choice(name: str, value, choices):
    """Raise ``ValueError`` naming ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {sorted(choices)}, got {value!r}.")
