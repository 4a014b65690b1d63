"""The server's Prometheus metrics (prometheus-client, a registry per server): requests,
tokens, time to first token and request duration as they happen; queue length, slots in
use, tokens per step, accepted guesses, seconds in prefills and in decode rounds, rounds
by row bucket and auto's per-round choices read from the engine when scraped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self, engine):
        self.engine = engine
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "lookahead_requests", "Requests answered", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter("lookahead_prompt_tokens", "Prompt tokens", registry=r)
        self.generated_tokens = Counter(
            "lookahead_generated_tokens", "Tokens generated", registry=r
        )
        self.ttft = Histogram(
            "lookahead_time_to_first_token_seconds",
            "From a request's arrival to its first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "lookahead_request_duration_seconds",
            "From a request's arrival to its last token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Gauge("lookahead_queue_length", "Requests waiting for a slot", registry=r)
        self.slots = Gauge("lookahead_slots_in_use", "Slots decoding a request", registry=r)
        self.batch = Gauge("lookahead_slots", "Slots (the batch)", registry=r)
        self.tokens_per_step = Gauge(
            "lookahead_tokens_per_step",
            "New tokens per forward pass of a row, since the server started",
            registry=r,
        )
        self.accepted = Gauge(
            "lookahead_accepted_guesses",
            "Guessed tokens accepted by lookahead steps, since the server started",
            registry=r,
        )

        self.prefix_hits = Gauge(
            "lookahead_prefix_cache_hits",
            "Requests whose prompt started with blocks from the prefix cache, since the "
            "server started",
            registry=r,
        )
        self.prefix_misses = Gauge(
            "lookahead_prefix_cache_misses",
            "Requests prefilled with the prefix cache on that found nothing in it",
            registry=r,
        )
        self.prefix_hit_tokens = Gauge(
            "lookahead_prefix_cache_hit_tokens",
            "Prompt tokens taken from the prefix cache instead of computed",
            registry=r,
        )

        self.rounds = Gauge(
            "lookahead_rounds",
            "Decode rounds by the rows they ran at (a row bucket holding the live slots)",
            ["rows"],
            registry=r,
        )
        self.auto_rounds = Gauge(
            "lookahead_auto_rounds",
            "auto's rounds by row bucket and mode (lookahead or plain steps)",
            ["rows", "mode"],
            registry=r,
        )
        self.auto_rate = Gauge(
            "lookahead_auto_tokens_per_second_per_row",
            "What auto measured of each mode at each row bucket: new tokens a second per "
            "live row over its last rounds",
            ["rows", "mode"],
            registry=r,
        )
        self.auto_step = Gauge(
            "lookahead_auto_step_milliseconds",
            "What a step costs at each row bucket in each mode, over its last rounds: auto "
            "runs lookahead where the live rows' acceptance pays for its cost over plain's",
            ["rows", "mode"],
            registry=r,
        )
        self.auto_calibration = Gauge(
            "lookahead_auto_calibration",
            "At each row bucket, the tokens lookahead rounds emitted over what the rows' "
            "acceptance predicted (decayed): auto scales its prediction by it",
            ["rows"],
            registry=r,
        )
        self._time_gauges(r)

    def _time_gauges(self, r) -> None:
        """Where the engine's seconds went: compiling programs and grammars, prefills,
        decode rounds (and the grammar requests beside their compile time)."""
        self.compile_s = Gauge(
            "lookahead_compile_seconds",
            "Seconds spent compiling programs for new shapes, since the server started",
            registry=r,
        )
        self.grammar_requests = Gauge(
            "lookahead_grammar_requests",
            "Requests admitted under a response_format grammar, since the server started",
            registry=r,
        )
        self.grammar_compile_s = Gauge(
            "lookahead_grammar_compile_seconds",
            "Seconds spent compiling response_format grammars to automata (a schema kept "
            "from before compiles in none), counted as requests are admitted, since the "
            "server started",
            registry=r,
        )
        self.prefill_s = Gauge(
            "lookahead_prefill_seconds",
            "Seconds the engine spent in prefills, their inserts and chunks (compiles left "
            "out), since the server started",
            registry=r,
        )
        self.prefill_positions = Gauge(
            "lookahead_prefill_positions",
            "Positions the prefills ran, padding included (rows x side), since the server started",
            registry=r,
        )
        self.decode_s = Gauge(
            "lookahead_decode_seconds",
            "Seconds the engine spent in decode rounds (compiles left out), since the server "
            "started",
            registry=r,
        )

    def scrape(self) -> bytes:
        stats = self.engine.online_stats  # (an offline run on this engine has its own)
        self.queue.set(self.engine.queued)
        self.slots.set(self.engine.slots_in_use)
        self.batch.set(self.engine.batch)
        if stats.row_steps:
            self.tokens_per_step.set(stats.compression)
        self.accepted.set(stats.accepted_tokens)
        self.prefix_hits.set(stats.prefix_hits)
        self.prefix_misses.set(stats.prefix_lookups - stats.prefix_hits)
        self.prefix_hit_tokens.set(stats.prefix_hit_tokens)
        self.compile_s.set(stats.compile_s)
        self.grammar_requests.set(stats.grammar_requests)
        self.grammar_compile_s.set(stats.grammar_compile_s)
        self.prefill_s.set(stats.prefill_s)
        self.prefill_positions.set(stats.prefill_positions)
        self.decode_s.set(stats.decode_s)
        for rows, n in dict(stats.rounds_by_rows).items():
            self.rounds.labels(rows=str(rows)).set(n)
        for rows, modes in dict(stats.per_round).items():
            for mode, seen in modes.items():
                self.auto_rounds.labels(rows=rows, mode=mode).set(seen["rounds"])
                if "step_ms" in seen:  # (a first round is not timed)
                    self.auto_step.labels(rows=rows, mode=mode).set(seen["step_ms"])
                    rate = seen["tokens_per_s_per_row"]
                    self.auto_rate.labels(rows=rows, mode=mode).set(rate)
                if "calibration" in seen:
                    self.auto_calibration.labels(rows=rows).set(seen["calibration"])
        return generate_latest(self.registry)
