"""Every process-global cache of jitted or compiled programs, in one registry: each is a
`ProgramCache` with a bound (least recently used dropped first) and a name, and `clear()`
empties them all (`programs.clear()` calls it; the suite does when a worker holds too
many memory mappings: each XLA:CPU executable maps its JIT code in dozens to hundreds of
regions, and at vm.max_map_count the next compile segfaults).

    _CHUNKS = ProgramCache("prefill chunks", 16)
    exe = _CHUNKS.get(key) or _CHUNKS.put(key, jitted.lower(*args).compile())

The decode programs (programs.py) keep their own LRU of executables, bounded by its
MAX_KEPT, and register their clear() here too.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

_CLEARS: list[Callable[[], None]] = []  # every registered cache's clear, in order made
_LOCK = threading.Lock()


def register(clear: Callable[[], None]) -> None:
    """Have `clear()` call `clear` (a cache kept elsewhere, e.g. programs.py's)."""
    _CLEARS.append(clear)


def clear() -> None:
    """Empty every registered cache."""
    for clear_one in list(_CLEARS):
        clear_one()


class ProgramCache:
    """A bounded LRU map of programs, registered under `name`."""

    def __init__(self, name: str, max_items: int):
        self.name, self.max_items = name, max_items
        self._items: collections.OrderedDict = collections.OrderedDict()
        register(self.clear)

    def get(self, key):
        """The program kept under `key` (now the most recently used), or None."""
        with _LOCK:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key]

    def put(self, key, program):
        """Keep `program` under `key`, dropping the least recently used beyond the bound;
        returns it."""
        with _LOCK:
            self._items[key] = program
            self._items.move_to_end(key)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)
        return program

    def get_or_make(self, key, make: Callable[[], object]):
        """The program under `key`, made by `make()` and kept if there is none."""
        found = self.get(key)
        return found if found is not None else self.put(key, make())

    def clear(self) -> None:
        with _LOCK:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
