"""The HTTP server: an OpenAI-compatible API (app.py, the request and response shapes in
protocol.py, Prometheus metrics in metrics.py) over the online engine, which runs in a
thread of its own (runner.py), and a periodic log line of what it did (activity_log.py).
`python -m lookahead_jax.serve` starts it (cli/serve.py)."""
