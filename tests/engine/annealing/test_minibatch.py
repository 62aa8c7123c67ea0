"""Uniform mini-batches without replacement: exact frequencies on small cases, both paths."""

import itertools

import jax
import numpy as np
import pytest

from numpyro_dais.engine.annealing import minibatch


@pytest.mark.parametrize(
    "size, subsample_size",
    [(5, 2), (5, 3)],
    ids=["rejection (B² <= Nd)", "top-k (B² > Nd)"],
)
def test_every_ordered_tuple_is_equally_likely(size, subsample_size):
    """All ``size!/(size−B)!`` ordered tuples of distinct indices (20 and 60) appear with
    equal frequency: a chi-square test at the 0.1% level on 60,000 draws (seeded; the
    statistic's 99.9% quantile is 43.8 for 19 and 98.3 for 59 degrees of freedom)."""
    n = 60_000
    keys = jax.random.split(jax.random.key(0), n)
    draws = np.asarray(
        jax.vmap(lambda k: minibatch.without_replacement(k, size, subsample_size))(keys)
    )
    tuples = list(itertools.permutations(range(size), subsample_size))
    index = {t: i for i, t in enumerate(tuples)}
    counts = np.bincount([index[tuple(d)] for d in draws], minlength=len(tuples))
    assert counts.sum() == n  # every draw is a tuple of distinct indices in range
    expected = n / len(tuples)
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert chi2 < {19: 43.8, 59: 98.3}[len(tuples) - 1], chi2


@pytest.mark.parametrize("size, subsample_size", [(10**6, 256), (1000, 256), (256, 256)])
def test_distinct_and_in_range(size, subsample_size):
    draw = jax.jit(minibatch.without_replacement, static_argnums=(1, 2))
    for seed in range(5):
        idx = np.asarray(draw(jax.random.key(seed), size, subsample_size))
        assert idx.dtype == np.int32 and idx.shape == (subsample_size,)
        assert len(set(idx.tolist())) == subsample_size
        assert idx.min() >= 0 and idx.max() < size


def test_bad_sizes_name_both_numbers():
    with pytest.raises(ValueError, match="subsample_size=5 and size=3"):
        minibatch.without_replacement(jax.random.key(0), 3, 5)
