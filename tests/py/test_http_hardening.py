"""HTTP hardening of `tandem serve` (issue 16): idle and half-sent
connections, half-closed clients, UTF-8 in error messages, request framing
(Transfer-Encoding, Content-Length), Allow on 405, duplicate JSON keys, the
KV-cache gauge when idle, slow readers, and prompt preparation off the HTTP
threads. All traffic is to loopback (127.0.0.1, and 127.0.0.2 as a second
client address), bounded in count and time."""
import json
import select
import socket
import threading
import time

import pytest
import requests

from conftest import MODEL_NAME

MSG = [{"role": "user", "content": "Write a function that adds two numbers."}]


# ---- raw HTTP helpers ----------------------------------------------------------

def raw_request(port, method, path, body=b"", headers=(), half_close=False, timeout=30, read=True):
    """Sends one request on a fresh socket; returns (socket, response bytes until EOF or timeout)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
    for h in headers:
        head += h.encode() + b"\r\n"
    sock.sendall(head + b"\r\n" + body)
    if half_close:
        sock.shutdown(socket.SHUT_WR)
    if not read:
        return sock, b""
    return sock, read_all(sock, timeout)


def read_all(sock, timeout):
    data = b""
    end = time.time() + timeout
    while time.time() < end:
        sock.settimeout(max(0.05, end - time.time()))
        try:
            b = sock.recv(65536)
        except (socket.timeout, TimeoutError):
            break
        except ConnectionResetError:
            break
        if not b:
            break
        data += b
        r = parse_response(data)
        if r and r[3]:  # one whole final response
            break
    return data


def parse_response(data):
    """(status, headers, body, complete) of the first final (non-1xx) response, or None."""
    while True:
        i = data.find(b"\r\n\r\n")
        if i < 0:
            return None
        head, rest = data[:i].decode("latin-1"), data[i + 4:]
        lines = head.split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for ln in lines[1:]:
            k, v = ln.split(":", 1)
            headers.setdefault(k.strip().lower(), []).append(v.strip())
        if 100 <= status < 200:
            data = rest
            continue
        break
    if "chunked" in ",".join(headers.get("transfer-encoding", [])).lower():
        body, complete = b"", False
        while True:
            j = rest.find(b"\r\n")
            if j < 0:
                break
            n = int(rest[:j].split(b";")[0], 16)
            if len(rest) < j + 2 + n + 2:
                break
            body += rest[j + 2:j + 2 + n]
            rest = rest[j + 2 + n + 2:]
            if n == 0:
                complete = True
                break
        return status, headers, body, complete
    n = int(headers.get("content-length", ["0"])[0])
    return status, headers, rest[:n], len(rest) >= n


def post_json_raw(port, path, obj, **kw):
    data = json.dumps(obj).encode()
    return raw_request(port, "POST", path, data, ["Content-Type: application/json", f"Content-Length: {len(data)}"], **kw)


def wait_metric(server, name, cond, timeout):
    end = time.time() + timeout
    v = None
    while time.time() < end:
        v = server.metrics().get(name)
        if v is not None and cond(v):
            return v
        time.sleep(0.05)
    return v


def sse_payloads(body):
    text = body.decode("utf-8")
    assert text.endswith("data: [DONE]\n\n"), text[-300:]
    evs = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in evs)
    return [json.loads(e[6:]) for e in evs[:-1]]


def idle_sockets(n, src="127.0.0.1", port=0, budget_s=10.0):
    """Up to n connections that send half a request and then nothing."""
    socks = []
    end = time.time() + budget_s
    for _ in range(n):
        if time.time() > end:
            break
        s = socket.socket()
        s.settimeout(1.0)
        try:
            s.bind((src, 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
        except OSError:
            s.close()
            continue
        socks.append(s)
    return socks


# ---- 1: idle connections, per-address limit, idle timeout -------------------------

def test_idle_sockets_from_one_address_do_not_lock_out(make_server):
    """1,000 half-sent connections from one address (127.0.0.2) leave room for others (defaults)."""
    s = make_server("--quiet")
    socks = idle_sockets(1000, src="127.0.0.2", port=s.port)
    try:
        time.sleep(0.5)  # let the server accept (and refuse) them
        t0 = time.time()
        r = requests.post(s.url("/v1/completions"), json={"prompt": "abc", "max_tokens": 4, "temperature": 0}, timeout=5)
        assert r.status_code == 200, r.text
        assert time.time() - t0 < 3
        assert requests.get(s.url("/health"), timeout=5).status_code == 200
    finally:
        for x in socks:
            x.close()


def test_per_ip_limit_and_idle_timeout(make_server):
    """--max-connections-per-ip caps one address; --idle-timeout closes idle sockets, then clients get in again."""
    s = make_server("--max-connections-per-ip", "4", "--idle-timeout", "3", "--quiet")
    t_open = time.time()
    # The readiness probe's connection may not yet be reaped by the server (slow ASan builds), in
    # which case it still counts against the address and one idle socket is refused and closed at
    # once; replace any socket the server closed until 4 idle ones are held.
    socks = []
    while len(socks) < 4 and time.time() - t_open < 1.5:
        socks += idle_sockets(4 - len(socks), port=s.port)
        time.sleep(0.2)
        keep = []
        for x in socks:
            r, _, _ = select.select([x], [], [], 0)
            if r:
                try:
                    gone = x.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    gone = True
                if gone:
                    x.close()
                    continue
            keep.append(x)
        socks = keep
    assert len(socks) == 4
    t_open = time.time()
    try:
        time.sleep(0.3)
        refused = False
        try:
            r = requests.get(s.url("/health"), timeout=2)
        except requests.RequestException:
            refused = True
        else:
            refused = r.status_code != 200
        if time.time() - t_open < 2.5 and not refused:  # else the idle timeout may already have freed a slot
            import subprocess
            ss = subprocess.run(["ss", "-tn", f"sport = :{s.port}"], capture_output=True, text=True).stdout
            print(ss, [x.getsockname() for x in socks])
        if time.time() - t_open < 2.5:
            assert refused, f"a 5th connection from the same address was served ({time.time() - t_open:.2f}s after the first)"
        # the idle ones are closed by the server after about 3 s
        for x in socks:
            x.settimeout(max(0.1, 8 - (time.time() - t_open)))
            try:
                assert x.recv(100) == b""
            except ConnectionResetError:
                pass
        assert 2.5 < time.time() - t_open < 7
        r = requests.post(s.url("/v1/completions"), json={"prompt": "abc", "max_tokens": 4, "temperature": 0}, timeout=5)
        assert r.status_code == 200
    finally:
        for x in socks:
            x.close()


def test_long_requests_outlive_idle_timeout(make_server):
    """A stream that produces data, a stream waiting in the queue and a long non-streamed request are not cut."""
    s = make_server("--idle-timeout", "1", "--max-num-seqs", "1", "--quiet")
    out = {}
    # each long request should take about 2.5 s (well over the timeout), whatever the build's speed
    t0 = time.time()
    requests.post(s.url("/v1/completions"), json={"prompt": "abc", "max_tokens": 200, "temperature": 0, "ignore_eos": True}, timeout=60)
    n_long = max(300, min(3500, int(200 / (time.time() - t0) * 2.5)))

    def stream(key, n):
        body = {"messages": MSG, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
        r = requests.post(s.url("/v1/chat/completions"), json=body, timeout=60)
        out[key] = (r.status_code, r.content)

    def plain(key, n):
        body = {"prompt": "abc", "max_tokens": n, "temperature": 0, "ignore_eos": True}
        r = requests.post(s.url("/v1/completions"), json=body, timeout=60)
        out[key] = (r.status_code, r.content)

    ts = [threading.Thread(target=stream, args=("long", n_long))]
    ts[0].start()
    time.sleep(0.2)
    ts += [threading.Thread(target=plain, args=("plain", n_long)), threading.Thread(target=stream, args=("queued", 50))]
    for t in ts[1:]:
        t.start()
    for t in ts:
        t.join(60)
    assert set(out) == {"long", "plain", "queued"}
    for k in ("long", "queued"):
        code, body = out[k]
        assert code == 200
        evs = sse_payloads(body)
        assert evs[-1]["choices"][0]["finish_reason"] == "length"
    code, body = out["plain"]
    assert code == 200 and json.loads(body)["usage"]["completion_tokens"] == n_long


def test_help_lists_the_limits():
    import subprocess
    from conftest import BIN
    h = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, timeout=10).stdout
    for flag in ("--max-connections-per-ip", "--idle-timeout", "--max-stream-buffer"):
        assert flag in h
    for flag in ("--max-connections-per-ip", "--idle-timeout", "--max-stream-buffer"):
        assert "(default " in h.split(flag, 1)[1].split("\n  --", 1)[0], flag


# ---- 2: half-closed clients ------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_half_close_gets_the_full_answer(server, stream):
    body = {"prompt": "abc", "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    sock, data = post_json_raw(server.port, "/v1/completions", body, half_close=True, timeout=30)
    sock.close()
    r = parse_response(data)
    assert r and r[3], data[:300]
    status, _, payload, _ = r
    assert status == 200, payload[:300]
    if stream:
        evs = sse_payloads(payload)
        assert evs[-2]["choices"][0]["finish_reason"] == "length"
        assert evs[-1]["usage"]["completion_tokens"] == 400
    else:
        assert json.loads(payload)["usage"]["completion_tokens"] == 400


def test_half_closed_keep_alive_connection_is_closed_after_the_answers(server):
    """HTTP/1.1 (keep-alive) requests, pipelined, then the client's FIN: every answer comes and then
    the server closes the connection at once, not after --idle-timeout (30 s here). Before the
    fix (libmicrohttpd's edge-triggered epoll missed the FIN that arrived while a request was
    being answered) the socket stayed open until the idle timeout."""
    gen = json.dumps({"prompt": "abc", "max_tokens": 20, "temperature": 0, "ignore_eos": True}).encode()
    for reqs in ([("GET", "/health", b"")], [("GET", "/v1/models", b"")],
                 [("GET", "/health", b""), ("POST", "/v1/completions", gen), ("GET", "/v1/models", b"")]):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        wire = b""
        for method, path, body in reqs:
            wire += f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
            if body:
                wire += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
            wire += b"\r\n" + body
        sock.sendall(wire)
        sock.shutdown(socket.SHUT_WR)
        t0 = time.time()
        data = b""
        while True:
            sock.settimeout(max(0.05, t0 + 10 - time.time()))
            try:
                b = sock.recv(65536)
            except (socket.timeout, TimeoutError):
                break
            if not b:
                break
            data += b
        waited = time.time() - t0
        sock.close()
        assert data.count(b"HTTP/1.1 200 OK") == len(reqs), data[:400]
        assert b'"completion_tokens":20' in data.replace(b" ", b"") or len(reqs) == 1, data[-400:]
        assert waited < 5, f"connection closed {waited:.1f} s after the client's FIN ({[r[1] for r in reqs]})"


# ---- 3: UTF-8 in error messages ------------------------------------------------------

@pytest.mark.parametrize("path", ["/%ff", "/%e2%82", "/" + "a" * 199 + "%e2%82%ac", "/" + "b" * 198 + "%f0%9f%98%80x"])
def test_error_messages_are_valid_utf8(server, path):
    r = requests.get(server.url(path), timeout=10)
    assert r.status_code == 404, r.text
    e = r.json()["error"]
    assert e["type"] == "not_found_error" and e["message"].startswith("Not found: /")


def test_truncated_model_name_in_error(server):
    r = requests.post(server.url("/v1/completions"), json={"model": "m" * 199 + "\u20ac", "prompt": "a"}, timeout=10)
    assert r.status_code == 404, r.text
    assert "does not exist" in r.json()["error"]["message"]


# ---- 4: request framing, Allow, duplicate keys ------------------------------------------

TOK = json.dumps({"prompt": "hello"}).encode()


@pytest.mark.parametrize("te", [["gzip, chunked"], ["gzip"], ["chunked", "gzip"], ["identity"], ["chunked, chunked"]])
def test_unsupported_transfer_coding(server, te):
    hdrs = ["Content-Type: application/json"] + [f"Transfer-Encoding: {v}" for v in te]
    body = b"%x\r\n" % len(TOK) + TOK + b"\r\n0\r\n\r\n"
    t0 = time.time()
    sock, data = raw_request(server.port, "POST", "/tokenize", body, hdrs, timeout=5)
    sock.close()
    r = parse_response(data)
    assert r is not None, "no answer within 5 s"
    assert r[0] in (400, 501), data[:300]
    assert time.time() - t0 < 3


def test_chunked_upload_still_works(server):
    body = b"%x\r\n" % len(TOK) + TOK + b"\r\n0\r\n\r\n"
    sock, data = raw_request(server.port, "POST", "/tokenize", body, ["Content-Type: application/json", "Transfer-Encoding: chunked"])
    sock.close()
    r = parse_response(data)
    assert r and r[0] == 200 and json.loads(r[2])["count"] > 0


@pytest.mark.parametrize("cl", [[len(TOK), len(TOK) + 1], [len(TOK) + 1, len(TOK)], ["%d, %d" % (len(TOK), len(TOK) + 1)]])
def test_conflicting_content_length(server, cl):
    hdrs = ["Content-Type: application/json"] + [f"Content-Length: {v}" for v in cl]
    sock, data = raw_request(server.port, "POST", "/tokenize", TOK + b" ", hdrs, timeout=5)
    sock.close()
    r = parse_response(data)
    assert r is not None and r[0] == 400, data[:300]


def test_transfer_encoding_with_content_length(server):
    body = b"%x\r\n" % len(TOK) + TOK + b"\r\n0\r\n\r\n"
    hdrs = ["Content-Type: application/json", "Transfer-Encoding: chunked", f"Content-Length: {len(body)}"]
    sock, data = raw_request(server.port, "POST", "/tokenize", body, hdrs, timeout=5)
    sock.close()
    r = parse_response(data)
    assert r is not None and r[0] == 400, data[:300]


@pytest.mark.parametrize("method,path,allow", [("POST", "/health", "GET, HEAD"), ("GET", "/v1/chat/completions", "POST"),
                                               ("DELETE", "/v1/models", "GET, HEAD"), ("PUT", "/tokenize", "POST")])
def test_405_has_allow(server, method, path, allow):
    r = requests.request(method, server.url(path), timeout=10)
    assert r.status_code == 405
    assert r.headers.get("Allow") == allow


@pytest.mark.parametrize("path,body", [("/v1/completions", b'{"prompt": "a", "max_tokens": 2, "max_tokens": 3}'),
                                       ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a", "content": "b"}]}'),
                                       ("/tokenize", b'{"prompt": "a", "prompt": "b"}')])
def test_duplicate_keys_rejected(server, path, body):
    r = requests.post(server.url(path), data=body, headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 400, r.text
    assert "duplicate" in r.json()["error"]["message"]


# ---- 5: KV-cache gauge when idle -------------------------------------------------------

def test_kv_cache_usage_zero_when_idle(server):
    r = requests.post(server.url("/v1/completions"), json={"prompt": "abc " * 50, "max_tokens": 64, "temperature": 0, "ignore_eos": True},
                      timeout=30)
    assert r.status_code == 200
    assert wait_metric(server, "vllm:num_requests_running", lambda v: v == 0, 10) == 0
    assert wait_metric(server, "vllm:num_requests_waiting", lambda v: v == 0, 10) == 0
    assert server.metrics()["vllm:kv_cache_usage_perc"] == 0


# ---- 6: a slow reader's buffer is bounded -------------------------------------------------

def test_slow_reader_is_cancelled(make_server):
    # ~2.5 KB of SSE per token (20 alternatives): 3500 tokens must overflow the kernel's socket buffer first
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as fh:
            wmem_max = int(fh.read().split()[2])
    except (OSError, ValueError, IndexError):
        wmem_max = 4 << 20
    if wmem_max > 6 << 20:
        pytest.skip(f"tcp_wmem max {wmem_max}: the kernel would buffer the whole stream")
    s = make_server("--max-stream-buffer", "64k", "--max-num-seqs", "4")
    before = s.metrics()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", s.port))
    data = json.dumps({"messages": MSG, "max_tokens": 3500, "temperature": 0, "ignore_eos": True, "stream": True,
                       "logprobs": True, "top_logprobs": 20}).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(data) + data)
    try:
        # another client is served meanwhile
        r = requests.post(s.url("/v1/completions"), json={"prompt": "abc", "max_tokens": 20, "temperature": 0}, timeout=10)
        assert r.status_code == 200
        v = wait_metric(s, "tandem_requests_cancelled_total", lambda v: v >= before["tandem_requests_cancelled_total"] + 1, 90)
        assert v == before["tandem_requests_cancelled_total"] + 1
        assert wait_metric(s, "vllm:num_requests_running", lambda v: v == 0, 10) == 0
        after = s.metrics()
        assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 3500
        assert any("--max-stream-buffer" in line for line in s.log), "".join(s.log[-20:])
        # and the server keeps serving streams
        r = requests.post(s.url("/v1/chat/completions"), json={"messages": MSG, "max_tokens": 8, "stream": True}, timeout=10)
        assert r.status_code == 200 and r.content.endswith(b"data: [DONE]\n\n")
    finally:
        sock.close()


# ---- 7: prompt preparation off the HTTP threads --------------------------------------------

def test_huge_prompt_does_not_stall_http(make_server):
    """With one HTTP thread, parsing, rendering and tokenizing huge prompts must not hold up /health."""
    import random
    s = make_server("--http-threads", "1", "--quiet")
    rnd = random.Random(1)
    words = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(2, 9))) for _ in range(5000)]
    big = " ".join(rnd.choice(words) for _ in range(4_000_000))[:24_000_000]
    body = json.dumps({"messages": [{"role": "user", "content": big}], "max_tokens": 1}).encode()
    codes = []

    def huge():
        r = requests.post(s.url("/v1/chat/completions"), data=body, headers={"Content-Type": "application/json"}, timeout=120)
        codes.append(r.status_code)

    ts = [threading.Thread(target=huge) for _ in range(3)]
    t_start = time.time()
    for t in ts:
        t.start()
    worst = 0.0
    while any(t.is_alive() for t in ts) and time.time() - t_start < 120:
        t0 = time.time()
        assert requests.get(s.url("/health"), timeout=60).status_code == 200
        worst = max(worst, time.time() - t0)
        time.sleep(0.05)
    for t in ts:
        t.join(60)
    total = time.time() - t_start
    assert codes == [400, 400, 400]  # over the context
    # (where all three take under 0.5 s a stall cannot show; the assertion still holds then)
    assert worst < 0.5, f"/health took {worst:.2f}s while huge prompts were prepared ({total:.2f}s in all)"


def test_stream_chat_logprobs_not_empty(server):
    body = {"messages": MSG, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": True, "logprobs": True, "top_logprobs": 2}
    r = requests.post(server.url("/v1/chat/completions"), json=body, timeout=30)
    evs = sse_payloads(r.content)
    lps = [e["choices"][0]["logprobs"] for e in evs if e["choices"] and e["choices"][0]["logprobs"]]
    assert sum(len(lp["content"]) for lp in lps) == 4
    assert all(len(x["top_logprobs"]) == 2 for lp in lps for x in lp["content"])



@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("pad", [0, 100_000], ids=["small", "large"])
def test_half_close_concurrent_gets_the_full_answer(server, stream, pad):
    """Clients that half-close after sending get the whole answer, several at once, for small bodies
    and for bodies over the inline limit (64 KiB, prepared by a prompt worker with the connection
    suspended). libmicrohttpd used to read their end of input when it resumed them before an answer
    was queued, and closed them: 5-35% were lost."""
    text = "the quick brown fox jumps over the lazy dog"
    n_clients, rounds = 16, 4
    out = []

    def client(k):
        for r in range(rounds):
            body = {"messages": [{"role": "user", "content": f"{k} {r} {text}"}], "max_tokens": 8, "temperature": 0,
                    "ignore_eos": True, "stream": stream}
            # pad: ~100 KB of JSON whitespace for a large body with a prompt within the tiny model's context
            data = b"{" + b" " * pad + json.dumps(body).encode()[1:]
            sock, raw = raw_request(server.port, "POST", "/v1/chat/completions", data,
                                    ["Content-Type: application/json", f"Content-Length: {len(data)}"], half_close=True, timeout=60)
            sock.close()
            out.append(raw)

    ts = [threading.Thread(target=client, args=(k,)) for k in range(n_clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert len(out) == n_clients * rounds
    lost = [raw[:80] for raw in out if not (parse_response(raw) or (0, 0, 0, False))[3]]
    assert not lost, f"{len(lost)} of {len(out)} half-closed clients got no whole answer: {lost[:3]}"
    for raw in out:
        status, headers, payload, _ = parse_response(raw)
        assert status == 200, payload[:300]
        if stream:
            assert headers["content-type"] == ["text/event-stream"]
            evs = sse_payloads(payload)
            assert evs[-1]["choices"][0]["finish_reason"] == "length"
        else:
            reply = json.loads(payload)
            assert reply["usage"]["completion_tokens"] == 8 and reply["choices"][0]["finish_reason"] == "length"
