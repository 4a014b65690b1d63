"""`Stats`: what a decode counted and timed — one type for `lj.generate`'s output and
`lj.Engine.stats`, since both run through the engine's host loop (scheduler.py).

The counts are summed as each request's result is read (the scheduler's `_deliver`,
`Stats.count_sources`), so an online engine's stats are exact at any point
between rounds; the rates (`compression`, `tokens_per_s`, `accepted_tokens`) are
properties of the counts, so they always agree with them. The counts are the whole
batch's, every process's rows; `lj.generate` adds this process's rows' beside them
(`process_new_tokens`, `process_row_steps`: the same as the totals with one process).
`as_dict()` is the JSON form (the CLI's --json record), rates included.
"""

from __future__ import annotations

import dataclasses

from lookahead_jax.decoding.autotune import Choice
from lookahead_jax.decoding.sampling import SamplingConfig
from lookahead_jax.distributed import multihost
from lookahead_jax.guesses.lookahead_config import LookaheadConfig


@dataclasses.dataclass
class SourceStats:
    """One guess source's share of a decode (Stats.sources)."""

    proposed: int = 0  # well-formed draft nodes it proposed
    paths: int = 0  # steps whose accepted path was credited to it (its node, best proposed)
    tokens: int = 0  # guessed tokens credited to it
    weight_by_depth: list[float] | None = None  # with `adapt`: the finished rows' last
    # record weights, averaged


@dataclasses.dataclass
class Stats:
    """A decode's counts and times (module docstring)."""

    batch: int = 0  # rows decoded together (lj.generate: the prompts)
    prompts: int = 0  # requests finished (an interrupted one counts too)
    new_tokens: int = 0  # all requests
    row_steps: int = 0  # forward passes after the prefill, summed over rows
    step_tokens: int = 0  # tokens those passes emitted (an EOS too, and tokens a stop
    # string cut off; not the prefill's first token): plain decoding's equal row_steps
    rounds: int = 0  # device calls of the decode loop
    rounds_by_rows: dict[int, int] = dataclasses.field(default_factory=dict)  # ... by the
    # rows the state had (a row bucket holding the live slots: engine/row_buckets.py)
    per_round: dict[str, dict] = dataclasses.field(default_factory=dict)  # online auto:
    # by row bucket, each mode's ("lookahead", "plain") rate and rounds (round_choice.py)
    prefill_calls: int = 0
    prefill_positions: int = 0  # rows x side of every prefill: the prompt (or suffix past
    # cached blocks) positions it ran, padding included, and the chunks' (prefill_shapes.py)
    prefill_shapes: dict[str, int] = dataclasses.field(default_factory=dict)  # prefills
    # by the shape they ran at, "rows x side" (a suffix's: "rows x side after cache")
    prompt_buckets: list[int] = dataclasses.field(default_factory=list)  # the prompts'
    # buckets (inputs.bucket), each the first time met (not the shape its prefill ran
    # at: a longer prompt's side, or a larger shape padded; engine/prefill_shapes.py)
    cache_positions: list[int] = dataclasses.field(default_factory=list)  # cache sizes S the
    # loop was compiled for, in order
    prefix_lookups: int = 0  # requests prefilled while the prefix cache was on
    prefix_hits: int = 0  # ... of which some prompt blocks came from the cache
    prefix_hit_tokens: int = 0  # prompt tokens taken from the cache, not computed
    prompt_tokens: int = 0  # prompt tokens of those requests
    prefill_chunks: int = 0  # chunks of long prompts prefilled between decode rounds
    grammar_requests: int = 0  # requests admitted under a json_schema or regex
    grammar_compile_s: float = 0.0  # compiling their grammars to automata on the host
    # (grammar/compile.py; 0 for a grammar kept from before: one schema compiles once)
    compile_s: float = 0.0  # waiting for the prefill and loop programs to compile in this
    # run (the loop compiles in the background beside the prefill's; 0 when every one was
    # compiled already; the small insert / retire programs are left out)
    prefill_s: float = 0.0  # prefills and inserts, their compile_s left out
    decode_s: float = 0.0  # decode loop calls, their compile_s left out
    wall_s: float | None = None  # the whole run (offline, once it ended): compiling,
    # reading results back and auto's choice too
    interrupted: bool = False  # Ctrl-C ended it (lj.generate's GenerationInterrupted.partial)
    accepted_hist: dict[str, int] | None = None  # steps that emitted "1", "2", ... tokens
    # (after auto's hand-over to plain decoding, its steps count under "1"); once it ended
    sources: dict[str, SourceStats] = dataclasses.field(default_factory=dict)  # lookahead
    # only: by source name, then "window"
    config: RunConfig | None = None  # how the run decodes (None before it begins)
    step_ms: float | None = None  # lj.generate: decode_s / the longest row's steps
    process_new_tokens: int | None = None  # lj.generate: this process's rows' new_tokens
    # (with one process, new_tokens)
    process_row_steps: int | None = None  # ... and row_steps

    @property
    def compression(self) -> float:
        """Tokens a decode step emitted, on average (step_tokens / row_steps; 0.0 before
        any step): exactly 1.0 for plain decoding; the prefill's first token is not a
        step's."""
        return self.step_tokens / self.row_steps if self.row_steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        """New tokens over prefill + decode time (compilation left out)."""
        busy = self.prefill_s + self.decode_s
        return self.new_tokens / busy if busy > 0 else 0.0

    @property
    def accepted_tokens(self) -> int:
        """Guessed tokens accepted, every source's (0 for plain decoding)."""
        return sum(s.tokens for s in self.sources.values())

    # ------------------------------------------------------------------ the counting
    # Every write to a Stats is one of these methods (tests/test_layers.py checks
    # that no other module assigns a field): the parts that see something happen call
    # them, and what each figure counts is said once, here.

    def begin(self, config: RunConfig) -> None:
        """A run starts: how it decodes."""
        self.config = config

    def count_shape(self, cache_positions: int) -> None:
        """The state's programs are now those of cache size S (a new prompt side)."""
        self.cache_positions.append(cache_positions)

    def count_compile(self, seconds: float) -> None:
        """Seconds waited for a program to compile (0: it was compiled)."""
        self.compile_s += seconds

    def count_prefill(self, rows: int, side: int, kind: str, positions: int, buckets) -> None:
        """A prefill call of `kind` ("prompt", "suffix": after cached blocks, "ragged":
        prompts packed, "shared": packed after blocks they share) ran at (rows, side),
        `positions` positions, for prompts of these
        buckets (inputs.bucket)."""
        self.prefill_calls += 1
        self.prefill_positions += positions
        shape = f"{rows}x{side}" + {"prompt": "", "suffix": " after cache"}.get(kind, f" {kind}")
        self.prefill_shapes[shape] = self.prefill_shapes.get(shape, 0) + 1
        self.prompt_buckets += sorted(set(buckets) - set(self.prompt_buckets))

    def count_chunk(self, positions: int) -> None:
        """A chunk of `positions` of a long prompt was prefilled (between decode rounds, or
        at once where its one piece would run padded: cached_prefill.py); its positions
        count among the prefills' (their rate prices padding: prefill_shapes.py)."""
        self.prefill_chunks += 1
        self.prefill_positions += positions

    def count_grammar(self, compile_s: float) -> None:
        """A request under a grammar was admitted; compiling it took `compile_s`."""
        self.grammar_requests += 1
        self.grammar_compile_s += compile_s

    def prefill_rate(self) -> float:
        """Positions (padding included) this run's prefills ran a second: a rough rate
        (prefill_s also holds the inserts, stores and chunks; a prompt's attention grows
        with P^2), low rather than high, so it errs towards compiling (prefill_shapes.py
        prices padding with it). 0 (no padding) with several processes: each decides on
        its own clock, and processes that chose different programs would wait on each
        other."""
        if self.prefill_s <= 0 or multihost.is_multiprocess():
            return 0.0
        return self.prefill_positions / self.prefill_s

    def count_prefill_time(self, seconds: float) -> None:
        """A round's prefills, inserts and chunks took `seconds` (compiles left out)."""
        self.prefill_s += seconds

    def count_round(self, rows: int, seconds: float) -> None:
        """A decode loop call over `rows` rows took `seconds` (compiles left out)."""
        self.decode_s += seconds
        self.rounds += 1
        self.rounds_by_rows[rows] = self.rounds_by_rows.get(rows, 0) + 1

    def count_auto_rounds(self, per_round: dict) -> None:
        """Online auto's figures by row bucket and mode, as they stand (RoundChoice)."""
        self.per_round = per_round

    def count_hand_over(self, steps: int) -> None:
        """Offline auto handed a losing lookahead over to plain decoding after `steps`."""
        self.config.switched_to_plain_after_steps = steps

    def count_result(self, new_tokens: int, steps: int, step_tokens: int) -> None:
        """A request ended with `new_tokens` (a stop string's cut made), after `steps`
        forward passes past its prefill that emitted `step_tokens` (an EOS too)."""
        self.prompts += 1
        self.new_tokens += new_tokens
        self.row_steps += steps
        self.step_tokens += step_tokens

    def count_process(self, new_tokens: int, row_steps: int, longest_steps: int) -> None:
        """lj.generate: this process's rows' totals, and the longest row's steps."""
        self.process_new_tokens, self.process_row_steps = new_tokens, row_steps
        self.step_ms = 1000 * self.decode_s / max(longest_steps, 1)

    def count_prefix(self, prompt_tokens: int, cached_tokens: int) -> None:
        """One request prefilled with the prefix cache on, `cached_tokens` of its prompt
        taken from it."""
        self.prefix_lookups += 1
        self.prefix_hits += cached_tokens > 0
        self.prefix_hit_tokens += cached_tokens
        self.prompt_tokens += prompt_tokens

    def count_sources(self, names: tuple[str, ...], nodes_n, paths_n, tokens_n, weights_na=None):
        """Add finished rows' per-source counts [n_sources], summed: nodes proposed,
        accepted paths and guessed tokens credited; weights_na [n_sources, A]: the
        finished rows' record weights by depth, averaged so far."""
        for i, name in enumerate(names):
            entry = self.sources.setdefault(name, SourceStats())
            entry.proposed += int(nodes_n[i])
            entry.paths += int(paths_n[i])
            entry.tokens += int(tokens_n[i])
            if weights_na is not None:
                entry.weight_by_depth = [round(float(w), 4) for w in weights_na[i]]

    def close(self, wall_s: float, hist_e=None, interrupted: bool = False) -> None:
        """The totals of a run that ended (by Ctrl-C: `interrupted`); `hist_e` [E]: the
        finished rows' steps by tokens emitted."""
        if hist_e is not None:
            self.accepted_hist = {str(i + 1): int(c) for i, c in enumerate(hist_e)}
        self.wall_s, self.interrupted = wall_s, interrupted

    def as_dict(self) -> dict:
        """The JSON form: every field (a source's without weight_by_depth when it has
        none) and the rates."""
        out = dataclasses.asdict(dataclasses.replace(self, config=None))
        out["config"] = {} if self.config is None else self.config.as_dict()
        for entry in out["sources"].values():
            if entry["weight_by_depth"] is None:
                del entry["weight_by_depth"]
        return {
            **out,
            "compression": self.compression,
            "tokens_per_s": self.tokens_per_s,
            "accepted_tokens": self.accepted_tokens,
        }


@dataclasses.dataclass
class RunConfig:
    """How a run decodes (Stats.config): its layout (None: plain decoding), cache dtype,
    whether any row may sample, the engine's default sampling settings, and with
    lookahead "auto" what it chose and why (autotune.Choice) and the step after which it
    handed over to plain decoding (offline auto's guard; None while it has not)."""

    lookahead: LookaheadConfig | None
    dtype: str
    sampled: bool
    sampling: SamplingConfig
    auto: Choice | None = None
    switched_to_plain_after_steps: int | None = None

    def as_dict(self) -> dict:
        """The JSON form (the CLI's --json "config"): the layout's describe(), the
        sampling settings' fields, and with auto "lookahead_auto": the choice's describe()
        with switched_to_plain_after_steps."""
        out = {
            "lookahead": None if self.lookahead is None else self.lookahead.describe(),
            "dtype": self.dtype,
            "sampled": self.sampled,
            **self.sampling.describe(),
        }
        if self.auto is not None:
            out["lookahead_auto"] = {
                **self.auto.describe(),
                "switched_to_plain_after_steps": self.switched_to_plain_after_steps,
            }
        return out
