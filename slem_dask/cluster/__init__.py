"""Cluster operations: starting or joining a cluster and keeping a job's workers honest.

Owns connecting (:mod:`.connect`: a LocalCluster sized to the machine, or a scheduler's
address), refusing workers too small for a job's tasks (:mod:`.workers`), saying what a
stalled job waits for (:mod:`.watchdog`) and checking what a command will write before a
cluster starts (:mod:`.preflight`). Used by the jobs and the command line only: the
library never creates a client. May import :mod:`slem_dask.core`,
:mod:`slem_dask.storage` and :mod:`slem_dask.parallel`.
"""
