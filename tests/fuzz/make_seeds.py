#!/usr/bin/env python3
"""Regenerates the committed seed corpora in tests/fuzz/corpus/ from the
repository's own test data (run from anywhere; stdlib only). Seeds are kept
small: libFuzzer mutates them, it does not need whole models."""
import json, os, shutil, struct, hashlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "corpus")


def R(p):
    return os.path.join(ROOT, p)


def put(name, data, label):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    h = hashlib.sha1(data).hexdigest()[:10]
    with open(os.path.join(d, f"{label}-{h}"), "wb") as f:
        f.write(data)


def st_file(tensors, meta=None, pad=b""):
    """tensors: [(name, dtype, shape)] -> a valid safetensors file (zeros)."""
    size = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "I32": 4, "I64": 8, "U8": 1, "F64": 8, "I16": 2, "U16": 2,
            "I8": 1, "BOOL": 1, "F8_E5M2": 1, "U32": 4, "U64": 8}
    hdr, off = {}, 0
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape in tensors:
        n = size[dt]
        for s in shape:
            n *= s
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode() + pad
    return struct.pack("<Q", len(h)) + h + b"\0" * off


def safetensors():
    for p in ["tests/models/spec-agree/model.safetensors", "tests/golden/tiny-a/f32/model.safetensors",
              "tests/golden/mm-a/bf16/model.safetensors"]:
        if not os.path.exists(R(p)):
            continue
        with open(R(p), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
        ts = [(k, v["dtype"], [min(s, 2) for s in v["shape"]]) for k, v in hdr.items() if k != "__metadata__"][:12]
        put("safetensors", st_file(ts, hdr.get("__metadata__"), b"  "), os.path.basename(os.path.dirname(p)))
    put("safetensors", st_file([]), "empty")
    put("safetensors", st_file([("a", "F32", [2, 3]), ("b", "BF16", []), ("z", "U8", [0])], {"format": "pt"}), "small")
    put("safetensors", st_file([(f"t{i}", dt, [1, 2]) for i, dt in enumerate(
        ["F32", "BF16", "F16", "F8_E4M3", "I32", "I64", "U8", "F64", "I16", "U16", "I8", "BOOL", "F8_E5M2", "U32", "U64"])]),
        "dtypes")
    put("safetensors", st_file([("conv", "BF16", [2, 1, 2, 2, 2]), ("w", "F32", [1, 1, 1, 1, 1, 1, 1, 1, 1])]), "rank")


def configs():
    for dp, _, fs in os.walk(R("tests")):
        if "fuzz" in dp:
            continue
        for f in fs:
            if f.endswith("config.json") and "tokenizer" not in f and "generation" not in f:
                with open(os.path.join(dp, f), "rb") as fh:
                    put("config", fh.read(), "cfg")
    put("config", json.dumps({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text", "hidden_size": 8,
                                                                       "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]},
                              "tie_word_embeddings": True, "eos_token_id": [1, 2]}), "nested")
    put("config", '{"model_type":"qwen3_5_text"}', "defaults")


def tokenizer_load():
    for m in ["tiny-a", "tiny-b", "tiny-c"]:
        d = R(f"tests/golden/{m}/f32")
        if not os.path.exists(d):
            continue
        tj = open(os.path.join(d, "tokenizer.json"), "rb").read()
        put("tokenizer_load", tj, m)
        tc = os.path.join(d, "tokenizer_config.json")
        if os.path.exists(tc):
            put("tokenizer_load", tj + b"\0" + open(tc, "rb").read(), m + "-cfg")


def tokenizer():
    texts = []
    for p in ["tests/data/tokenizer-tests/ggml-vocab-qwen35.gguf.inp", "tests/data/tokenizer-tests/ggml-vocab-qwen2.gguf.inp"]:
        if os.path.exists(R(p)):
            texts += [t for t in open(R(p), encoding="utf-8", errors="surrogateescape").read().split("\n__ggml_vocab_test__\n") if t]
    for p in ["tests/golden/tokenizer/qwen3.jsonl"]:
        if os.path.exists(R(p)):
            texts += [json.loads(l).get("text", "") for l in open(R(p), encoding="utf-8") if l.strip()][:30]
    texts += ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", "e\u0301 \u00e9 \ufb01 \u212b",
              "\t\t  \r\n\n x"]
    seen = set()
    for i, t in enumerate(texts):
        b = t.encode("utf-8", errors="surrogateescape")[:2000]
        if b in seen:
            continue
        seen.add(b)
        put("tokenizer", bytes([i % 16]) + b, "text")
    put("tokenizer", b"\x00\xff\xfe\xc3\x28\xe2\x82\xf0\x9f\x98", "invalid")
    put("tokenizer", b"\x04" + struct.pack("<8i", 0, 1, 151643, 151644, -1, 2 ** 31 - 1, 151936, 300000), "ids")


def templates():
    for f in sorted(os.listdir(R("tests/data/chat-templates"))):
        if f.endswith(".jinja"):
            put("template", open(R("tests/data/chat-templates/" + f), "rb").read(), f[:-6])
    for l in open(R("tests/golden/templates/features.jsonl"), encoding="utf-8"):
        put("template", json.loads(l)["source"], "feature")


MSG = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]
BODIES = [
    (0, {"model": "tandem", "messages": MSG, "temperature": 0, "max_tokens": 16}),
    (0, {"messages": MSG, "stream": True, "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 3}),
    (4, {"messages": MSG + [{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}, {"role": "tool", "content": "21 C"}],
         "tools": TOOLS, "tool_choice": "auto", "chat_template_kwargs": {"enable_thinking": False}}),
    (0x40, {"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}]},
                         {"role": "user", "content": "Weather?"}], "tools": TOOLS, "stream": True}),
    (0x80, {"messages": MSG, "stop": ["STOP", "<|im_end|>"], "include_stop_str_in_output": True, "seed": 7, "top_p": 0.9,
            "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5}),
    (1, {"model": "tandem", "prompt": "def add(a, b):", "max_tokens": 8, "logprobs": 2, "echo": True}),
    (1, {"prompt": [[9707, 11, 1879]], "stream": True, "stop_token_ids": [11], "ignore_eos": True, "skip_special_tokens": False}),
    (0x11, {"prompt": ["abc"], "stop": "b", "return_tokens_as_token_ids": True, "max_completion_tokens": 3}),
    (2, {"messages": MSG, "add_generation_prompt": False}),
    (8, {"messages": MSG}),
]


def oai():
    for mode, b in BODIES:
        put("oai_req", bytes([mode]) + json.dumps(b).encode(), "body")
    put("oai_req", bytes([0x30]) + json.dumps({"messages": MSG, "tools": TOOLS, "stream": True}).encode() + b"\0" +
        b"<think>x</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>", "output")
    put("oai_req", bytes([0x24]) + json.dumps({"messages": MSG, "tools": TOOLS}).encode() + b"\0" +
        b"<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "xml")


def chat_parse():
    outs = [
        b"<think>\nreasoning\n</think>\n\nanswer",
        b"plain text only",
        b"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, {\"a\": \"}\"}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"run\", \"arguments\": {}}\n</tool_call>",
        b"text <tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=force>\ntrue\n</parameter>\n<parameter=args>\n[\"a\"]\n</parameter>\n<parameter=env>\n{\"X\": 1}\n</parameter>\n</function>\n</tool_call>",
        b"reasoning started in the prompt</think>then content<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}",
        b"<tool_call>\n<function=g>\n<parameter=x>\nnot a number\n</parameter>\n",
        b"<think>a</think><think>b</think> STOP <|im_end|> \xe4\xbd\xa0\xe5\xa5\xbd",
    ]
    for i, o in enumerate(outs):
        cfg = bytes([(i % 3) | 4 | 8 | ((i & 1) << 4), i * 37 % 256, i * 11 % 256, 0x15 * (i + 1) % 256])
        put("chat_parse", cfg + o, "out")


def http():
    def post(url, body, extra=""):
        b = json.dumps(body).encode()
        return (f"POST {url} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}"
                f"Content-Length: {len(b)}\r\n\r\n").encode() + b
    reqs = [
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /version HTTP/1.0\r\n\r\n",
        b"HEAD /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"DELETE /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /nope?x=1 HTTP/1.1\r\nHost: x\r\n\r\n",
        post("/v1/chat/completions", {"model": "tiny", "messages": MSG, "max_tokens": 4, "temperature": 0}),
        post("/v1/chat/completions", {"messages": MSG, "max_tokens": 4, "stream": True, "logprobs": True, "top_logprobs": 2}),
        post("/v1/completions", {"prompt": "Hello", "max_tokens": 3, "stop": ["\n"], "echo": True, "logprobs": 1}),
        post("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}),
        post("/tokenize", {"prompt": "Hello world", "return_token_strs": True}),
        post("/v1/tokenize", {"messages": MSG, "add_special_tokens": False}),
        post("/detokenize", {"tokens": [1, 2, 3]}),
        post("/v1/chat/completions", {"messages": MSG, "tools": TOOLS, "max_tokens": 2}, "Expect: 100-continue\r\n"),
        b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n{\"prompt\r\n7\r\n\": \"ab\"\r\n1\r\n}\r\n0\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{}",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n[1,2]",
    ]
    for r in reqs:
        put("http", r, "req")


def main():
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    for f in [safetensors, configs, tokenizer_load, tokenizer, templates, oai, chat_parse, http]:
        f()
    for d in sorted(os.listdir(OUT)):
        fs = os.listdir(os.path.join(OUT, d))
        print(f"{d}: {len(fs)} seeds, {sum(os.path.getsize(os.path.join(OUT, d, f)) for f in fs)} bytes")


if __name__ == "__main__":
    main()
