"""The versioned-store protocol: drafts, atomic commits, fencing, garbage, history.

``versions`` a versioned store (drafts, commits, snapshot reads, history); ``records``
the commit record's format; ``heads`` finding the head; ``publish`` creating a commit
record and reading it back; ``rollback`` its copy-and-commit; ``leases`` one writer per
store; ``gc`` what is garbage, settled by fate files; ``markers`` whose a version folder
is; ``rootmarker`` what plain zarr finds at a store's path; ``ownership`` what
slem-dask wrote and may replace; ``transaction`` one job's write, from its lease to its
commit, the one way every job writes; ``errors`` the errors by which a guarantee is kept.

Imports ``storage.backends`` only.
"""

from .errors import IntegrityError  # noqa: F401
from .leases import LEASE_TTL, Lease, LeaseHeldError, LeaseLostError  # noqa: F401
from .publish import CommitConflictError, CommitUnknownError, describe_storage_error  # noqa: F401
from .records import Commit, VersionError  # noqa: F401
from .transaction import Transaction  # noqa: F401
from .versions import Draft, VersionedStore, resolve  # noqa: F401
