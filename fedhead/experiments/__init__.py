"""The UFM experiment suite of docs/theory.md §12 (console script ``fedhead-ufm``).

One module per experiment (``reference``, ``selection``, ``convergence``, ``gap_terms``,
``recovery``, ``finite_steps``), each with a frozen ``Settings`` dataclass (``quick()``/``full()``)
and ``run(settings, out_dir) -> ExperimentResult``. The registry is in `fedhead.cli.ufm`, so the
console script sets its BLAS thread default before numpy loads.
"""
