"""What a stalled job waits for, in words: the workers that hold its tasks (not heard
from, paused by dask for memory, or answering with long tasks), a scheduler with no
worker, and the remedy for each. Pure functions of the state that
:mod:`.watchdog`'s probe reads on the scheduler."""

from __future__ import annotations


def _label(address: str, info: dict) -> str:
    name = info.get("name", "")
    return address if not name or name == address else f"{address} ({name})"


def describe(state: dict) -> str:
    """The workers a stalled job waits for, e.g. "worker tcp://h:1 (w0; 2 tasks; not heard
    from for 58 s: stopped, swapping or cut off)"."""
    if _no_workers(state):
        return "a worker: the scheduler has none connected"
    parts = []
    for address, count in sorted(state["processing"].items()):
        info = state["workers"].get(address, {})
        notes = [f"{count} task{'s' if count > 1 else ''}"]
        if info.get("silent"):
            notes.append(f"not heard from for {info['silent']:.0f} s: stopped, swapping or cut off")
        elif info.get("status") == "paused":
            notes.append(_paused(info))
        elif info.get("status") not in (None, "running"):
            notes.append(f"status {info['status']}")
        else:
            notes.append("responding: its tasks still run, or wait for their inputs")
        parts.append(f"{_label(address, info)} ({'; '.join(notes)})")
    for address, count in sorted(state.get("inputs", {}).items()):
        info = state["workers"].get(address, {})
        if info.get("silent"):  # holds data the running tasks need, and is silent
            parts.append(
                f"{_label(address, info)} (holds inputs of {count} of those tasks; "
                f"not heard from for {info['silent']:.0f} s: stopped, swapping or "
                f"cut off)"
            )
    for address, info in sorted(state.get("paused", {}).items()):
        if address not in state["processing"]:
            parts.append(f"{_label(address, info)} ({_paused(info)})")
    if state["no_worker"] and state.get("paused"):
        parts.append(
            f"{state['no_worker']} task(s) that wait for a worker that is not "
            f"paused ({state['n_workers']} worker(s) connected)"
        )
    elif state["no_worker"]:
        parts.append(
            f"{state['no_worker']} task(s) that no connected worker can run "
            f"({state['n_workers']} worker(s) connected)"
        )
    if not parts:
        return "tasks queued on the scheduler"
    return ("worker " if len(parts) == 1 and state["processing"] else "workers: ") + ", ".join(
        parts
    )


def _paused(info: dict) -> str:
    """Why dask paused a worker, in its scheduler's figures."""
    memory, limit = info.get("memory", 0), info.get("limit", 0)
    held = f"its process holds {memory / 2**20:.0f} MiB" + (
        f", {memory / limit:.0%} of its {limit / 2**20:.0f} MiB memory limit" if limit else ""
    )
    return f"paused by dask for memory: {held}; it takes no task until it holds less"


def _paused_remedy(state: dict) -> str:
    one = len(state.get("paused", {})) == 1
    return (
        f"give the workers more memory (dask worker --memory-limit) or fewer threads, "
        f"pass a smaller --partition-rows, or restart {'that worker' if one else 'them'} "
        f"to free what {'it holds' if one else 'they hold'} "
        f"(distributed.worker.memory.pause sets the threshold)"
    )


def _no_workers(state: dict) -> bool:
    """Whether the scheduler has no worker at all (a --scheduler whose workers never
    started, or have all gone): nothing runs, and no worker is there to restart."""
    return state.get("n_workers") == 0 and not state["processing"]


def remedy(state: dict, why: bool = True) -> str:
    if _no_workers(state):
        return (
            f"start workers for this scheduler (`dask worker "
            f"{state.get('address') or 'SCHEDULER_ADDRESS'}`), or give no scheduler address "
            f"(--scheduler, DASK_SCHEDULER_ADDRESS) to start local ones"
        )
    if state.get("paused") and not any(
        state["workers"].get(a, {}).get("silent") for a in state["processing"]
    ):
        return _paused_remedy(state)
    one = (
        len(state["processing"])
        + sum(1 for a in state.get("inputs", {}) if state["workers"].get(a, {}).get("silent"))
        == 1
    )
    text = "check or restart " + ("that worker" if one else "those workers")
    if why:
        text += " (its tasks then run elsewhere)" if one else " (their tasks then run elsewhere)"
    return text


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def long_tasks(state: dict) -> bool:
    """Whether the tasks waited for all run on workers that answer and are not paused:
    slow tasks, not a worker to restart."""
    workers = state["workers"]
    return (
        bool(state["processing"])
        and not state.get("paused")
        and not state["no_worker"]
        and all(
            not workers.get(a, {}).get("silent") and workers.get(a, {}).get("status") == "running"
            for a in [*state["processing"], *state.get("inputs", {})]
        )
    )


def running(state: dict) -> str:
    parts = [
        f"{n} on {_label(a, state['workers'].get(a, {}))}"
        for a, n in sorted(state["processing"].items())
    ]
    count = sum(state["processing"].values())
    return (
        f"{count} task{'s' if count > 1 else ''} running ({', '.join(parts)}; "
        f"{'it answers' if len(parts) == 1 else 'they answer'})"
    )
