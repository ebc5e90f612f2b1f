"""KV caches kept between `generate` calls, found by the content of the prompt.

    store = PrefixStore(64)
    kv, n = store.lookup(ids)          # the longest kept prefix of ids (n tokens), or (None, 0)
    store.keep(ids, kv)                # after a row finished: its prompt + the sampled ids fed
    store.keep(ids[:k], kv, shared=True)   # the system turn every episode of a suite shares

Keys are (length, digest of the ids). The KV of a position depends only on the ids up to it, so
any kept prefix is exact for fixed weights: an episode's previous turn, another seed's identical
history, or the system turn. Entries stay until evicted (LRU: `capacity` turns, 8 system turns);
the engine that kept them must not change its weights (a trainer makes a new policy per update).
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

SHARED = 8


def key(ids: list[int]) -> tuple[int, bytes]:
    return len(ids), hashlib.blake2b(array("i", ids).tobytes(), digest_size=20).digest()


class PrefixStore:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._turns: OrderedDict = OrderedDict()     # key -> per layer (keys, values) [heads, n, dim]
        self._shared: OrderedDict = OrderedDict()

    def lookup(self, ids: list[int]):
        """(per-layer KV, n) of the longest kept prefix of `ids` that leaves at least one new token
        to feed, or (None, 0)."""
        raw = array("i", ids).tobytes()
        for n in sorted({n for n, _ in self._turns} | {n for n, _ in self._shared}, reverse=True):
            if n > len(ids) - 1:
                continue
            k = (n, hashlib.blake2b(raw[:4 * n], digest_size=20).digest())
            for store in (self._turns, self._shared):
                if k in store:
                    store.move_to_end(k)
                    return store[k], n
        return None, 0

    def has_shared(self, ids: list[int]) -> bool:
        return key(ids) in self._shared

    def keep(self, ids: list[int], kv: list, *, shared: bool = False) -> None:
        store, cap = (self._shared, SHARED) if shared else (self._turns, self.capacity)
        if cap <= 0:
            return
        store[key(ids)] = kv
        store.move_to_end(key(ids))
        while len(store) > cap:
            store.popitem(last=False)
