"""Uniform mini-batches: ``B`` distinct indices of ``range(Nd)`` in ``O(B)`` work for ``B² ≤ Nd``.

NumPyro's subsample plates draw a mini-batch by a partial Fisher–Yates shuffle, a loop of
``B`` sequential steps (on CPU) or by permuting all ``Nd`` indices (elsewhere); either costs
more than a surrogate-guided SVI step itself. Here, when ``B² ≤ Nd``, ``B`` iid uniform
indices are drawn and the draw is repeated until they are distinct: conditioned on being
distinct, iid uniform draws are uniform over ordered ``B``-tuples of distinct indices, i.e.
exactly a uniform draw without replacement, and a draw is distinct with probability about
``exp(−B² / 2Nd) ≥ 0.6``. Otherwise the ``B`` largest of ``Nd`` iid uniforms (``O(Nd)``,
also exact: the set is uniform and, by exchangeability, so is its order).

Reference: Devroye (1986), "Non-Uniform Random Variate Generation", ch. XII (sampling without
replacement).
"""

import jax
import jax.numpy as jnp


def _distinct(indices: jax.Array) -> jax.Array:
    s = jnp.sort(indices)
    return jnp.all(s[1:] != s[:-1])


def without_replacement(rng_key, size: int, subsample_size: int) -> jax.Array:
    """``(subsample_size,)`` int32 indices of ``range(size)``, all distinct, uniform over
    ordered tuples (a uniformly random mini-batch in a uniformly random order)."""
    if not 1 <= subsample_size <= size < 2**31:
        raise ValueError(
            f"need 1 <= subsample_size <= size < 2**31, got subsample_size={subsample_size} "
            f"and size={size}"
        )
    if subsample_size * subsample_size > size:
        u = jax.random.uniform(rng_key, (size,))
        return jax.lax.top_k(u, subsample_size)[1].astype(jnp.int32)

    def draw(key):
        return jax.random.randint(key, (subsample_size,), 0, size, dtype=jnp.int32)

    def again(carry):
        return ~_distinct(carry[1])

    def redraw(carry):
        key, _ = carry
        key, sub = jax.random.split(key)
        return key, draw(sub)

    return jax.lax.while_loop(again, redraw, redraw((rng_key, None)))[1]
