"""The runtime every job runs on, owned once: its config machinery (:mod:`.config`), identity
(:mod:`.identity`), the output contract (claim, lock, skip, refuse, overwrite and ``_SUCCESS``:
:mod:`.outputs`, :mod:`.locks`, :mod:`.manifest`, :mod:`.atomic`), logging and progress
(:mod:`.logs`, :mod:`.progress`), errors and exit codes (:mod:`.errors`), resources
(:mod:`.placement`) and the executor interface (:mod:`.executor`: in-process here; Ray's in
:mod:`sembridge_ray.distributed.executor`, the only executor that imports Ray)."""
