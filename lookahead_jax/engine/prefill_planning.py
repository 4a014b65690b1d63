"""How an admission's requests are cut into prefills, and of which kind each is (a
DeviceSlots' `planner`): which requests share a prefill (`prefill_groups`), whether several
prompts run packed in ragged passes (`_ragged_parts`: one, or several that fit a compiled
pass where one would compile: `_passes`), and when requests with cached blocks prefill
from scratch instead — as prompts, while their suffix shape compiles in the background
(`prompt_instead`), or with the rest of their admission in ragged passes
(`ragged_instead`). The rules are prefill_shapes.py's (PaddedShapes); a planner
asks them with what its device side gives it: which programs are compiled and how one
compiles in the background (`ready` and `compile_soon`, DeviceSlots' for the state's
current shapes), this run's prefill rate (`stats`).
"""

from __future__ import annotations

from collections.abc import Callable

from lookahead_jax.engine import inputs, prefill_args, slot_state
from lookahead_jax.engine.prefill_shapes import COMPILES_NOW, RAGGED, SHARED, PaddedShapes
from lookahead_jax.engine.requests import Encoded
from lookahead_jax.engine.stats import Stats
from lookahead_jax.models import kv_pool
from lookahead_jax.models.attention import SEGMENT_BLOCK

# A ragged pass holds at most MAX_PASS_TOKENS tokens, or MAX_SHORT_ROWS_PASS_TOKENS where its
# rows average less than an attention block (SEGMENT_BLOCK); an admission of more runs cut.
# Its price (positions) leaves out its attention, which folds every 128-query block
# against a key block of 128 a step: rows shorter than a block pay that in full. 1,024
# rows of a 31-token prompt (31,744 tokens, float64, tests/test_sampling_distribution.py)
# took 18.1 and 13.6 s as one pass, 13.3 and 9.0 s cut as [1024, 32] (3 % more
# positions). Sixteen chats of ~540 tokens (8,600) held more than 8,192, the one bound
# before: they ran as [16, 1024], 16,384 positions, 28.9-31.7 s on a 2-core AMD EPYC (Zen
# 4), where one pass of 10,240 runs 20.2 s (benchmarks/cpu/prefix_cache_burst_epyc_zen4_s79.md).
MAX_PASS_TOKENS = 16384
MAX_SHORT_ROWS_PASS_TOKENS = 8192

# ready(pool) -> ready(rows, side): whether the start program of a prefill of that shape
# (its kind keyed by prefill_args.program_pool's value) is compiled
Ready = Callable[[object], Callable[[int, int], bool]]
# compile_soon(pool) -> compile_soon(rows, side), or None where nothing compiles in the
# background (a mesh)
CompileSoon = Callable[[object], Callable[[int, int], None] | None]


class PrefillPlanner:
    """The prefill plans of one DeviceSlots: its `padded` shapes (the engine's), its batch
    B, whether its model runs ragged passes here (`ragged`), its `stats` (the prefill
    rate), and its programs' `ready` and `compile_soon` (module docstring)."""

    def __init__(
        self,
        padded: PaddedShapes,
        batch: int,
        ragged: bool,
        stats: Stats,
        ready: Ready,
        compile_soon: CompileSoon,
    ):
        self.padded, self.B, self.ragged, self.stats = padded, batch, ragged, stats
        self._ready, self._compile_soon = ready, compile_soon

    def prefill_groups(
        self,
        requests: list[Encoded],
        hits: list[list[int]] | None = None,
        pool: kv_pool.KVPool | None = None,
    ) -> list[tuple[list[int], bool]]:
        """The requests of one admission cut into prefills (prefill_shapes.groups), each
        (indices into `requests`, whether it is one ragged pass of them): each one
        `prefill` (hits and pool as there; its `ragged` this decision). The padding an
        admission's cut spends is spent for want of better shapes here, once."""
        parts = self._ragged_parts(requests, hits, charge=True)
        if parts is not None:  # ragged passes of them all
            return [(part, True) for part in parts]
        kind, sides, key_pool, rate, ready = self.planning(requests, hits, pool, False)
        background = self._compile_soon(key_pool) is not None
        cut = self.padded.groups(kind, sides, self.B, rate, ready, background)
        return [(group, False) for group in cut]

    def _ragged_parts(
        self, requests: list[Encoded], hits, charge: bool = False
    ) -> list[list[int]] | None:
        """The ragged passes these requests prefill packed in ([indices] each: `_passes`),
        or None where they do not: several prompts from scratch, where that costs less
        than their padded cut (prefill_shapes.ragged_pays; charge: the positions one
        pass's shape would have saved are spent for want of it)."""
        if not (self.ragged and hits is None and len(requests) >= 2):
            return None
        return self._ragged_pays(requests, self._cut(requests, None, None), charge)

    def run_side(self, requests: list[Encoded], hits=None, pool=None) -> int:
        """The side a prefill of these requests (as `prefill`'s) runs at now (a plan)."""
        kind, sides, key_pool, rate, ready = self.planning(requests, hits, pool)
        n, soon = slot_state.prefill_rows(len(requests), self.B), self._compile_soon(key_pool)
        return self.padded.plan(kind, n, max(sides), rate, ready, soon is not None)[0][1]

    def planning(self, requests: list[Encoded], hits, pool, ragged=None) -> tuple:
        """(kind, sides, the program's pool, this run's prefill rate, `_ready`): what
        prefill_shapes.py plans a prefill of these requests from (as `prefill`'s); ragged:
        whether they run as one ragged pass, where the caller has decided it (None: where
        `_ragged_parts` says one pass; where it says several, these requests run as one
        padded prompt prefill, as `prompt_instead` prices them)."""
        if ragged is None:
            ragged = len(self._ragged_parts(requests, hits) or ()) == 1
        kind, sides = prefill_args.sides(requests, hits, pool, ragged)
        key_pool = prefill_args.program_pool(hits, pool, ragged)
        return kind, sides, key_pool, self.stats.prefill_rate(), self._ready(key_pool)

    def prompt_instead(self, requests: list[Encoded], hits: list[list[int]], pool) -> bool:
        """Whether these requests, which have cached blocks, prefill from scratch (as
        prompts, hits ignored) because their suffix shape would compile now and a prompt
        shape compiled runs them for fewer positions than a compile costs
        (prefill_shapes.instead); their suffix shape then compiles in the background."""
        soon = self._compile_soon(pool)
        if soon is None:
            return False
        n = slot_state.prefill_rows(len(requests), self.B)
        _, suffix_sides = prefill_args.sides(requests, hits, pool)
        # (as `prefill` runs them from scratch; prompt sides <= P: _fill grew the state)
        kind, scratch_sides, _, rate, scratch_ready = self.planning(requests, None, None)
        shape = self.padded.instead(
            n, max(suffix_sides), (kind, max(scratch_sides)), rate, self._ready(pool),
            scratch_ready,
        )  # fmt: skip
        if shape is not None:
            soon(*shape)
        return shape is not None

    def ragged_instead(
        self, requests: list[Encoded], hits: list[list[int]], pool
    ) -> list[list[int]] | None:
        """The ragged passes ([indices] each, `_passes`) an admission's requests, some with
        cached blocks (hits; [] where none), prefill in from scratch (hits ignored), or
        None where they run as suffixes beside the others' prompts, each cut as
        prefill_groups cuts them (the others as padded prompts, or their own pass where
        that costs less): where it costs less
        (prefill_shapes.ragged_pays; a lone suffix too, where its own shape would
        compile: a pass of the warmed shape holds it). Called once an admission: the
        positions it would save are spent for want of its shape; where it runs, the
        suffix shapes that would have compiled now compile in the background (as
        `prompt_instead`'s), so that later admissions take their blocks from the cache
        rather than compute them again, pass after pass."""
        if not (self.ragged and any(hits)):
            return None
        fresh = [i for i, h in enumerate(hits) if not h]
        cached = [i for i, h in enumerate(hits) if h]
        suffixes = ([requests[i] for i in cached], [hits[i] for i in cached])
        cut = self._cut(*suffixes, pool)  # (cost, positions run)
        if fresh:
            prompts = [requests[i] for i in fresh]
            cost = self._cut(prompts, None, None)
            passes = self._passes(prompts) if len(fresh) >= 2 else None
            if passes is not None:  # (their own passes, where they cost less: not charged)
                cost = min(cost, passes[1])
            cut = (cut[0] + cost[0], cut[1] + cost[1])
        parts = self._ragged_pays(requests, cut, charge=True)
        if parts is not None:
            self._suffixes_soon(*suffixes, pool)
        return parts

    def shared_pays(self, requests: list[Encoded], hits: list[list[int]], pool) -> bool:
        """Whether these requests, which have cached blocks, prefill in one ragged pass
        after the blocks they all share (prefill_args.shared; each row's own blocks past
        those computed again) rather than as their suffixes are cut (prefill_groups) or
        in one ragged pass from scratch, whichever of those costs less: where the pass
        costs no more, priced alike (prefill_shapes.ragged_pays, kind SHARED; charged:
        call it once an admission). Sixteen chats behind a new 497-token system prompt
        ran their fifteen suffixes (1,016 tokens) as seven one-row suffix prefills and a
        [16, 64] one, 1,920 positions in 3.6 s; as one such pass, 1.8-2.7 s (a 2-core AMD
        EPYC, Zen 4: benchmarks/cpu/prefix_cache_burst_epyc_zen4_s80.md)."""
        if not (self.ragged and len(requests) >= 2 and prefill_args.shared_blocks(hits)):
            return False
        kind, sides, key_pool, rate, ready = self.planning(requests, hits, pool, True)
        past = sum(len(r.ids) for r in requests) - len(requests) * prefill_args.shared_length(
            hits, pool.block
        )  # (the tokens of the pass: each row's past the shared blocks)
        if _too_long(sides[0], past, len(requests)):
            return False
        cut = self._cut(requests, hits, pool)
        scratch = self._pass(requests)
        if scratch is not None:
            cut = min(cut, self._pass_cost(scratch))
        n, soon = slot_state.prefill_rows(len(requests), self.B), self._compile_soon(key_pool)
        return self.padded.ragged_pays(n, sides[0], cut, rate, ready, soon, True, kind=SHARED)

    def _suffixes_soon(self, requests: list[Encoded], hits: list[list[int]], pool) -> None:
        """Start compiling in the background the suffix shapes of these requests' cut
        that would compile now (a ragged pass ran them instead)."""
        soon = self._compile_soon(pool)
        if soon is None:
            return
        kind, sides, _, rate, ready = self.planning(requests, hits, pool, False)
        for n, side in self.padded.runs(kind, sides, self.B, rate, ready, True):
            if self.padded.plan(kind, n, side, rate, ready, True)[1] in COMPILES_NOW:
                soon(n, side)

    def _pass(self, requests: list[Encoded]) -> tuple | None:
        """(rows, tokens, this run's prefill rate, `_ready`, `_compile_soon`) of one ragged
        pass of these requests, what prefill_shapes.py prices it from; None where it would
        hold more tokens than a pass may (MAX_PASS_TOKENS, or MAX_SHORT_ROWS_PASS_TOKENS
        where its rows average less than a block): it never runs."""
        side = prefill_args.sides(requests, None, None, ragged=True)[1][0]
        if _too_long(side, sum(len(r.ids) for r in requests), len(requests)):
            return None
        n = slot_state.prefill_rows(len(requests), self.B)
        rate, ready = self.stats.prefill_rate(), self._ready(prefill_args.RAGGED)
        return n, side, rate, ready, self._compile_soon(prefill_args.RAGGED)

    def _passes(
        self, requests: list[Encoded], one: tuple | None = None
    ) -> tuple[list[list[int]], tuple] | None:
        """The ragged passes these requests run in ([indices into `requests`] each,
        ascending) and what they cost (positions as prefill_shapes prices them, positions
        run); None where one pass would hold more than MAX_PASS_TOKENS. One pass, unless
        its shape would compile in the foreground and passes packed to fit a compiled one
        (`_packed`, the cheapest over the compiled passes) cost less, their padding
        included; or, its shape paid for (its compile started in the background:
        `_ragged_pays`), until that is ready. What the passes run beyond the one pass's
        shape is spent for want of it (`_ragged_pays`).

        Worked example (640 positions a second, a compile 3 s: 1,920 positions; the
        warmed pass (16, 2048)): sixteen MT-bench chats of 192 tokens, 3,072 in all, whose
        own pass (16, 3072) would compile in the foreground (3,088 + 1,920 = 5,008; one
        such compiled for 8.5 s inside a server's admission, 2-core Intel Xeon), run as
        ten and six chats in two runs of the warmed pass (2 x 2,064 = 4,128), and the
        1,040 positions they run beyond (16, 3072)'s own go towards compiling it. `one`:
        their one pass as `_pass` gives it, where the caller has it."""
        one = self._pass(requests) if one is None else one
        if one is None:
            return None
        n, side, rate, ready, soon = one
        whole = ([list(range(len(requests)))], self._pass_cost(one))
        how = self.padded.plan(RAGGED, n, side, rate, ready, soon is not None)[1]
        if how not in COMPILES_NOW:
            return whole
        best = None
        for rows, pass_side in self.padded.shapes(RAGGED):
            parts = self._packed(requests, rows, pass_side)
            if parts is None:
                continue
            costs = [self._pass_cost(self._pass([requests[i] for i in p])) for p in parts]
            cost = (sum(c[0] for c in costs), sum(c[1] for c in costs))
            if best is None or cost[0] < best[1][0]:
                best = (parts, cost)
        if best is None:
            return whole
        if how == "paid" and soon is not None:  # (its compile under way: not in the foreground)
            soon(n, side)
            return best
        return best if best[1][0] < whole[1][0] else whole

    def _pass_cost(self, ragged_pass: tuple) -> tuple[float, int]:
        """prefill_shapes.pass_cost of a pass as `_pass` gives it."""
        n, side, rate, ready, soon = ragged_pass
        return self.padded.pass_cost(n, side, rate, ready, soon is not None)

    def _packed(self, requests: list[Encoded], rows: int, side: int) -> list[list[int]] | None:
        """These requests packed, longest first, into passes that each fit a pass of
        `rows` rows and `side` tokens (first fit), or None where a prompt alone is
        longer."""
        parts: list[list[int]] = []
        tokens: list[int] = []  # each part's
        for i in sorted(range(len(requests)), key=lambda i: -len(requests[i].ids)):
            n = len(requests[i].ids)
            fits = (
                k for k, part in enumerate(parts)
                if len(part) < rows and inputs.prefill_side(tokens[k] + n) <= side
            )  # fmt: skip
            k = next(fits, None)
            if k is not None:
                parts[k].append(i)
                tokens[k] += n
            elif inputs.prefill_side(n) <= side:
                parts.append([i])
                tokens.append(n)
            else:
                return None
        return [sorted(part) for part in parts]

    def _ragged_pays(
        self, requests: list[Encoded], cut: tuple[float, int], charge: bool
    ) -> list[list[int]] | None:
        """prefill_shapes.ragged_pays for these requests in ragged passes (`_passes`)
        against `cut`: the passes ([indices] each), or None where the cut runs."""
        one = self._pass(requests)
        passes = None if one is None else self._passes(requests, one)
        if passes is None:
            return None
        parts, cost = passes
        n, side, rate, ready, soon = one
        several = cost if len(parts) > 1 else None
        pays = self.padded.ragged_pays(n, side, cut, rate, ready, soon, charge, several)
        return parts if pays else None

    def _cut(self, requests: list[Encoded], hits, pool) -> tuple[float, int]:
        """What padded prefills of these requests cost now in positions, and the positions
        they run, as prefill_groups cuts them (prefill_shapes.cost)."""
        kind, sides, key_pool, rate, ready = self.planning(requests, hits, pool, False)
        background = self._compile_soon(key_pool) is not None
        return self.padded.cost(kind, sides, self.B, rate, ready, background)


def warm_prefills(batch: int, side: int, short: int, pool, ragged: bool) -> list[tuple]:
    """The prefills a server's warm-up compiles, [(rows, side, program_pool)]: one row's
    prompt of `side` from scratch; with the prefix cache (`pool`) one past cached blocks,
    one row's and every row's short turn (`short`) past them (a lone chat behind a cached
    system prompt, a burst's), and one row's and every row's last partial block (a prompt
    asked before, whose every full block is cached: a retry, a regenerate, an
    evaluation's repeated context); where the model runs ragged passes (`ragged`), up to
    sixteen rows' prompts in one pass, and with the cache up to sixteen short turns in one
    pass after blocks they share, and the pass side above that. A pass costs its tokens:
    a burst of any rows pads to it. (SmolLM2 on a 2-core AMD EPYC, Zen 4, a server's state
    at prompt side 1,024: a lone 5-16-token rest ran 168 ms padded to side 128, 32 ms at
    its block; sixteen of them 1.4 s as [16, 64], 0.36-0.43 s as [16, 16]. A burst's first
    chat, chunked behind a new system prompt, ran its 28-token rest padded to side 128, its
    chunks and rest 0.97 s; at one row's short side 0.90 s, while the others waited for
    its blocks. The side above: sixteen MT-bench chats past the template's block ran shared
    passes of 1,280 tokens; at aiperf C = 64 one fresh server compiled that pass inside its
    first such burst, ~3 s, and the other, measuring a faster prefill rate, priced the
    compile above its padding and cut that burst into fifteen one-row prefills.)"""
    prefills = [(1, side, None)]
    burst = min(batch, 16)
    if pool is not None:
        rest = min(pool.block, side)  # (a last partial block's side)
        prefills += [(1, side, pool), (1, short, pool), (batch, short, pool)]
        prefills += [(1, rest, pool), (batch, rest, pool)]
    if ragged:
        prefills.append((batch, burst * side, RAGGED))
    if ragged and pool is not None and burst >= 2:  # (a shared pass holds two rows or more)
        for tokens in (burst * short, inputs.prefill_side(burst * short + 1)):
            prefills.append((batch, tokens, prefill_args.SharedPool(pool)))
    # (short may be the side or a block, and batch 1)
    return [x for i, x in enumerate(prefills) if x not in prefills[:i]]


def _too_long(side: int, tokens: int, rows: int) -> bool:
    """Whether a ragged pass of `side` holding `tokens` of `rows` rows holds more than a pass
    may: MAX_PASS_TOKENS, or MAX_SHORT_ROWS_PASS_TOKENS where its rows average less than
    an attention block (SEGMENT_BLOCK: each pays a block)."""
    long_rows = tokens >= rows * SEGMENT_BLOCK
    return side > (MAX_PASS_TOKENS if long_rows else MAX_SHORT_ROWS_PASS_TOKENS)
