"""Policy hot reload: validate fully, then swap one reference. Triggers: file change, SIGHUP, admin API.

Requests read the policy once at arrival and keep that object, so a swap never changes a request in flight.
A document that is empty, cut short or invalid is refused whole (gateway/livepolicy/policy.py:
load_policy_text).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
from watchfiles import awatch

from gateway.livepolicy.policy import Policy, PolicyError, diff_policies, load_policy, load_policy_text
from gateway.observability import metrics

log = logging.getLogger("omnigate.policy")

SETTLE_S = 0.5  # a changed file is read only once it has held still this long: a save in progress never is


def _content(path: Path) -> bytes | None:
    """The file's bytes (through any symlink, as a ConfigMap mounts it); None while it cannot be read."""
    try:
        return path.read_bytes()
    except OSError:
        return None


async def _settled(path: Path, content: bytes | None) -> bytes | None:
    """The file's content once two reads SETTLE_S apart agree."""
    while True:
        await anyio.sleep(SETTLE_S)
        again = _content(path)
        if again == content:
            return content
        content = again


@dataclass(slots=True)
class ReloadResult:
    result: str  # applied | unchanged | invalid
    changes: list[str]
    error: str | None = None


class PolicyHolder:
    """Holds the current policy; `current` is one attribute read, safe from any task."""

    def __init__(self, path: str | Path | None, policy: Policy | None = None) -> None:
        self.path = Path(path) if path else None
        self.current: Policy = (
            policy if policy is not None else (load_policy(self.path) if self.path else Policy())
        )
        self.last_error: str | None = None
        self._lock = anyio.Lock()
        self._preparers: list[Callable[[Policy], Callable[[], None]]] = []

    def add_preparer(self, prepare: Callable[[Policy], Callable[[], None]]) -> None:
        """Register a stage that builds its state from a candidate policy (raising ValueError if it cannot)
        and returns the commit that installs it; commits run only once every stage has prepared."""
        self._preparers.append(prepare)

    def __call__(self) -> Policy:
        return self.current

    async def reload(self, content: bytes | None = None) -> ReloadResult:
        """Load the file (or `content`, the file's bytes the watcher already read), validate every stage's
        part of it, then swap; an invalid document changes nothing."""
        async with self._lock:
            if self.path is None:
                return ReloadResult("unchanged", [])
            try:
                if content is None:
                    new = load_policy(self.path)
                else:
                    new = load_policy_text(content.decode("utf-8", errors="replace"), str(self.path))
                commits = [prepare(new) for prepare in self._preparers]
            except (PolicyError, ValueError) as e:
                self.last_error = str(e)
                metrics.POLICY_RELOADS.labels("invalid").inc()
                log.error("policy reload refused, keeping the running policy: %s", e)
                return ReloadResult("invalid", [], str(e))
            changes = diff_policies(self.current, new)
            self.last_error = None
            if not changes:
                metrics.POLICY_RELOADS.labels("unchanged").inc()
                return ReloadResult("unchanged", [])
            for commit in commits:
                commit()
            self.current = new
            metrics.POLICY_RELOADS.labels("applied").inc()
            log.info("policy reloaded from %s: %s", self.path, "; ".join(changes))
            return ReloadResult("applied", changes)

    async def watch_file(self) -> None:
        """Reload when the policy file's content changes, once it has settled.

        The folder is watched, not the file, to catch editors' atomic renames and Kubernetes ConfigMap
        symlink swaps; any event there costs one read of the file, and only new content leads further.
        New content is read again every SETTLE_S until two reads agree, so a burst of writes (a
        non-atomic save, a truncate then a write) is one reload of what the writer ended with.
        """
        if self.path is None:
            return
        seen = _content(self.path)
        # rust_timeout bounds how long the watcher thread blocks, so shutdown is not held up for seconds
        async for _changes in awatch(self.path.parent, debounce=200, step=50, rust_timeout=500):
            content = _content(self.path)
            if content == seen:
                continue  # another file in the folder, or a write that changed nothing
            settled = await _settled(self.path, content)
            if settled == seen:
                continue
            seen = settled
            if settled is None:
                log.error("policy file %s is gone; keeping the running policy", self.path)
                continue
            await self.reload(settled)

    async def watch_sighup(self) -> None:
        """Reload on SIGHUP; only the main thread may own signal handlers (tests run apps in threads)."""
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        with anyio.open_signal_receiver(signal.SIGHUP) as signals:
            async for _ in signals:
                log.info("SIGHUP: reloading policy")
                await self.reload()
