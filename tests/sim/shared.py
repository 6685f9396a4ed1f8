"""Local-disk semantics (issue 38, item 5): a second store ``Q`` beside ``P`` whose
``versions/`` is a symlink to ``P``'s (as a user tidying disks might make), with a
history and a writer of its own; and a user's symlink inside ``P``, named like a draft,
to a folder of theirs. Every check of :mod:`.checks` then holds for Q's kept versions
too (they lie in P's versions/ folder), and nothing is deleted through the symlink."""

from __future__ import annotations

from . import checks, jobs

Q = jobs.OTHER[len("sim://") :]
#: a user's folder, reached from inside P by a symlink named like a draft
USER_FOLDER = "bucket/other/userdir"
USER_LINK = f"{checks.VERSIONS}00000009-0123456789ab"


def setup(world, history) -> list:
    """Make the links and Q's history (``history``: run._history); the plan entries of
    Q's writer."""
    server = world.server
    server.link_folder(f"{Q}/versions", checks.VERSIONS[:-1])
    server.seed_user_object(f"{USER_FOLDER}/data.bin")
    server.link_folder(USER_LINK, USER_FOLDER)
    server.others = [f"{Q}/commits/"]
    history(world, world.rng.randint(1, 4), f"{Q}/commits/")
    n = world.rng.randint(1, 3)

    def command(run):
        job = f"other writer run {run}"
        return job, lambda: jobs.writer_group("Q", n, job, path=jobs.OTHER)

    return [("other writer", "other writer", command, "Q")]
