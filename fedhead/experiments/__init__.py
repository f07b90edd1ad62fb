"""UFM experiment suite of docs/theory.md §12 (console script ``fedhead-ufm``).

One module per experiment, each with a frozen ``Settings`` dataclass (``Settings.quick()`` /
``Settings.full()``; tests build smaller ones) and ``run(settings, out_dir) -> ExperimentResult``:

- :mod:`.reference` (``fig2``): the reference instance, panels (a)-(f);
- :mod:`.selection`: proximal joint minimisers select the closest head;
- :mod:`.convergence`: exact selection converges to the BW barycenter;
- :mod:`.gap_terms`: the three PSD gap terms and the BW-variance bounds;
- :mod:`.recovery`: moment correction;
- :mod:`.finite_steps`: E local gradient steps (docs/theory.md §9).

Pure numpy/scipy/matplotlib on top of :mod:`fedhead.ufm`; no torch, no flwr.  The registry
``EXPERIMENTS`` and ``run_experiment`` live in :mod:`.cli` (not imported here, so that the
console script can set its BLAS thread default before numpy loads).
"""
