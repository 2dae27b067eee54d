"""`rl.checkpoint.store.commit` held on its first call: a checkpoint commit that is still being written (the minutes of
fsync and sha256 of a large model) while the test does something else."""

import threading

from rl.checkpoint import store as checkpoint


class HeldCommit:
    """The store's `commit` (patched with `monkeypatch`) whose first call signals `started` and waits for `release`;
    every call's outcome is kept (a commit thread's error is otherwise lost)."""

    def __init__(self, monkeypatch):
        self.started, self.release = threading.Event(), threading.Event()
        self.outcomes: list[str] = []
        commit = checkpoint.commit

        def held(run_dir, tmp, step, keep):
            if not self.started.is_set():
                self.started.set()
                self.release.wait(timeout=30)
            try:
                final = commit(run_dir, tmp, step, keep)
            except Exception as exc:
                self.outcomes.append(repr(exc))
                raise
            self.outcomes.append(final.name)
            return final

        monkeypatch.setattr(checkpoint, "commit", held)
