"""Say a thing once: the log lines and warnings that would otherwise repeat with every request
or every load."""

from __future__ import annotations


class SaidOnce:
    """What has been said, each key once, for the first `limit` keys (clients may send anything:
    past that, nothing more is said)."""

    def __init__(self, limit: int):
        self.limit, self._seen = limit, set()

    def first(self, key) -> bool:
        """True the first time `key` comes (and it is kept), False after, or once `limit` are kept."""
        if key in self._seen or len(self._seen) >= self.limit:
            return False
        self._seen.add(key)
        return True

    def __len__(self) -> int:
        return len(self._seen)
