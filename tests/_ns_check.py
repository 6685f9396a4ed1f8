"""Invariants after a partition test, checked on a host of tests/hostns.py:
``python _ns_check.py KIND STORE [MODEL POSITIVES PARTITION_ROWS]``.

For every store: ``verify`` finds nothing wrong, the head names an existing, complete
version whose ``zarr.json`` matches its record, and what a reader reads is that version.
For an encode (KIND ``encode``): the output equals the model's encoding of the positives,
partition by partition. Exits 0 with ``ok``, else 1 with one line saying what broke."""

import sys

import numpy as np

from slem_dask import load_model, storage
from slem_dask.storage.versioning import versions

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from reference import partitionwise  # noqa: E402


def main() -> int:
    kind, store, *rest = sys.argv[1:]
    what, problems = storage.verify(store)
    if problems:
        print(f"verify {store}: {problems}")
        return 1
    vs = versions.VersionedStore(store)
    head = vs.head()
    if head is None:
        print(f"{store}: no committed version")
        return 1
    vs.check(head)  # the head's zarr.json against its record
    if kind == "encode":
        model_path, positives, rows = rest
        model = load_model(model_path)
        got = storage.read_all(store)
        pos = storage.read_all(positives)
        want = partitionwise(lambda p: model.transform(p, dtype="float32"), pos, int(rows))
        if not np.array_equal(got, want):
            print(f"{store}: {int((got != want).sum())} entries differ from the encoding")
            return 1
    print(f"ok {kind} {store} version {head.seq}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
