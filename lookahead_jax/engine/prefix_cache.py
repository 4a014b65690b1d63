"""The prefix cache: prompt K/V kept on the device across requests, in blocks of BLOCK
positions (models/kv_pool.py), so that a prompt that starts like an earlier one is
prefilled only from where they part.

A block is named by a hash chain over the prompt, as vLLM's automatic prefix caching
names them: block j's key is hash(key of block j-1, tokens j*BLOCK .. (j+1)*BLOCK - 1), so
one key stands for the whole prefix up to the block's end, and two prompts share block j's
K/V exactly when they share their first (j+1)*BLOCK tokens (K/V at a position depends on
every token up to it, and on nothing after). Keys are 16-byte BLAKE2b digests: a false
match would silently change tokens, so the chain uses a cryptographic hash, not
Python's 64-bit `hash`.

    hits(prompt)      the pool ids of its longest run of leading blocks held (touched:
                      the least recently used block is evicted first)
    split(prompts)    which of a batch's prompts to prefill now, and which wait for an
                      earlier one's blocks (rows of a batch share a prefix's prefill)
    claim(prompts)    pool ids for the blocks of prefilled prompts not held yet (free
                      ones first, then the least recently used evicted), to be stored
    claim_chunk(...)  pool ids for a chunk's blocks (chunked prefill)

Recency: every lookup and store touches the prompt's chain deepest block first, so its
first block is the most recent and eviction takes chains from their ends (a chain that
lost its first block is of no use). Example, a pool of 4 blocks: prompt A's blocks a0,
a1, a2 are stored (LRU order a2 a1 a0), then prompt B's b0, b1: b0 takes the free block,
b1 evicts a2, leaving a1 a0 b1 b0 — A keeps its first two blocks.

The device pool is bounded by a memory budget (`budget_mb`): N = budget / (bytes of one
block's K and V over every layer). Blocks are copied into a row's cache at its prefill
and never referenced after it, so evicting one never touches a row in flight; device
programs run in the order they were called, so a block claimed (and overwritten) after a
prefill that read it does not change that prefill.

Exactness: a row that starts from cached blocks runs the rest of its prompt as one
causal pass over them — the same attention a lookahead step runs over the cache — so its
tokens are a cold prefill's to float rounding (bit for bit in float64 on the tests'
models; near ties aside in float32: tests/test_prefix_cache.py).
"""

from __future__ import annotations

import collections
import hashlib

import numpy as np

from lookahead_jax.models import kv_pool

BLOCK = 16  # positions a block holds (vLLM's default block size)


def block_keys(ids, block: int = BLOCK) -> list[bytes]:
    """The chain keys of the prompt's full blocks (a partial last block has none)."""
    ids = np.asarray(ids, np.int32)
    keys, parent = [], b""
    for j in range(len(ids) // block):
        parent = hashlib.blake2b(
            parent + ids[j * block : (j + 1) * block].tobytes(), digest_size=16
        ).digest()
        keys.append(parent)
    return keys


def cacheable_blocks(prompt_len: int, block: int = BLOCK) -> int:
    """How many leading blocks a prompt may take from the cache: every full block before
    its last token (the prefill must run at least that token, for its logits)."""
    return (prompt_len - 1) // block


class PrefixCache:
    """The block index (host) and the pool it indexes (device), for one model."""

    def __init__(self, cache_like, budget_mb: float, block: int = BLOCK):
        per_block = sum(
            2 * x.shape[1] * block * x.shape[3] * np.dtype(x.dtype).itemsize for x in cache_like.k
        )
        self.blocks = int(budget_mb * 2**20 // per_block)
        self.block = block
        self.bytes = self.blocks * per_block
        self.pool = kv_pool.init_pool(cache_like, max(self.blocks, 1), block)
        self._held: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # LRU first
        self._free = list(range(self.blocks))

    def __len__(self) -> int:
        return len(self._held)

    def hits(self, ids) -> list[int]:
        """Pool ids of the prompt's longest run of leading blocks held (at most its
        cacheable_blocks); they become the most recently used, the first block most of
        all, so that eviction takes a chain's deepest blocks first (a chain without its
        first block is of no use)."""
        keys = block_keys(ids, self.block)[: cacheable_blocks(len(ids), self.block)]
        found = []
        for key in keys:
            if key not in self._held:
                break
            found.append(key)
        self._touch(found)
        return [self._held[key] for key in found]

    def split(self, prompts: list) -> list[bool]:
        """Which of the prompts, about to be prefilled together, to prefill now: all but
        those whose first block not held is one an earlier prompt of the list will store.
        Those wait for its store and then take the blocks they share from the cache, so
        that rows of one batch that share a prefix compute it once."""
        claimed, now = set(), []
        for ids in prompts:
            keys = block_keys(ids, self.block)
            first = next((j for j, key in enumerate(keys) if key not in self._held), len(keys))
            shared = self.blocks > 0 and first < cacheable_blocks(len(ids), self.block)
            if shared and keys[first] in claimed:
                now.append(False)
            else:
                claimed.update(keys[first:])
                now.append(True)
        return now

    def claim(self, prompts: list) -> list[tuple[int, int, int]]:
        """The blocks of the prompts (just prefilled) that are not held, each given a pool
        id: [(prompt index, first position, pool id)], at most the pool's size. Free
        blocks go first, then the least recently used are evicted; then each prompt's
        chain is touched, deepest first, so that its first block is the most recent (see
        `hits`). The caller stores them (cached_prefill.store_blocks) before anything reads
        them."""
        chains = [block_keys(ids, self.block) for ids in prompts]
        new = [(i, j, key) for i, keys in enumerate(chains) for j, key in enumerate(keys)]
        new = [x for x in new if x[2] not in self._held][: self.blocks]
        entries, taken = [], set()
        for i, j, key in new:
            if key not in self._held:  # (two prompts of the list may share a block)
                entries.append((i, j * self.block, self._claim(key, taken)))
        for keys in reversed(chains):
            self._touch(keys)
        return entries

    def claim_chunk(self, ids, first: int, count: int) -> list[int]:
        """Pool ids for the prompt's blocks first .. first + count - 1 (a chunk's, which
        the caller stores over them; one already held keeps its id), then its chain
        touched as in `claim`; fewer ids than asked where the pool is smaller than the
        chain."""
        keys = block_keys(ids, self.block)[: first + count]
        if len(keys) > self.blocks:
            return []
        taken: set[int] = set()
        ids_ = [self._claim(key, taken) for key in keys[first:]]
        self._touch(keys)
        return ids_

    def _claim(self, key: bytes, taken: set[int]) -> int:
        """The pool id of `key`: its own if held, else a free block's, else the least
        recently used one's (never one handed out in this call: `taken`)."""
        if key in self._held:
            self._held.move_to_end(key)
        elif self._free:
            self._held[key] = self._free.pop()
        else:
            victim = next(k for k, i in self._held.items() if i not in taken)
            self._held[key] = self._held.pop(victim)
        taken.add(self._held[key])
        return self._held[key]

    def _touch(self, keys: list[bytes]) -> None:
        """The chain's held blocks most recently used, its first block most of all."""
        for key in reversed(keys):
            if key in self._held:
                self._held.move_to_end(key)
