"""Small MLPs as plain JAX pytrees: the GPVI generator and helper networks.

A layer is a pair ``(W (d_in, d_out), b (d_out,))``; a network is a list of layers. Inputs
may carry any leading batch shape.

Reference: Ratzlaff, Bai, Fuxin & Xu (ICML 2021), "Generative particle variational inference
via estimation of functional gradients" (GPVI), sec. 3.2–3.3 and app. B.
"""

import jax
import jax.numpy as jnp

Layer = tuple[jax.Array, jax.Array]


def dense_init(key, d_in: int, d_out: int, scale: float = 1.0, bias=None) -> Layer:
    """He-style init ``W ~ N(0, 2·scale²/d_in)``; ``b = bias`` (default 0)."""
    w = jax.random.normal(key, (d_in, d_out)) * scale * jnp.sqrt(2.0 / max(d_in, 1))
    b = jnp.zeros(d_out) if bias is None else jnp.broadcast_to(jnp.asarray(bias), (d_out,))
    return w, b


def dense(layer: Layer, x: jax.Array) -> jax.Array:
    w, b = layer
    return x @ w + b


def mlp_init(key, sizes, out_scale: float = 1.0, out_bias=None) -> list[Layer]:
    """MLP ``sizes[0] → … → sizes[-1]``; the output layer's weights are scaled by
    ``out_scale`` and its bias set to ``out_bias``."""
    keys = jax.random.split(key, len(sizes) - 1)
    pairs = zip(keys[:-1], sizes[:-2], sizes[1:-1], strict=True)
    layers = [dense_init(k, a, b) for k, a, b in pairs]
    layers.append(dense_init(keys[-1], sizes[-2], sizes[-1], out_scale, out_bias))
    return layers


def mlp_apply(layers: list[Layer], x: jax.Array) -> jax.Array:
    """ReLU hidden layers, linear output."""
    for layer in layers[:-1]:
        x = jax.nn.relu(dense(layer, x))
    return dense(layers[-1], x)


# -- generator f_θ(ε) = g_θ(ε_{1:k}) + λ ε --------------------------------------------------


def generator_init(
    key, noise_dim: int, dim: int, hidden_dims=(), loc=None, out_scale: float = 1.0
) -> list[Layer]:
    """Layers of ``g_θ : R^k → R^D``; its output bias starts at ``loc (D,)``."""
    return mlp_init(
        key, (noise_dim, *hidden_dims, dim), out_scale, jnp.zeros(dim) if loc is None else loc
    )


def generator_apply(layers: list[Layer], lam, eps: jax.Array) -> jax.Array:
    """``f_θ(ε) = g_θ(ε_{1:k}) + λ ε`` for ``ε (..., D)``; ``k`` is read from the first layer."""
    k = layers[0][0].shape[0]
    return mlp_apply(layers, eps[..., :k]) + lam * eps


# -- helper h_η(ε_{1:k}, v) ≈ J_f(ε)^{-T} v -----------------------------------------------------


def helper_init(
    key, noise_dim: int, dim: int, hidden: int = 100, num_layers: int = 2, out_scale: float = 0.1
) -> list[Layer]:
    """Reference architecture: ``Linear(k→H)`` on ε and ``Linear(D→H)`` on v, concatenated,
    ``num_layers`` × ``Linear(2H→2H)+ReLU``, then ``Linear(2H→D)``.

    Layers in order ``[eps_in, v_in, hidden_1, …, hidden_L, out]``.
    """
    if not 1 <= num_layers <= 3:
        raise ValueError(f"`num_layers` must lie in [1, 3], got {num_layers!r}.")
    keys = jax.random.split(key, num_layers + 3)
    layers = [dense_init(keys[0], noise_dim, hidden), dense_init(keys[1], dim, hidden)]
    layers += [dense_init(k, 2 * hidden, 2 * hidden) for k in keys[2:-1]]
    layers.append(dense_init(keys[-1], 2 * hidden, dim, out_scale))
    return layers


def helper_apply(layers: list[Layer], eps_k: jax.Array, v: jax.Array) -> jax.Array:
    """``h_η(ε_{1:k}, v)`` for ``ε_{1:k} (..., k)``, ``v (..., D)`` → ``(..., D)``."""
    a = dense(layers[0], eps_k)
    b = dense(layers[1], v)
    a = jnp.broadcast_to(a, b.shape[:-1] + a.shape[-1:])
    x = jnp.concatenate([a, b], axis=-1)
    for layer in layers[2:-1]:
        x = jax.nn.relu(dense(layer, x))
    return dense(layers[-1], x)
