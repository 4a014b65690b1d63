"""The scheduler's prefills through the prefix cache (prefix_cache.py): what `_fill` does
when the cache is on, and what it adds.

    admit(placed, active)  prefill requests into their slots, each from its longest run of
                      cached blocks; requests of one admission that share blocks nobody
                      holds wait for the first of them (a second prefill runs only their
                      own parts: in one ragged pass after the blocks they share, where
                      that costs less); long prompts may be set to prefill in chunks instead;
                      an admission with cached blocks may run from scratch, all of it in
                      ragged passes, where that costs less (_ragged_instead)
    chunk(active, ..) one chunk of the first long prompt waiting whose rest needs one
                      (prefill_chunk.py): its next C positions' K/V into the pool, between
                      decode rounds, so the streams in flight keep their pace; returns
                      every request whose rest now fits one chunk (admitted like any
                      other, from their blocks)
    keep(...)         ended rows' blocks (their answers) stored, for a next turn

A chunked request holds its slot from the start (`Active.chunking`): its row on the
device stays done (nothing decodes there) until its prefill. Chunks run between rounds
only while other rows decode; a prompt that prefills alone (the only one of its pass
through the admission) runs in one piece, which is faster, unless that piece would run
padded far past its length: then its chunks run at once, in the admission
(`_chunk_now_if_padded`).
"""

from __future__ import annotations

import time
from collections.abc import Set as AbstractSet

import jax
import numpy as np

from lookahead_jax.decoding import prefill_chunk, programs
from lookahead_jax.decoding.program_caches import ProgramCache
from lookahead_jax.engine import prefill_args, slot_state
from lookahead_jax.engine.prefix_cache import PrefixCache
from lookahead_jax.models import kv_pool
from lookahead_jax.models.kv_pool import KVPool

MAX_CHUNK = 1024  # tokens; auto's choice is at most this
# ... and at least this: a chunked request holds its slot idle until its last chunk, and
# chunks run one a round, so short chunks leave slots empty for rounds while requests
# wait. (A --batch 16 server under 64 concurrent MT-bench chats measured 32-token chunks
# from its first rounds' rates, and a mean 9.3 of its 16 rows decoded: chat prompts of
# 50-250 tokens sat out two to eight rounds each.)
MIN_CHUNK = 256
# blocks one store program call cuts out: one program a state's row count (a prompt's
# and an answer's few blocks a row), where a power of two of them compiled a program
# for every count and state shape met (0.6-0.8 s each, ~9 s in a 30 s run of a server
# under 16 concurrent chats; 2-core Intel Xeon)
STORE_ENTRIES = 32
# a long prompt whose one-piece prefill would run at this many times its length or more
# is prefilled in chunks at once (_chunk_now_if_padded)
PADDED_CHUNKS = 1.5
# (model, dtype, argument shapes) -> compiled prefill_chunk
_CHUNK_PROGRAMS = ProgramCache("prefill chunks", 16)


class CachedPrefill:
    """A scheduler's prefills through `cache`, on its `device` (DeviceSlots), counted in
    its `stats`; the scheduler's slots (`active`: an Active or None a slot) are given to
    each call."""

    def __init__(self, device, stats, params, cache: PrefixCache, chunk: int | str | None):
        self.device, self.stats, self.params, self.cache = device, stats, params, cache
        self.chunk_tokens = chunk  # "auto": chosen at the first long prompt (chunk_size)
        self._handed: list = []  # the requests `admit` handed back: not chunked when back

    # ------------------------------------------------------------------ admission

    def admit(self, placed: list, active: list, defer: bool = False) -> list:
        """Prefill [(slot, Encoded)] (their Active already in `active`, the slots); returns
        those handed back: with `defer` (online), requests that wait for an earlier one's
        blocks are not prefilled after it but freed from their slots, for the scheduler to
        admit again at once with what came in meanwhile (a burst's chats behind one new
        system prompt: the first computes it, and the others join one pass after it) —
        unless one of them follows a grammar or was chunked: then all are prefilled here."""
        cache, device, stats = self.cache, self.device, self.stats
        admitting = {s for s, _ in placed}
        # (those handed back were admitted with the first, which has not decoded yet)
        handed, self._handed = self._handed, []
        if not self._crowd(placed, active):
            placed = [
                (s, r) for s, r in placed
                if any(r is h for h in handed) or not self._to_chunk(s, r, admitting, active)
            ]  # fmt: skip
        while placed:
            now = cache.split([r.ids for _, r in placed])
            placed, later = (
                [x for x, go in zip(placed, now, strict=True) if go],
                [x for x, go in zip(placed, now, strict=True) if not go],
            )
            if len(placed) == 1:  # (with others, it prefills in their group: not alone)
                self._chunk_now_if_padded(active[placed[0][0]])
            with_hits: tuple[list, list] = ([], [])  # [(slot, request, hits)] without, with
            for s, r in placed:
                hits = cache.hits(r.ids)
                with_hits[bool(hits)].append((s, r, hits))
            if self._shared(with_hits[1], active):  # one pass after their shared blocks
                groups = [(True, with_hits[1], True), *self._groups((with_hits[0], []), active)]
            elif (parts := self._ragged_instead(with_hits, active)) is not None:
                rows = [*with_hits[0], *with_hits[1]]  # ragged passes, blocks computed again
                groups = [(False, [rows[i] for i in part], True) for part in parts]
            else:
                groups = self._groups(with_hits, active)
            for cached, g, ragged in groups:
                # (a shared pass finds the blocks its rows share; each computes its own)
                hits_g = [h for _, _, h in g]
                shared = (
                    prefill_args.shared_length(hits_g, cache.block) if cached and ragged else None
                )
                for s, r, hits in g:  # a chunked prompt's own blocks were computed, not found
                    own = active[s].chunked_tokens
                    found = (len(hits) * cache.block if shared is None else shared) - own
                    stats.count_prefix(len(r.ids), max(found, 0) if cached else 0)
            # every prefill first, then the stores: a store may evict a block that
            # another group's prefill reads (device calls run in order)
            fresh = [
                device.prefill(
                    [r for _, r, _ in g],
                    [h for _, _, h in g] if cached else None,
                    cache.pool,
                    ragged,
                )
                for cached, g, ragged in groups
            ]
            for state, (_, g, _) in zip(fresh, groups, strict=True):
                slots = [s for s, _, _ in g]
                device.insert(state, slots)
                # (from the rows inserted, not `state`: one store program a row bucket,
                # not one a prefill shape)
                self._store(cache.claim([r.ids for _, r, _ in g]), slots)
            # (not a grammar's request, whose placement is counted once, nor a chunked one)
            if defer and later and not any(r.grammar or active[s].chunked_tokens for s, r in later):
                for s, _ in later:
                    active[s] = None
                self._handed = [r for _, r in later]
                return later
            placed = later
        return []

    def _shared(self, rows: list, active: list) -> bool:
        """Whether an admission's rows with cached blocks ([(slot, request, hits)])
        prefill in one ragged pass after the blocks they share (the planner's
        shared_pays: sixteen chats behind a new system prompt, the first's blocks stored)
        — not where a chunked prompt is among them (as `_from_scratch`)."""
        if not rows or any(active[s].chunked_tokens for s, _, _ in rows):
            return False
        requests, hits = [r for _, r, _ in rows], [h for _, _, h in rows]
        return self.device.planner.shared_pays(requests, hits, self.cache.pool)

    def _groups(
        self, with_hits: tuple[list, list], active: list
    ) -> list[tuple[bool, list, bool | None]]:
        """An admission's rows without and with cached blocks ([(slot, request, hits)]
        each) as prefills, [(from its cached blocks, rows, whether a ragged pass)]: each
        kind apart (the suffixes run at the state's prompt side: each row gathers P / Sb
        blocks, its own and ignored ones), cut by the planner; a group with hits may run
        from scratch (_from_scratch), and is counted so."""
        groups = []
        for cached, rows in enumerate(with_hits):
            requests = [r for _, r, _ in rows]
            hits = [h for _, _, h in rows] if cached else None
            cut = self.device.planner.prefill_groups(requests, hits, self.cache.pool)
            for group, ragged in cut:
                from_blocks = bool(cached) and not self._from_scratch(rows, group, active)
                # (a group with hits run from scratch: ragged as the device decides then)
                ragged = None if cached and not from_blocks else ragged
                groups.append((from_blocks, [rows[i] for i in group], ragged))
        return groups

    def _ragged_instead(self, with_hits: tuple[list, list], active: list):
        """The ragged passes an admission's rows without and with cached blocks ([(slot,
        request, hits)] each) prefill in from scratch ([indices into both, in order] each:
        prefill_planning.ragged_instead), or None — always where a chunked prompt is among
        them (as `_from_scratch`)."""
        rows = [*with_hits[0], *with_hits[1]]
        if not with_hits[1] or any(active[s].chunked_tokens for s, _, _ in rows):
            return None
        requests, hits = [r for _, r, _ in rows], [h for _, _, h in rows]
        return self.device.planner.ragged_instead(requests, hits, self.cache.pool)

    def _from_scratch(self, rows: list, group: list[int], active: list) -> bool:
        """Whether the rows `group` of `rows` [(slot, request, hits)], which have cached
        blocks, prefill from scratch instead, their suffix shape compiling in the
        background (prefill_planning.prompt_instead) — not a chunked prompt's: its rest is
        long, and computing its chunks again is what chunking avoids."""
        g = [rows[i] for i in group]
        if any(active[s].chunked_tokens for s, _, _ in g):
            return False
        requests, hits = [r for _, r, _ in g], [h for _, _, h in g]
        return self.device.planner.prompt_instead(requests, hits, self.cache.pool)

    def _to_chunk(self, slot: int, request, admitting: AbstractSet[int], active: list) -> bool:
        """Whether to prefill this request in chunks (and mark it so): its prompt past
        its cached blocks is longer than a chunk, other rows decode meanwhile (not the
        ones admitted with it, `admitting`: sixteen chats arriving together that share a
        new system prompt are prefilled together, the first alone and the rest from its
        blocks, not one per round behind chunks), and the pool holds its blocks twice over
        (else its own chunks would evict each other). (`admit` asks only when not `_crowd`.)"""
        if not self._others_decode(slot, active, admitting) or not self._chunkable(request.ids):
            return False
        active[slot].chunking = True
        return True

    def _chunkable(self, ids) -> bool:
        """Whether a prompt may prefill in chunks: chunking is on, its rest past its cached
        blocks is longer than a chunk, and the pool holds its blocks twice over (else its
        own chunks would evict each other)."""
        if self.chunk_tokens is None or self._rest(ids) <= self.chunk_size():
            return False
        return self.cache.blocks >= 2 * len(ids) // self.cache.block

    def _chunk_now_if_padded(self, a) -> None:
        """A long prompt that prefills alone: its chunks now, all but its last, where one
        piece would run padded to PADDED_CHUNKS x its rest or more (no compiled shape near
        its length: prefill_shapes.py pads it to a larger one, or compiles its octave); its
        last part then runs as a suffix after its own blocks. A server's burst of chats
        behind a new 497-token system prompt: the first one's prefill ran at 1 x 1024 in
        3.2 s, as chunks and a 1 x 128 suffix in 1.9 s (2-core Intel Xeon, SmolLM2-135M)."""
        ids = a.request.ids
        if not self._chunkable(ids):
            return
        hits = self.cache.hits(ids)
        side = self.device.planner.run_side([a.request], [hits] if hits else None, self.cache.pool)
        if side >= PADDED_CHUNKS * self._rest(ids):
            while self._one_chunk(a):
                pass

    def _crowd(self, placed: list, active: list) -> bool:
        """Whether more of the requests admitted now are longer than a chunk than rows
        decode: then admitting them comes first, none chunked between rounds (fifteen chats
        that came in while one decoded were chunked one a round: a server's burst read 8.1 s median,
        12.8 s p90 time to first token); counted once for the admission, and only the
        long ones (two short chats beside one long prompt do not unchunk it)."""
        if self.chunk_tokens is None:
            return False
        long_ones = sum(self._rest(r.ids) > self.chunk_size() for _, r in placed)
        return long_ones > _decoding(active, {s for s, _ in placed})

    @staticmethod
    def _others_decode(slot: int, active: list, admitting: AbstractSet[int] = frozenset()) -> bool:
        return _decoding(active, {slot, *admitting}) > 0

    def _rest(self, ids) -> int:
        """The prompt's positions past its cached blocks."""
        return len(ids) - self.cache.block * len(self.cache.hits(ids))

    def chunk_size(self) -> int:
        """C: the tokens one chunk runs. "auto": as many as this machine prefills in half
        a decode round (a power of two, from this run's prefill rate and round time so
        far; MIN_CHUNK to MAX_CHUNK), so that a round with a chunk takes well under twice
        one without (but for MIN_CHUNK: on a slow machine several times): a chunk deep in
        a long prompt attends to all the positions before it, so it runs slower than the
        rate measured on the run's prompts."""
        if self.chunk_tokens == "auto":
            s = self.stats
            computed = s.prompt_tokens - s.prefix_hit_tokens
            if s.rounds == 0 or s.prefill_s <= 0 or computed <= 0:
                return MIN_CHUNK  # nothing measured yet: not fixed
            fits = computed / s.prefill_s * (s.decode_s / s.rounds) / 2
            size = 1 << max(int(fits), 1).bit_length() - 1
            self.chunk_tokens = min(max(size, MIN_CHUNK, 2 * self.cache.block), MAX_CHUNK)
        return self.chunk_tokens

    # ------------------------------------------------------------------ chunks

    def chunk(self, active: list, cancelled: AbstractSet[int]) -> list:
        """Run one chunk of the first request set to chunk that needs one; [(slot,
        Active)] of those whose rest now fits one chunk (blocks another request stored
        count: every such one, not one a round) or whose rows stopped decoding beside
        them: the caller admits them."""
        ready, ran = [], False
        for s, a in enumerate(active):
            if a is None or not a.chunking or s in cancelled:
                continue  # (a cancelled one ends at the round's read-back)
            if self._others_decode(s, active) and self._rest(a.request.ids) > self.chunk_size():
                if ran:  # one chunk a round
                    continue
                ran = True
                if self._one_chunk(a):
                    continue
            a.chunking = False
            ready.append((s, a))
        return ready

    def _one_chunk(self, a) -> bool:
        """Run the next chunk of Active `a`'s prompt (its rest is longer than a chunk:
        chunk() asks); whether more than a chunk is left after it."""
        cache, device, C = self.cache, self.device, self.chunk_size()
        ids, block = a.request.ids, cache.block
        hits = cache.hits(ids)
        done = block * len(hits)
        dst = cache.claim_chunk(ids, len(hits), C // block)
        if len(dst) < C // block:  # the pool cannot take them: prefill the rest whole
            return False
        blocks_m = [*hits, *[0] * (device.P // block - len(hits))]
        args = (self.params, cache.pool, _i32(blocks_m), _i32(done),
                _i32(ids[done : done + C]), _i32(dst))  # fmt: skip
        cache.pool = self._compiled(args)(*args)
        self.stats.count_chunk(C)
        a.chunked_tokens += C
        return len(ids) - done - C > C

    def _compiled(self, args):
        """The chunk program for these shapes, compiled once (its seconds in the stats'
        compile_s, as the prefill's and the loop's)."""
        spec = self.device.spec
        shapes = tuple((np.shape(a), str(a.dtype)) for a in jax.tree.leaves(args[1:]))
        key = (spec.lm, spec.cache_dtype, shapes)
        exe = _CHUNK_PROGRAMS.get(key)
        if exe is None:
            t = time.perf_counter()
            jitted = prefill_chunk.program(spec.lm, spec.cache_dtype)
            with programs.precision_scope(spec.cache_dtype):
                exe = _CHUNK_PROGRAMS.put(key, jitted.lower(*args).compile())
            self.stats.count_compile(time.perf_counter() - t)
        return exe

    # ------------------------------------------------------------------ answers

    def keep(self, slots: list[int], tokens_bs, committed_b) -> None:
        """Store the ended rows' blocks not held yet — their answers', mostly: the
        prompt's were stored at the prefill — so that a conversation's next turn, which
        carries this answer in its prompt, is prefilled only from there. Their K/V are
        read before the slots are refilled (device calls run in order). committed_b [B]:
        positions whose K/V each row has committed."""
        self._store(self.cache.claim([tokens_bs[s, : committed_b[s]] for s in slots]), slots)

    def warm_store(self, state) -> None:
        """Run the store program over `state` (a DecodeState) storing nothing (warm-up)."""
        self.cache.pool = store_blocks(self.cache.pool, state, [])

    def _store(self, claimed: list, slots: list[int]) -> None:
        """Store the blocks `claimed` [(i, first position, pool id)] of the rows at
        `slots[i]` of the device's state (prefix_cache.claim's entries)."""
        if claimed:
            entries = [(slots[i], start, dst) for i, start, dst in claimed]
            self.cache.pool = store_blocks(self.cache.pool, self.device.state, entries)


def store_blocks(pool: KVPool, state, entries) -> KVPool:
    """The pool (donated) with the blocks `entries` [(row of `state`, a DecodeState, first
    position, pool id)] cut out of its cache: STORE_ENTRIES a call, padded with entries
    that are dropped (none: one call storing nothing, as the server's warm-up runs it)."""
    store = slot_state.program(kv_pool.store_blocks, None, donate_argnums=0)
    for at in range(0, max(len(entries), 1), STORE_ENTRIES):
        rows_m, starts_m = np.zeros((2, STORE_ENTRIES), np.int32)
        dst_m = np.full((STORE_ENTRIES,), pool.blocks, np.int32)  # padding: dropped
        for j, (row, start, dst) in enumerate(entries[at : at + STORE_ENTRIES]):
            rows_m[j], starts_m[j], dst_m[j] = row, start, dst
        pool = store(pool, state.cache, rows_m, starts_m, dst_m)
    return pool


def _i32(x):
    return np.asarray(x, np.int32)


def _decoding(active: list, besides: AbstractSet[int]) -> int:
    """How many slots of `active` decode (a request, not one set to chunk), `besides`
    left out."""
    return sum(a is not None and not a.chunking and s not in besides for s, a in enumerate(active))
