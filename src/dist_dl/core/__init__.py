"""The helpers every stage uses: where data lives, settings, secrets out of
what is stored, a process's place in its job, the Spark session, integrity
of shared files, optional imports, the TensorFlow lines' differences.

This package imports no stage (prepare, read, launch, tracking, score, train,
ensemble, search) and nothing of the application (`dist_dl.app`);
``tests/test_design.py`` checks it. Import its modules directly
(``from dist_dl.core.locations import local_path``).
"""
