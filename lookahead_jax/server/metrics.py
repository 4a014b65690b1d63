"""The server's Prometheus metrics (prometheus-client, a registry per server): requests,
tokens, time to first token and request duration as they happen; queue length, slots in
use, tokens per step, accepted guesses, seconds in prefills and in decode rounds, rounds
by row bucket and auto's per-round choices read from the engine when scraped; the
process's resident memory and CPU seconds (prometheus-client's process collector)."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
SINCE = ", since the server started"
# (Stats field, metric, help): the gauges that copy one field of the engine's stats
STATS_GAUGES = (
    ("accepted_tokens", "lookahead_accepted_guesses",
     "Guessed tokens accepted by lookahead steps" + SINCE),
    ("prefix_hits", "lookahead_prefix_cache_hits",
     "Requests whose prompt started with blocks from the prefix cache" + SINCE),
    ("prefix_hit_tokens", "lookahead_prefix_cache_hit_tokens",
     "Prompt tokens taken from the prefix cache instead of computed"),
    ("compile_s", "lookahead_compile_seconds",
     "Seconds spent compiling programs for new shapes" + SINCE),
    ("grammar_requests", "lookahead_grammar_requests",
     "Requests admitted under a response_format grammar" + SINCE),
    ("grammar_compile_s", "lookahead_grammar_compile_seconds",
     "Seconds spent compiling response_format grammars to automata (a schema kept from "
     "before compiles in none), counted as requests are admitted" + SINCE),
    ("prefill_s", "lookahead_prefill_seconds",
     "Seconds the engine spent in prefills, their inserts and chunks (compiles left out)"
     + SINCE),
    ("prefill_positions", "lookahead_prefill_positions",
     "Positions the prefills ran, padding included (rows x side)" + SINCE),
    ("decode_s", "lookahead_decode_seconds",
     "Seconds the engine spent in decode rounds (compiles left out)" + SINCE),
)  # fmt: skip


class Metrics:
    def __init__(self, engine):
        self.engine = engine
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes, CPU seconds (Linux)
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
        self.prefix_misses = Gauge(
            "lookahead_prefix_cache_misses",
            "Requests prefilled with the prefix cache on that found nothing in it",
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
        # gauges that copy one Stats field each (STATS_GAUGES)
        self.from_stats = {f: Gauge(name, doc, registry=r) for f, name, doc in STATS_GAUGES}

    def scrape(self) -> bytes:
        stats = self.engine.online_stats  # (an offline run on this engine has its own)
        self.queue.set(self.engine.queued)
        self.slots.set(self.engine.slots_in_use)
        self.batch.set(self.engine.batch)
        if stats.row_steps:
            self.tokens_per_step.set(stats.compression)
        self.prefix_misses.set(stats.prefix_lookups - stats.prefix_hits)
        for field, gauge in self.from_stats.items():
            gauge.set(getattr(stats, field))
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
