"""quarl's bottom layer: what every other package may import and which imports no other
quarl package. Errors (:mod:`~quarl.core.errors`), crash-safe writes
(:mod:`~quarl.core.atomic`), typed readers of the files quarl writes
(:mod:`~quarl.core.records`, :mod:`~quarl.core.file_schema`), size limits on what a file
may claim (:mod:`~quarl.core.limits`), the checks on command-line values
(:mod:`~quarl.core.validate`), provenance, logging, timing and the Ray connection."""
