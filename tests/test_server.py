"""The OpenAI-compatible server, as its clients see it: `python -m lookahead_jax.serve` in
a subprocess on a free port, spoken to with the real `openai` client (and httpx where a
client must misbehave). The tiny model in float64 with a character tokenizer, so every
answer can be compared token for token with a lone decode of its prompt."""

import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import jax
import numpy as np
import openai
import pytest

import lookahead_jax as lj

MODEL = "tiny"
KEY = "test-key"
PROMPTS = ["The cat sat on the", "Once upon a time", "2 + 2 =", "Hello, world", "abc abc ab"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(ckpt, *flags, port=None, dtype="float64", model_name=MODEL):
    port = port or free_port()
    env = dict(os.environ, JAX_ENABLE_X64="1", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "lookahead_jax.serve", "--ckpt", str(ckpt), "--port",
           str(port), "--model-name", model_name, "--dtype", dtype, "--log-level", "warning",
           *flags]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, f"http://127.0.0.1:{port}"
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not come up")


def stop_server(proc) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, proc.stderr.read()


# The module's server's flags: with start_server's float64 they set the programs it
# compiles (test_lm_eval.py's server takes them too, and its programs from the run's
# compile cache)
SERVER_FLAGS = ("--batch", "4", "--max-new-tokens", "16", "--lookahead", "tokens=16",
                "--stream-steps", "2")  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_text_ckpt):
    proc, url = start_server(tiny_text_ckpt, *SERVER_FLAGS, "--api-key", KEY, "--log-every", "1")
    yield url
    decoded = metric(url, "lookahead_generated_tokens_total") > 0
    code, err = stop_server(proc)
    assert code == 0, err
    start = [line for line in err.splitlines() if line.startswith("serving ")]
    assert start and start[0].endswith("; lookahead tokens=16 every round)"), err
    if decoded:  # the periodic line (the last at shutdown): what the requests did
        line = r"last \d+ s: \d+ requests? done with \d+ tokens, .* tokens a step"
        assert re.search(line, err), err


@pytest.fixture(scope="module")
def reference(tiny_text_ckpt):
    """A lone decode of one prompt (lj.generate, batch 1, plain): text and token ids."""
    with jax.enable_x64(True):
        model = lj.load(tiny_text_ckpt, dtype="float64")

    def decode(
        prompt, max_tokens, temperature=0.0, seed=0, chat=False, top_p=None, logprobs=None,
        json_schema=None,
    ):  # fmt: skip
        """(text, token ids), and with `logprobs` the tokens' TokenLogprobs third."""
        with jax.enable_x64(True):
            out = lj.generate(
                model, [prompt], max_new_tokens=max_tokens, temperature=temperature,
                seed=seed, chat=chat, top_p=top_p, lookahead=None, logprobs=logprobs,
                json_schema=json_schema,
            )  # fmt: skip
        if logprobs is not None:
            return out.texts[0], out.token_ids[0], out.logprobs[0]
        return out.texts[0], out.token_ids[0]

    decode.model = model

    return decode


def client(url, key=KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def metric(url, name: str) -> float:
    """A gauge or counter of the server's /metrics."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def accepted_guesses(url) -> float:
    """The server's count of guessed tokens its lookahead steps accepted (/metrics)."""
    return metric(url, "lookahead_accepted_guesses")


def test_completions_and_chat_whole_and_streamed(server, reference):
    c = client(server)
    before = accepted_guesses(server)
    hit_tokens = metric(server, "lookahead_prefix_cache_hit_tokens")
    want, ids = reference(PROMPTS[0], 12)
    got = c.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0)
    assert got.choices[0].text == want
    assert got.usage.completion_tokens == len(ids)
    assert got.choices[0].finish_reason == ("length" if len(ids) == 12 else "stop")
    chunks = list(
        c.completions.create(
            model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want
    assert chunks[-1].usage.completion_tokens == len(ids) and not chunks[-1].choices
    assert chunks[-2].choices[0].finish_reason == got.choices[0].finish_reason
    # the stream's prompt (18 tokens) took its first block from the prefix cache (the
    # server's default) and still decoded to the lone decode's text
    assert metric(server, "lookahead_prefix_cache_hit_tokens") >= hit_tokens + 16

    want_chat, _ = reference(PROMPTS[1], 10, chat=True)
    messages = [{"role": "user", "content": PROMPTS[1]}]
    got = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    assert got.choices[0].message.content == want_chat
    assert got.choices[0].message.role == "assistant"
    stream = c.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0, stream=True
    )
    pieces = [ch.choices[0].delta.content or "" for ch in stream]
    assert "".join(pieces) == want_chat
    assert accepted_guesses(server) > before  # not vacuous: the tokens=16 steps accepted guesses


def test_prompt_lists_and_n_choices_each_equal_a_lone_decode(server, reference):
    """Choice i of a request is prompt i // n, sampled with seed + i: whole or streamed
    (each chunk names its choice), text or token-id prompts, completions and chat."""
    c = client(server)
    prompts = [PROMPTS[2], PROMPTS[4]]
    want = [reference(prompts[i // 2], 6, temperature=0.8, seed=5 + i) for i in range(4)]
    kw = dict(model=MODEL, prompt=prompts, n=2, max_tokens=6, temperature=0.8, seed=5)
    got = c.completions.create(**kw)
    assert [ch.index for ch in got.choices] == [0, 1, 2, 3]
    assert [ch.text for ch in got.choices] == [text for text, _ in want]
    assert got.usage.completion_tokens == sum(len(ids) for _, ids in want)
    streamed = ["", "", "", ""]
    for chunk in c.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == [text for text, _ in want]
    ids = [[5, 6, 7, 8], [9, 10, 11]]
    got = c.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0)
    assert [ch.text for ch in got.choices] == [reference(p, 5)[0] for p in ids]
    assert got.usage.prompt_tokens == 7
    messages = [{"role": "user", "content": PROMPTS[1]}]
    got = c.chat.completions.create(
        model=MODEL, messages=messages, n=2, max_tokens=5, temperature=0.8, seed=3
    )
    want_chat = [reference(PROMPTS[1], 5, temperature=0.8, seed=3 + j, chat=True) for j in (0, 1)]
    assert [ch.message.content for ch in got.choices] == [text for text, _ in want_chat]


def test_logprobs_whole_and_streamed_equal_a_lone_decodes(server, reference):
    """Completions (whole, streamed, beside a request without logprobs) and chat: each
    token's logprob and alternatives are a lone plain decode's; the token strings add
    up to the text, text_offset where each starts; a sampled request's too."""
    c = client(server)
    text, ids, want = reference(PROMPTS[4], 10, logprobs=3)
    kw = dict(model=MODEL, prompt=PROMPTS[4], max_tokens=10, temperature=0, logprobs=3)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        plain = pool.submit(c.completions.create, **{**kw, "logprobs": None})
        got = c.completions.create(**kw).choices[0]
        assert plain.result().choices[0].logprobs is None
        assert plain.result().choices[0].text == got.text == text
    lp, k = got.logprobs, len(ids)
    n = k + (k < 10)  # an answer that ended at EOS lists it last, with the text ""
    assert "".join(lp.tokens) == text and len(lp.tokens) == n and lp.tokens[k:] in ([], [""])
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(n)]
    assert lp.token_logprobs[:k] == pytest.approx([w.logprob for w in want], abs=1e-9)
    for top, w, token in zip(lp.top_logprobs[:k], want, lp.tokens[:k], strict=True):
        assert top[token] == pytest.approx(w.logprob, abs=1e-9)  # greedy: the best one
        assert max(top.values()) == pytest.approx(w.top[0][1], abs=1e-9)
        assert set(top.values()) <= {v for _, v in w.top}
    streamed = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for chunk in c.completions.create(**kw, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            for key, values in streamed.items():
                values += getattr(chunk.choices[0].logprobs, key)
    assert streamed == {k: getattr(lp, k) for k in streamed}
    _, _, want = reference(PROMPTS[2], 6, temperature=0.8, seed=4, logprobs=0)
    got = c.completions.create(**{**kw, "prompt": PROMPTS[2], "max_tokens": 6,
                                  "temperature": 0.8, "seed": 4, "logprobs": 0})  # fmt: skip
    assert got.choices[0].logprobs.token_logprobs == pytest.approx([w.logprob for w in want])
    assert all(len(top) == 1 for top in got.choices[0].logprobs.top_logprobs)  # the token
    messages = [{"role": "user", "content": PROMPTS[1]}]
    text, _, want = reference(PROMPTS[1], 5, chat=True, logprobs=2)
    got = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0,
                                    logprobs=True, top_logprobs=2).choices[0]  # fmt: skip
    content = got.logprobs.content
    assert "".join(e.token for e in content) == got.message.content == text
    assert [e.logprob for e in content] == pytest.approx([w.logprob for w in want], abs=1e-9)
    got_top = [t.logprob for e in content for t in e.top_logprobs]
    assert got_top == pytest.approx([v for w in want for _, v in w.top], abs=1e-9)
    assert all(len(e.top_logprobs) == 2 for e in content)
    r = httpx.post(f"{server}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": MODEL, "messages": messages, "top_logprobs": 2})  # fmt: skip
    assert r.status_code == 400 and "needs logprobs" in r.json()["error"]["message"], r.text
    # a stop string and two choices: each choice's logprobs cover its tokens, the stop
    # string's last token included (its text cut)
    text, ids = reference(PROMPTS[4], 10)
    stop = text[3:5]
    got = c.completions.create(**{**kw, "stop": [stop], "n": 2})
    for choice in got.choices:
        assert choice.text == text[: text.find(stop)] and choice.finish_reason == "stop"
        assert "".join(choice.logprobs.tokens).startswith(choice.text + stop)
        assert len(choice.logprobs.tokens) == got.usage.completion_tokens // 2


def test_echo_returns_the_prompt_and_its_logprobs(server, reference):
    """lm-evaluation-harness's loglikelihood request (a list of token-id prompts, echo,
    logprobs 1, max_tokens 1) and max_tokens 0: the prompt's tokens and logprobs (the
    first null) are one causal pass's, whole and streamed, followed by the new token's."""
    model = reference.model
    tok = model.tokenizer
    ids = [tok.encode(p) for p in PROMPTS[:2]]
    c = client(server)
    got = c.completions.create(model=MODEL, prompt=ids, echo=True, logprobs=1, max_tokens=1,
                               temperature=0)  # fmt: skip
    for prompt, choice in zip(ids, got.choices, strict=True):
        with jax.enable_x64(True):
            full = lj.testing.full_pass_logits(model, prompt)
        shifted = full - full.max(-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        want = [None] + [logp[j - 1, prompt[j]] for j in range(1, len(prompt))]
        lp = choice.logprobs
        assert len(lp.token_logprobs) == len(prompt) + 1 and lp.token_logprobs[0] is None
        assert lp.top_logprobs[0] is None
        # float32 logprob buffers (decoding/logprobs.py) against float64 numpy
        assert lp.token_logprobs[1 : len(prompt)] == pytest.approx(want[1:], abs=1e-6)
        text, new = reference(prompt, 1)
        assert choice.text == tok.decode(prompt) + text
        assert "".join(lp.tokens) == choice.text
        # lm-eval's greedy check: each token is its top alternative's
        for value, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True):
            assert max(top.values()) >= value
    zero = c.completions.create(model=MODEL, prompt=PROMPTS[0], echo=True, logprobs=2,
                                max_tokens=0)  # fmt: skip
    assert zero.choices[0].text == PROMPTS[0] and zero.usage.completion_tokens == 0
    n_prompt = len(tok.encode(PROMPTS[0]))
    assert len(zero.choices[0].logprobs.token_logprobs) == n_prompt
    streamed, logprobs = "", []
    for chunk in c.completions.create(model=MODEL, prompt=PROMPTS[0], echo=True, logprobs=2,
                                      max_tokens=3, temperature=0, stream=True):  # fmt: skip
        if chunk.choices:
            streamed += chunk.choices[0].text
            if chunk.choices[0].logprobs is not None:
                logprobs += chunk.choices[0].logprobs.token_logprobs
    assert streamed == PROMPTS[0] + reference(PROMPTS[0], 3)[0]
    assert logprobs[:n_prompt] == zero.choices[0].logprobs.token_logprobs
    # echo without logprobs, streamed, max_tokens null (16): the prompt, then the text
    body = {"model": MODEL, "prompt": PROMPTS[0], "echo": True, "max_tokens": None,
            "temperature": 0, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{server}/v1/completions", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:  # fmt: skip
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == (
        PROMPTS[0] + reference(PROMPTS[0], 16)[0]
    )
    assert all(e["choices"][0]["logprobs"] is None for e in events if e["choices"])
    r = httpx.post(f"{server}/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": MODEL, "prompt": "hi", "max_tokens": 0})  # fmt: skip
    assert r.status_code == 400 and "needs echo" in r.json()["error"]["message"], r.text


def test_sixteen_concurrent_requests_each_equal_a_lone_decode(server, reference):
    """Greedy and seeded sampling side by side, different max_tokens, stop strings: each
    answer is its lone decode's (cut before the first stop string)."""
    jobs = []
    for i in range(16):
        prompt = PROMPTS[i % len(PROMPTS)]
        job = {"prompt": prompt, "max_tokens": 4 + i % 13, "temperature": 0.0, "seed": 0}
        if i % 3 == 1:
            job.update(temperature=0.8, seed=100 + i)
        if i % 3 == 2:
            job.update(temperature=1.1, seed=200 + i, top_p=0.9)
        text, _ = reference(prompt, job["max_tokens"], job["temperature"], job["seed"],
                            top_p=job.get("top_p"))  # fmt: skip
        if i % 4 == 0 and len(text) > 4:
            job["stop"] = [text[2:4]]  # a stop string the answer really contains
            text = text[: text.find(text[2:4])]
        jobs.append((job, text))
    c = client(server)
    before = accepted_guesses(server)

    def ask(job):
        kw = {k: v for k, v in job.items() if k != "prompt"}
        return c.completions.create(model=MODEL, prompt=job["prompt"], **kw).choices[0]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, [job for job, _ in jobs]))
    for (job, want), got in zip(jobs, answers, strict=True):
        assert got.text == want, job
        if "stop" in job:
            assert got.finish_reason == "stop"
    assert accepted_guesses(server) > before


def test_a_client_that_disconnects_mid_stream_frees_its_slot(server, reference):
    body = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 16, "temperature": 0,
            "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # the first chunk, then hang up
    want, _ = reference(PROMPTS[3], 8)
    got = client(server).completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=8,
                                            temperature=0)  # fmt: skip
    assert got.choices[0].text == want
    deadline = time.time() + 30
    while time.time() < deadline:  # every slot free again
        metrics = httpx.get(f"{server}/metrics").text
        if "lookahead_slots_in_use 0.0" in metrics:
            break
        time.sleep(0.2)
    assert "lookahead_slots_in_use 0.0" in metrics
    # the server saw the client go (a 499 in its books), not only the budget run out
    assert 'lookahead_requests_total{endpoint="/v1/completions",status="499"} 1.0' in metrics
    assert metric(server, "process_resident_memory_bytes") > 2**20  # (the process's own)


def test_a_non_text_chat_part_is_a_400_and_a_blank_prompt_is_served(server):
    headers = {"Authorization": f"Bearer {KEY}"}
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [image]}]}
    r = httpx.post(f"{server}/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    body = {"model": MODEL, "prompt": " ", "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{server}/v1/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "body,status,param",
    [
        ({"prompt": "hi", "max_tokens": 4, "temperature": -1}, 400, "temperature"),
        ({"prompt": "hi", "max_tokens": 4, "n": 0}, 400, "n"),
        ({"prompt": ["a", "b", "c"], "max_tokens": 4, "n": 50}, 400, "n"),  # 150 choices
        ({"prompt": ["a", ""], "max_tokens": 4}, 400, "prompt"),
        ({"prompt": "hi", "max_tokens": 4, "logprobs": 21}, 400, "logprobs"),
        ({"prompt": "hi", "max_tokens": 4, "logprobs": True}, 400, "logprobs"),  # strict
        ({"prompt": "hi", "max_tokens": 4, "bogus": 1}, 400, "bogus"),
        ({"prompt": "hi", "max_tokens": 99}, 400, "max_tokens"),
        ({"prompt": "x" * 1020, "max_tokens": 8}, 400, "prompt"),
        ({"prompt": [5, 999], "max_tokens": 4}, 400, "prompt"),
        ({"prompt": "", "max_tokens": 4}, 400, "prompt"),
        ({"prompt": "hi", "max_tokens": 4, "model": "other"}, 404, "model"),
        ({"prompt": "hi", "max_tokens": "4"}, 400, "max_tokens"),  # strict: not a number
        ({"prompt": 5, "max_tokens": 4}, 400, "prompt"),
        ({"prompt": "hi", "max_tokens": 4, "seed": 2**64}, 400, "seed"),
        ({"prompt": "hi", "max_tokens": 4, "top_k": 2**40}, 400, "top_k"),
    ],
)
def test_bad_requests_get_an_openai_error_naming_the_field(server, body, status, param):
    body = {"model": MODEL, **body}
    r = httpx.post(f"{server}/v1/completions", json=body,
                   headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"]
    # in the API's words: not the engine's internal request id or its field names
    assert "req-" not in error["message"] and "max_new_tokens" not in error["message"]
    assert "Value error" not in error["message"]  # pydantic's prefix, not the API's words


@pytest.mark.parametrize(
    "endpoint,body,words",
    [
        ("completions", {"prompt": "hi", "max_tokens": 99},
         ["max_tokens = 99", "the server's --max-new-tokens (16)", "at most 16", "raise it to 99"]),
        ("chat/completions",
         {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 99},
         ["max_completion_tokens = 99", "the server's --max-new-tokens (16)"]),
        ("completions", {"prompt": "x" * 1020, "max_tokens": 8},
         ["the prompt has", "the server's --max-prompt-tokens", "raise it to"]),
    ],
)  # fmt: skip
def test_a_limit_error_names_the_server_flag_and_the_value_to_raise_it_to(
    server, endpoint, body, words
):
    r = httpx.post(f"{server}/v1/{endpoint}", json={"model": MODEL, **body},
                   headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert all(w in message for w in words), message
    assert "${" not in message and "engine" not in message


def test_bad_json_auth_models_health_and_the_server_keeps_serving(server, reference):
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    r = httpx.post(f"{server}/v1/completions", content=b"{not json", headers=headers)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert httpx.get(f"{server}/v1/models").status_code == 401  # no key
    with pytest.raises(openai.AuthenticationError):
        client(server, "wrong").models.list()
    assert [m.id for m in client(server).models.list().data] == [MODEL]
    health = httpx.get(f"{server}/health").json()
    assert health == {"status": "ok", "decoding": "lookahead tokens=16 every round"}
    metrics = httpx.get(f"{server}/metrics").text
    for name in (
        "lookahead_requests_total",
        "lookahead_generated_tokens_total",
        "lookahead_tokens_per_step",
        "lookahead_queue_length",
        "lookahead_slots_in_use",
    ):
        assert name in metrics  # fmt: skip
    spent = ("lookahead_prefill_seconds", "lookahead_decode_seconds", "lookahead_prefill_positions")
    before = {name: metric(server, name) for name in spent}
    nul = httpx.post(f"{server}/v1/completions", headers=headers,
                     json={"model": MODEL, "prompt": PROMPTS[4], "max_tokens": None})  # fmt: skip
    assert nul.status_code == 200 and nul.json()["usage"]["completion_tokens"] <= 16
    grew = {name: metric(server, name) - before[name] for name in spent}  # where it went
    assert grew["lookahead_prefill_seconds"] > 0 and grew["lookahead_decode_seconds"] > 0
    assert grew["lookahead_prefill_positions"] >= 1
    want, _ = reference(PROMPTS[4], 6)
    got = client(server).completions.create(model=MODEL, prompt=PROMPTS[4], max_tokens=6,
                                            temperature=0)  # fmt: skip
    assert got.choices[0].text == want


def test_a_full_queue_gets_429_and_shutdown_ends_streams_and_exits_0(tiny_text_ckpt):
    """One slot and one place in the queue: a third request at once is refused. SIGTERM
    while a stream runs: the stream ends with an error chunk and the server exits 0."""
    proc, url = start_server(
        tiny_text_ckpt, "--batch", "1", "--max-queue", "1", "--max-new-tokens", "512",
        "--no-lookahead", "--stream-steps", "1", "--max-prompt-tokens", "16",
    )  # fmt: skip
    try:
        body = {"model": MODEL, "prompt": "a", "max_tokens": 500, "temperature": 0, "stream": True}
        http = httpx.Client(timeout=60)
        with http.stream("POST", f"{url}/v1/completions", json=body) as first:
            first_lines = first.iter_lines()
            next(first_lines)  # decoding now, in the only slot
            with http.stream("POST", f"{url}/v1/completions", json=body) as second:
                assert second.status_code == 200  # waits in the queue
                third = http.post(f"{url}/v1/completions", json=body)
                assert third.status_code == 429
                assert third.json()["error"]["type"] == "rate_limit_error"
                proc.send_signal(signal.SIGTERM)
                lines = [line for line in first_lines if line]
        http.close()
        assert lines[-1] == "data: [DONE]"
        assert "error" in json.loads(lines[-2].removeprefix("data: "))
        assert proc.wait(timeout=60) == 0
        err = proc.stderr.read()
        # the round that was finishing when the event loop closed is not a failure
        assert "a decoding round failed" not in err and "Event loop is closed" not in err, err
    finally:  # never leave a server behind
        if proc.poll() is None:
            proc.kill()


def test_a_port_in_use_is_refused_before_the_model_loads(tiny_text_ckpt):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "lookahead_jax.serve", "--ckpt", str(tiny_text_ckpt),
             "--port", str(port)],
            capture_output=True, text=True, timeout=120,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
        )  # fmt: skip
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f":{port}" in lines[0] and "serving" not in r.stderr, r.stderr


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--batch", "0"], "batch (--batch) must be an integer >= 1, got 0"),
        (["--prefill-chunk", "8"], "prefill_chunk (--prefill-chunk) must be"),
        (["--steps-per-call", "0"], "steps_per_call (--steps-per-call) must be an integer"),
        (["--prefix-cache-mb", "inf"], "prefix_cache_mb (--prefix-cache-mb) must be a finite"),
        (["--max-queue", "0"], "--max-queue must be >= 1"),
        (["--grammar-states", "70000"], "grammar_states (--grammar-states) must be at most"),
    ],
)
def test_the_servers_flags_are_refused_by_the_engines_rules(flags, words):
    """The engine's settings from the server's flags go through EngineConfig: the same
    refusal, in the same words, as the library's and the dataset command's."""
    from lookahead_jax.cli.serve import _validate, build_parser

    with pytest.raises(lj.UserInputError, match=re.escape(words)):
        _validate(build_parser().parse_args(flags))


def test_auto_chooses_its_layout_for_greedy_rows_unless_told():
    from lookahead_jax.cli.serve import _validate, build_parser

    parser = build_parser()
    assert parser.parse_args([]).auto_temperature == 0.0  # rounds that lose run plain
    assert _validate(parser.parse_args(["--auto-temperature", "0"])).lookahead == "auto"
    with pytest.raises(lj.UserInputError, match="--auto-temperature must be in 0..2"):
        _validate(parser.parse_args(["--auto-temperature", "2.5"]))


def test_the_activity_line_counts_an_interval_and_plain_reads_one_token_a_step():
    from types import SimpleNamespace as NS

    from lookahead_jax.engine.stats import SourceStats, Stats
    from lookahead_jax.server.activity_log import ActivityLog

    engine = NS(online_stats=Stats(), slots_in_use=2, queued=1)
    t0 = time.perf_counter()
    log = ActivityLog(engine, every_s=10)
    assert log.line(now=t0 + 5) is None  # nothing finished: no line
    s = engine.online_stats
    s.prompts, s.new_tokens, s.row_steps, s.step_tokens = 3, 30, 27, 27  # plain
    line = log.line(now=t0 + 10)  # (since the last line: the quiet interval too)
    assert "3 requests done with 30 tokens, 2 decoding, 1 waiting" in line
    assert "1.00 tokens a step, 0 guesses accepted" in line and "last 10 s" in line
    s.prompts, s.new_tokens, s.row_steps, s.step_tokens = 4, 50, 35, 46  # + 8 steps, 19 tokens
    s.sources["ngram"] = SourceStats(tokens=11)
    s.per_round = {"1": {"lookahead": {"rounds": 5}, "plain": {"rounds": 2}}}
    line = log.line(now=t0 + 20)
    assert "1 request done with 20 tokens" in line and "2.38 tokens a step" in line
    assert "11 guesses accepted; auto rounds: 1 row 5 lookahead / 2 plain" in line
    assert log.line(now=t0 + 30) is None


SCHEMA = {
    "type": "object",
    "properties": {"k": {"enum": ["ab", "ba"]}, "ok": {"type": "boolean"}},
    "required": ["k", "ok"],
}


def test_response_format_json_schema_whole_and_streamed(server, reference):
    """response_format json_schema (docs/serving.md): the answer is the lone decode's
    under the same schema, whole and streamed, and valid; json_object is the schema of
    any object; what cannot be enforced is a 400 naming response_format."""
    c = client(server)
    fmt = {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA}}
    messages = [{"role": "user", "content": PROMPTS[1]}]
    want, _ = reference(PROMPTS[1], 16, chat=True, json_schema=SCHEMA)
    got = c.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0, response_format=fmt
    )
    assert got.choices[0].message.content == want
    if got.choices[0].finish_reason == "stop":
        import jsonschema

        jsonschema.validate(json.loads(want), SCHEMA)
    stream = c.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0, response_format=fmt,
        stream=True,
    )  # fmt: skip
    assert "".join(ch.choices[0].delta.content or "" for ch in stream) == want
    want, _ = reference(PROMPTS[1], 16, chat=True, json_schema={"type": "object"})
    got = c.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0,
        response_format={"type": "json_object"},
    )  # fmt: skip
    assert got.choices[0].message.content == want and want.startswith("{")
    assert metric(server, "lookahead_grammar_requests") >= 3  # the schema's twice, this one
    assert metric(server, "lookahead_grammar_compile_seconds") > 0
    if got.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(want), dict)
    bad_schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"minimum": 1}}}
    for bad, needle in ((bad_schema, "minimum"), ({"type": "json"}, "json_object")):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=4, response_format=bad
            )
        assert needle in str(e.value), e.value
        assert (e.value.body or {}).get("param", "").startswith("response_format"), e.value.body


def test_a_grammar_compiles_off_the_event_loop(tiny_text_ckpt, monkeypatch):
    """A request's grammar compiles as it is queued (seconds, for a large schema at a real
    vocabulary): on a worker thread, so that the event loop goes on answering the others
    (the app in process, its engine not started: the compile is refused here); a shutdown
    that begins while it compiles answers it 503 (it is not left open)."""
    import asyncio
    import threading

    from lookahead_jax import grammar
    from lookahead_jax.server.app import create_app
    from lookahead_jax.server.runner import EngineRunner

    on_main, compile_schema = [], grammar.from_json_schema

    def compiling(*args, **kwargs):
        on_main.append(threading.current_thread() is threading.main_thread())
        if len(on_main) == 2:  # the second request: the server begins to stop meanwhile
            runner.end_streams()
            return compile_schema(*args, **kwargs)
        raise lj.UserInputError("json_schema: refused by the test")

    monkeypatch.setattr(grammar, "from_json_schema", compiling)
    engine = lj.Engine(lj.load(tiny_text_ckpt), batch=1, lookahead=None, grammar_states=64)
    runner = EngineRunner(engine)
    app = create_app(runner, MODEL)
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    async def ask():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as c:
            return [
                await c.post("/v1/chat/completions", json={**body, "response_format": fmt})
                for _ in range(2)
            ]

    refused, stopped = asyncio.run(ask())  # (the event loop: this thread)
    assert refused.status_code == 400 and "refused by the test" in refused.text, refused.text
    assert stopped.status_code == 503 and "shutting down" in stopped.text, stopped.text
    assert on_main == [False, False] and not runner._open
