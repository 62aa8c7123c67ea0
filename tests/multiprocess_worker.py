"""One process of ``tests/test_multiprocess.py``: train a guide with particles and data split
over a mesh, then write what it computed to an ``.npz`` file.

``python -m tests.multiprocess_worker PROCESS_ID NUM_PROCESSES PORT OUT``: with
``NUM_PROCESSES`` 2, one of two processes joined by ``jax.distributed.initialize`` (a
coordinator on ``localhost:PORT``, CPU collectives over gloo); with 1, the one-process
reference, on as many host devices as ``XLA_FLAGS`` gives it. The code after the set-up is
the same in both, as it is on a cluster. Each process writes ``OUT.<process index>.npz``.
"""

import sys

import jax

ROWS = 16


def main(process_id, num_processes, port, out):
    if num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=f"localhost:{port}",
            num_processes=num_processes,
            process_id=process_id,
        )
    import numpy as np
    import numpyro
    import numpyro.distributions as dist
    import optax
    from jax.experimental.multihost_utils import process_allgather
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from numpyro.infer import SVI, Trace_ELBO, init_to_value

    from numpyro_dais import AutoDAIS, run_until_converged

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(X @ w, 0.5), obs=y)

    # every process makes the whole data set, and places only the rows its devices hold
    rng = np.random.default_rng(0)
    X = rng.normal(size=(ROWS, 2)).astype(np.float32)
    y = (X @ np.array([1.0, -0.5]) + 0.5 * rng.normal(size=ROWS)).astype(np.float32)
    mesh = Mesh(np.array(jax.devices()), ("devices",))
    rows = NamedSharding(mesh, PartitionSpec("devices"))
    X, y = (jax.make_array_from_callback(a.shape, rows, lambda i, a=a: a[i]) for a in (X, y))

    # a start far from the posterior: after 2 windows of 20 steps the loss is still falling,
    # so run_until_converged warns; its progress bar and the warning come from process 0
    start = init_to_value(values={"w": np.array([3.0, 3.0], np.float32)})
    guide = AutoDAIS(model, K=2, num_particles=4, mesh=mesh, init_loc_fn=start, laplace_init=False)
    svi = SVI(model, guide, optax.adam(0.05), Trace_ELBO())
    run = run_until_converged(svi, jax.random.key(0), X, y, max_steps=40, window=20, patience=1)
    losses, params = run.losses, run.params
    evidence = guide.log_evidence(jax.random.key(1), params, X, y, num_particles=8, mesh=mesh)
    draws = guide.sample_posterior(
        jax.random.key(2), params, X, y, sample_shape=(4,), method="dais", mesh=mesh
    )

    def gather(tree):  # global arrays (split over the processes' devices) to numpy
        return jax.tree.map(
            lambda x: np.asarray(x if x.is_fully_addressable else process_allgather(x, True)),
            tree,
        )

    results = {
        "losses": gather(losses),
        "log_Z": gather(evidence.log_Z),
        "log_Z_se": gather(evidence.se),
        "ess": gather(evidence.ess),
        **{f"param_{k}": v for k, v in gather(params).items()},
        **{f"draw_{k}": v for k, v in gather(draws).items()},
    }
    where = {
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "local_rows": sum(shard.data.shape[0] for shard in X.addressable_shards),
        "local_draws": sum(shard.data.shape[0] for shard in draws["w"].addressable_shards),
    }
    np.savez(f"{out}.{jax.process_index()}.npz", **results, **where)


if __name__ == "__main__":
    process_id, num_processes, port, out = sys.argv[1:]
    main(int(process_id), int(num_processes), int(port), out)
