import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import pytest


def _xla_flags():
    """XLA flags that make compilation cheap; the suite's runs are small, so its time goes to
    XLA compilation, not to running the code.

    * ``--xla_backend_optimization_level=0``: no LLVM optimisation passes (five of the
      slowest tests ran 34% faster on 2 CPU cores).
    * ``--xla_cpu_use_fusion_emitters=false``: XLA:CPU's older loop emitters instead of its
      MLIR fusion emitters, which cost about as much again as the rest of a compile: the
      compile of an AutoDAIS ``svi.update`` took 1.1 s instead of 2.6 s, and the CPU time of
      the suite fell by about 40%.
    * ``--xla_cpu_parallel_codegen_split_count=1``: one LLVM module per program, not one
      split into parts that threads compile in parallel; splitting costs CPU time that 2
      cores, both busy with a test each, cannot recover (compiles took 20% less CPU time).
    * ``--xla_cpu_experimental_ynn_fusion_type=``: no YNNPACK library fusions, as the
      guides compile their own programs (``numpyro_dais.runtime.compilation.CPU_OPTIONS``);
      the fast tier took the same time with it.

    None of them changes a result beyond float32 round-off. A jaxlib that does not know a
    flag aborts on it (jaxlib 0.12 no longer knows the fusion emitters' flag), so the last
    three are added only where a child Python with them starts a backend: all at once, else
    each alone.
    """
    base = "--xla_backend_optimization_level=0"
    extra = [
        "--xla_cpu_use_fusion_emitters=false",
        "--xla_cpu_parallel_codegen_split_count=1",
        "--xla_cpu_experimental_ynn_fusion_type=",
    ]

    def starts(flags):
        probe = subprocess.run(
            [sys.executable, "-c", "import jax; jax.numpy.zeros(()).block_until_ready()"],
            env=dict(os.environ, XLA_FLAGS=" ".join([base, *flags]), JAX_PLATFORMS="cpu"),
            capture_output=True,
            timeout=120,
        )
        return probe.returncode == 0

    if not starts(extra):
        extra = [flag for flag in extra if starts([flag])]
    return " ".join([base, *extra])


# Read when JAX starts its backend, so it must be set before the first computation. Set once,
# in the process that starts the run: pytest-xdist's workers and the subprocesses of the
# suite (notebook kernels, the sharding child, scaling_devices' children) inherit it.
if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = _xla_flags()


def _compilation_cache():
    """One JAX compilation cache for the run's test processes.

    The suite's time is mostly XLA compilation, and many tests compile a program that an
    earlier test, in either pytest-xdist worker, compiled too: the same small model under
    the same guide options, numpyro's eager set-up operations. JAX keys an entry on the
    program's HLO, compile options and versions, so a hit is the program it would compile;
    programs with host callbacks are never cached. With it, pytest's time on 2 cores fell
    from 6:24-6:51 to 5:23-5:33 (clean clones; one cache per worker instead: 5:41; letting
    the smoke runs write it too gained nothing measurable).

    The cache is made by the process that starts the run, so nothing carries over between
    runs. JAX writes an entry in place, and a second worker reading it half-written would
    warn and compile it again, so each test process writes its entries whole
    (:func:`_write_cache_entries_whole`), and the tests' other child processes only read it
    (:func:`_child_processes_only_read_the_cache`). Set through the environment before JAX
    is imported, so that the children inherit it.
    """
    if "NUMPYRO_DAIS_TEST_CACHE" not in os.environ:  # the process that starts the run
        os.environ["NUMPYRO_DAIS_TEST_CACHE"] = tempfile.mkdtemp(prefix="numpyro_dais_jax_cache_")
        atexit.register(shutil.rmtree, os.environ["NUMPYRO_DAIS_TEST_CACHE"], ignore_errors=True)
    os.environ.update(
        JAX_COMPILATION_CACHE_DIR=os.environ["NUMPYRO_DAIS_TEST_CACHE"],
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",  # every program, however small
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    _write_cache_entries_whole()


def _write_cache_entries_whole():
    """Make JAX's file cache write each entry to a temporary file and rename it into place
    (atomic on one file system), so that a reader sees the whole entry or none. Without the
    hook this relies on (a private one: ``jax._src.lru_cache.LRUCache.put``) the cache is
    switched off in this process instead."""
    import jax

    try:
        from jax._src import lru_cache

        put, suffix = lru_cache.LRUCache.put, lru_cache._CACHE_SUFFIX
    except (ImportError, AttributeError):
        jax.config.update("jax_enable_compilation_cache", False)
        return

    def put_whole(self, key, value):
        path = self.path / f"{key}{suffix}"
        if self.eviction_enabled or not key or not isinstance(path, os.PathLike):
            return put(self, key, value)
        if path.exists():
            return
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        part.write_bytes(value)
        os.replace(part, path)

    lru_cache.LRUCache.put = put_whole


_compilation_cache()


@pytest.fixture(scope="session", autouse=True)
def _child_processes_only_read_the_cache():
    """The child processes of the tests (notebook kernels, a benchmark's children, ...) load
    programs from the run's cache but never write it: JAX in a child writes entries in
    place. A pytest child (the sharding child) writes, whole, as every test process does."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1e9")
        yield


#: tests that run for tens of seconds (most in a child process), slowest first (a node id
#: prefix each)
LONG_RUNNING = (
    "tests/test_benchmarks_smoke.py::test_benchmark_smoke[sldais_scaling]",
    "tests/test_benchmarks_smoke.py::test_benchmark_smoke[gpvi_reproduction]",
    "tests/test_notebooks.py::test_notebook_executes",
    "tests/test_sharding.py::test_on_four_host_devices",
    "tests/test_benchmarks_smoke.py",
    "tests/test_examples.py",
    "tests/test_reliability.py::test_sldais_checkpoint_resumes_exactly_in_a_fresh_process",
    "tests/test_docs.py::test_docs_build_strict",
    "tests/test_multiprocess.py",
)

#: The fast tier (``python dev.py test --fast``, that is ``pytest -m "not slow"``) runs every
#: test that is not marked ``slow``. Marked ``slow``: the tests above, those decorated
#: ``@pytest.mark.slow`` in their file, and these, which took 3 s or more each in a run of the
#: whole suite on 2 busy CPU cores (``pytest -n auto --durations=0``; about 1.5 s on idle
#: ones). The rule for a new test: if ``--durations`` shows it above that, add it here (a
#: node id, or its prefix up to a parameter list ``[`` or a file's ``::``); then run the fast
#: tier with ``--durations=20``: a test that is quick in the whole suite but slow there (it
#: compiled a program, or set up a module-scoped fixture, that a slow test shares with it)
#: goes in too. Kept in the fast tier although it takes a few seconds, so that SL-DAIS has a
#: unit test there:
#: ``test_autosldais.py::test_rand_surrogate_is_weighted_likelihood_on_stored_points``.
SLOW = (
    *LONG_RUNNING,
    "tests/engine/setup/test_curvature.py::test_find_mode_reaches_a_logistic_mode_from_a_saturated_start",
    "tests/engine/annealing/test_dais.py::test_incremental_weights_telescope",
    "tests/engine/annealing/test_dais.py::test_tracking_does_not_change_weights",
    "tests/engine/annealing/test_dais.py::test_leapfrog_is_volume_preserving",
    "tests/engine/annealing/test_dais.py::test_zero_step_size_reduces_to_iwvi",
    "tests/engine/annealing/test_dais.py::test_cholesky_gaussian_matches_scipy",
    "tests/engine/annealing/test_dais0.py::test_symmetrized_kl_matches_closed_form",
    "tests/engine/annealing/test_dais0.py::test_symmetrized_kl_gradient_matches_finite_differences",
    "tests/engine/annealing/test_dais0.py::test_minimiser_is_the_geometric_mean_of_reverse_and_forward_kl_stds",
    "tests/engine/vi/test_gpvi.py::test_median_bandwidth_and_kernel_gradient",
    "tests/engine/vi/test_gpvi.py::test_ksd_separates_target_from_a_wrong_fit",
    "tests/engine/vi/test_gpvi.py::test_exact_inverse_transpose_on_a_linear_generator",
    "tests/engine/vi/test_gpvi.py::test_helper_converges_to_the_exact_solve",
    "tests/engine/vi/test_gpvi.py::test_pullback_vanishes_at_the_target_generator",
    "tests/engine/smc/test_resampling.py::test_gst_take_is_exact_forward_and_differentiable",
    "tests/engine/smc/test_smc.py::test_log_Z_se_matches_the_spread_of_independent_systems",
    "tests/engine/smc/test_smc.py::test_gradients_finite_and_gst_changes_only_the_gradient",
    "tests/engine/smc/test_smc.py::test_stop_gradient_resampling_treats_ancestors_as_constants",
    "tests/test_arviz.py::test_groups_dims_and_evidence_attrs",
    "tests/test_arviz.py::test_log_likelihood_is_pointwise_and_exact",
    "tests/test_arviz.py::test_summary_loo_and_compare_work",
    "tests/test_arviz.py::test_numpyro_autoguide_and_subsampled_model",
    "tests/annealed/test_autodais.py::test_bound_below_log_Z_and_log_evidence_converges",
    "tests/test_convergence.py::test_an_annealed_guide_is_judged_by_its_self_check_once",
    "tests/annealed/test_autodais.py::test_bound_rises_with_num_particles",
    "tests/annealed/test_autodais.py::test_log_evidence_se_matches_the_spread_of_independent_estimates",
    "tests/annealed/test_autodais.py::test_loss_gradient_matches_finite_differences",
    "tests/annealed/test_autodais.py::test_bound_rises_with_K",
    "tests/annealed/test_autodais.py::test_loss_is_minus_the_bound_for_every_elbo",
    "tests/annealed/test_autodais.py::test_sym_kl_term_moves_only_q0_location",
    "tests/annealed/test_autodais.py::test_dais0_default_gets_the_exact_mean_and_covariance",
    "tests/annealed/test_autodais.py::test_transport_check_fires_on_a_transported_q0_only",
    "tests/annealed/test_autodais.py::test_model_parameter_learned_jointly",
    "tests/annealed/test_autodais.py::test_beta_bernoulli",
    "tests/annealed/test_autodais.py::test_logistic_regression",
    "tests/annealed/test_autodais.py::test_deterministic_and_constrained_sites",
    "tests/annealed/test_autodais.py::test_predictive_agrees_with_sample_posterior",
    "tests/annealed/test_autodais.py::test_sample_posterior_batch_size_and_methods",
    "tests/annealed/test_autodais.py::test_autoguidelist_composition",
    "tests/annealed/test_autodais.py::test_divergent_particles_are_dropped_and_reported",
    "tests/annealed/test_autodais.py::test_divergence_check_changes_nothing_on_a_healthy_run",
    "tests/annealed/test_autodais.py::test_subsample_plate_points_to_sldais",
    "tests/annealed/test_autodais.py::test_local_latents_error",
    "tests/annealed/test_autodais.py::test_numpy_params_accepted",
    "tests/annealed/test_autodais.py::test_dynamics_use_the_data_of_the_current_call",
    "tests/annealed/test_autodsmcs.py::test_loss_is_minus_the_smc_bound",
    "tests/annealed/test_autodsmcs.py::test_train_resample_when_changes_the_loss_only",
    "tests/annealed/test_autodsmcs.py::test_never_equals_autodais_loss",
    "tests/annealed/test_autodsmcs.py::test_svi_trains_and_posterior_agrees",
    "tests/annealed/test_autodsmcs.py::test_predictive_matches_sample_posterior",
    "tests/annealed/test_autodsmcs.py::test_diagnostics",
    "tests/annealed/test_autodsmcs.py::test_model_without_arguments",
    "tests/annealed/test_autodsmcs.py::test_sample_posterior_methods_and_shapes",
    "tests/annealed/test_autodsmcs.py::test_plot_ess",
    "tests/annealed/test_autodsmcs.py::test_median_and_quantiles_follow_the_posterior_method",
    "tests/annealed/test_pareto_k.py",
    "tests/test_arviz.py::test_several_fits_are_chains",
    "tests/test_arviz.py::test_pareto_k_of_the_evidence_weights_in_the_attributes",
    "tests/gpvi/test_autogpvi.py::test_amortized_svgd_runs_and_reports_a_finite_monitor",
    "tests/gpvi/test_autogpvi.py::test_surrogate_value_and_model_parameter_gradient",
    "tests/gpvi/test_autogpvi.py::test_diverged_helper_warns_and_falls_back",
    "tests/gpvi/test_autogpvi.py::test_sample_posterior_predictive_median_quantiles",
    "tests/semidais/test_autosemidais.py::test_bound_is_log_evidence_when_every_stage_is_exact",
    "tests/semidais/test_autosemidais.py::test_bound_is_unbiased_under_subsampling",
    "tests/semidais/test_autosemidais.py::test_more_transitions_beat_fewer_and_mean_field",
    "tests/semidais/test_autosemidais.py::test_local_only_model_with_an_amortised_base",
    "tests/semidais/test_autosemidais.py::test_nested_full_plates_and_event_dims",
    "tests/semidais/test_autosemidais.py::test_inadmissible_models_raise_clear_errors",
    "tests/semidais/test_autosemidais.py::test_vae_smoke_with_an_encoder_base",
    "tests/semidais/test_autosemidais.py::test_sample_posterior_on_a_given_subset_and_predictive",
    "tests/semidais/test_autosemidais.py::test_langevin_kernel_trains",
    "tests/semidais/test_autosemidais.py::test_defaults_get_the_globals_within_a_tenth_of_an_sd",
    "tests/semidais/test_autosemidais.py::test_several_particles_per_member_tighten_the_bound_and_stay_exact",
    "tests/semidais/test_autosemidais.py::test_log_evidence_of_a_trained_guide_brackets_the_exact_value",
    "tests/semidais/test_autosemidais.py::test_draws_for_any_set_of_members_and_arviz_export",
    "tests/semidais/test_autosemidais.py::test_diverged_chains_fall_back_warn_and_shrink_their_steps",
    "tests/semidais/test_autosemidais.py::test_default_step_sizes_come_from_the_local_curvature",
    "tests/semidais/test_autosemidais.py::test_divergence_reports_can_be_turned_off",
    "tests/semidais/test_autosemidais.py::test_the_laplace_base_follows_the_globals_and_makes_each_term_exact",
    "tests/semidais/test_autosemidais.py::test_the_global_guide_and_the_expansion_points_start_at_the_nested_laplace_fit",
    "tests/semidais/test_autosemidais.py::test_the_control_variate_cuts_the_subsampling_noise_and_keeps_the_mean",
    "tests/semidais/test_autosemidais.py::test_a_normal_hierarchy_is_right_on_every_coordinate",
    "tests/annealed/test_autosldais.py::test_reduces_to_dais",
    "tests/annealed/test_autosldais.py::test_sldsmcs_with_a_full_data_target_is_dsmcs",
    "tests/annealed/test_autosldais.py::test_sldsmcs_that_never_resamples_is_sldais",
    "tests/annealed/test_autosldais.py::test_sldsmcs_trains",
    "tests/annealed/test_autosldais.py::test_bound_expectation_independent_of_batch_size",
    "tests/annealed/test_autosldais.py::test_multi_particle_shares_the_model_minibatch_and_warns",
    "tests/annealed/test_autosldais.py::test_dynamics_see_current_model_params_and_data",
    "tests/annealed/test_autosldais.py::test_naive_dynamics_use_rescaled_minibatch",
    "tests/annealed/test_autosldais.py::test_sample_posterior_without_data",
    "tests/annealed/test_autosldais.py::test_errors",
    "tests/annealed/test_autosldais.py::test_parameter_names_match_autodais",
    "tests/annealed/test_autosldais.py::test_the_model_minibatch_is_drawn_by_the_guide_only_for_a_subsampled_loss",
    "tests/annealed/test_autosldais.py::test_control_variate_makes_minibatch_gradients_as_precise_as_the_full_data",
    "tests/annealed/test_autosldais.py::test_defaults_trained_to_convergence_find_the_posterior_of_a_large_data_set",
    "tests/test_packaging.py::test_fresh_venv_installs_the_wheel_and_imports_every_public_name",
    "tests/test_packaging.py::test_wheel_and_sdist_contents",
    "tests/test_readme.py::test_snippets_run_as_they_stand",
    "tests/test_reliability.py::test_stiff_regression_trains_to_the_exact_posterior",
    "tests/test_reliability.py::test_laplace_start_is_the_mode_from_a_saturated_initial_point",
    "tests/test_reliability.py::test_well_scaled_posterior_is_not_reported",
    "tests/test_reliability.py::test_flat_prior_fits",
    "tests/test_reliability.py::test_predictive_on_new_inputs",
    "tests/test_reliability.py::test_gpvi_steers_out_of_a_nan_region",
    "tests/test_reliability.py::test_repeated_calls_reuse_their_compiled_programs",
    "tests/test_reliability.py::test_set_up_finds_numpyros_initial_point_in_one_program",
    "tests/test_reliability.py::test_upstream_subsample_case_is_a_clear_error",
    "tests/test_reliability.py::test_upstream_subsample_case_trains_gpvi",
    "tests/test_reliability.py::test_eager_loss_equals_the_jitted_loss",
    "tests/annealed/test_setup.py::test_uncentred_regression_gets_the_posterior_with_default_settings",
    "tests/annealed/test_setup.py::test_eight_schools_non_centred",
    "tests/annealed/test_setup.py::test_a_hierarchy_starts_at_its_bulk_not_its_mode",
    "tests/test_noncentre.py::test_auto_noncentres_the_funnel_silently",
    "tests/test_noncentre.py::test_noncentred_guide_is_the_guide_of_the_noncentred_model",
    "tests/test_noncentre.py::test_log_joint_is_numpyros_locscalereparam",
    "tests/test_noncentre.py::test_summaries_and_predictive_give_model_values",
    "tests/annealed/test_setup.py::test_ode_model_sets_up_and_fits",
    "tests/annealed/test_setup.py::test_training_resumes_exactly_from_a_saved_state",
    "tests/annealed/test_setup.py::test_q0_used_as_the_posterior_is_checked_once",
    "tests/annealed/test_setup.py::test_a_centred_funnel_without_a_mode_is_loud",
    "tests/annealed/test_setup.py::test_a_q0_narrower_than_the_posterior_is_loud_though_the_end_points_agree",
    "tests/semidais/test_autosemidais.py::test_a_flat_local_density_gives_a_loud_default_step_size",
    "tests/semidais/test_autosemidais.py::test_log_evidence_covers_the_whole_plate_and_is_exact_when_every_stage_is_exact",
    "tests/semidais/test_autosemidais.py::test_member_target_gradients_are_those_of_the_batch",
    "tests/gpvi/test_autogpvi.py::test_generator_gradient_is_the_pulled_back_direction",
    "tests/test_arviz.py::test_r_hat_flags_fits_that_did_not_converge",
    "tests/engine/diagnostics/test_psis.py::test_exact_sampling_has_no_tail",
    "tests/engine/diagnostics/test_psis.py::test_matches_numpyro_psis_diagnostic",
    "tests/annealed/test_chunked.py::test_chunked_draws_equal_one_program_over_all_draws",
    "tests/annealed/test_autodais.py::test_q0_is_the_posterior_object",
    "tests/annealed/test_autodais.py::test_dynamics_use_the_current_model_parameters",
    "tests/test_noncentre.py::test_auto_keeps_a_hierarchy_with_a_mode_centred",
)


def _matches(nodeid, prefix):
    """Whether ``prefix`` names the test ``nodeid``: the node id itself, the test function of
    a parametrized test, or the file."""
    if nodeid == prefix:
        return True
    return nodeid.startswith(prefix + ("::" if prefix.endswith(".py") else "["))


def _rank(item):
    return next((i for i, p in enumerate(LONG_RUNNING) if _matches(item.nodeid, p)), None)


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by marker (-m)
def pytest_collection_modifyitems(config, items):
    """Mark the tests of :data:`SLOW` ``slow``; then order the run (below)."""
    for item in items:
        if any(_matches(item.nodeid, p) for p in SLOW):
            item.add_marker(pytest.mark.slow)
    _spread_long_running(items)


def _spread_long_running(items):
    """Spread the long-running tests over the first 60% of the run, slowest first, so that
    with pytest-xdist both workers get some of them early and the run does not end on one of
    them while the other worker waits. The rest keep their order, and a long test goes in
    only between two test files, so that no module-scoped fixture is set up twice. The
    order changes no result: every test sets up its own state."""
    ranked = sorted((r, i) for i, item in enumerate(items) if (r := _rank(item)) is not None)
    if not ranked:
        return
    long = [items[i] for _, i in ranked]
    rest = [item for item in items if _rank(item) is None]
    step = 0.6 * len(items) / len(long)
    order = []
    for k, item in enumerate(long):
        while rest and (len(order) < round(k * step) or (order and order[-1].path == rest[0].path)):
            order.append(rest.pop(0))
        order.append(item)
    items[:] = order + rest


@pytest.fixture(autouse=True)
def _no_numpyro_mismatch_warnings():
    """numpyro's own test config turns model/guide mismatch warnings into errors; so do we."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*(not found in|missing).*guide.*")
        yield


@pytest.fixture(autouse=True)
def _q0_self_check_only_where_tested(request, monkeypatch):
    """The self-check compiles and runs its chains the first time each set of params is used
    for q0 draws (or importance draws of one particle): seconds per test, against a
    5000-step fit's few percent. Its own tests (``test_setup.py``, ``test_convergence.py``)
    run it; tests of other behaviour skip it (the importance draws are then judged by k̂)."""
    if request.module.__name__.split(".")[-1] in ("test_setup", "test_convergence"):
        yield
        return
    from numpyro_dais.annealed.checking import SelfCheckingGuide

    monkeypatch.setattr(SelfCheckingGuide, "_self_check_report", lambda self, params: None)
    yield
