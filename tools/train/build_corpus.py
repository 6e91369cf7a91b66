"""Builds the demo model's training corpus from text that is on this machine offline.

Sources (see README.md for licences):
  - Python standard library sources (the venv's base interpreter, *.py, no test/)
  - C headers under /usr/include
  - man pages (/usr/share/man/man{1,3,5,7}, roff stripped to plain text)
  - /usr/share/doc texts (README*, NEWS*, *.txt, *.md; de-duplicated)
  - synthetic chat transcripts, rendered with the model's own chat template
    (tools/train/chat_template.jinja = Qwen3's hermes-style template):
      edit    - the user pastes a file and asks for a small edit, the assistant
                reproduces the whole file with the edit applied
      code    - write a function from a one-line spec (stdlib functions + docstrings)
      explain - explain code / a module / a command in prose (docstrings, man pages)
      tool    - simple tool calls (<tool_call>{"name":..,"arguments":{..}}</tool_call>),
                the tool response, and a final answer

Output: OUT/{train,valid}.jsonl, one {"kind": .., "text": ..} per line; 2% of the
documents of every kind (by a hash of the document) go to valid.
Deterministic for a given machine (fixed seed, sorted file lists).

Run: /work/venv-ref/bin/python tools/train/build_corpus.py --out build/train7/corpus
"""
import argparse
import ast
import glob
import gzip
import hashlib
import inspect
import json
import os
import random
import re
import sys
import sysconfig
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = open(os.path.join(HERE, "chat_template.jinja"), encoding="utf-8").read()

CAPS = {"py": 14e6, "c": 7e6, "man": 5e6, "doc": 5e6}   # characters per raw source
N_CHAT = {"edit": 20000, "code": 6000, "explain": 7000, "tool": 5000}


def read_text(path, limit=200_000):
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read(limit + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
    except OSError:
        return None
    if len(data) > limit or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def py_files():
    stdlib = sysconfig.get_paths()["stdlib"]
    out = []
    for p in sorted(glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True)):
        rel = os.path.relpath(p, stdlib)
        if rel.startswith(("test", "site-packages", "idlelib/idle_test", "lib2to3/tests")) or "/test" in rel:
            continue
        out.append(p)
    return out


def c_files():
    return sorted(glob.glob("/usr/include/**/*.h", recursive=True))


ROFF_FONT = re.compile(r"\\f[BIRP]|\\f\(..|\\f\[[^\]]*\]")


def strip_roff(src):
    lines = []
    for ln in src.splitlines():
        if ln.startswith(('.\\"', "'\\\"", '.\\}', '.ig', '.de', '.if', '.ie', '.el', '.ds', '.nr', '.so')):
            continue
        if ln.startswith("."):
            parts = ln.split(None, 1)
            mac = parts[0]
            arg = parts[1] if len(parts) > 1 else ""
            if mac in (".SH", ".SS"):
                lines.append("")
                lines.append(arg.strip('"').upper() if mac == ".SH" else arg.strip('"'))
            elif mac in (".PP", ".P", ".LP", ".TP", ".IP", ".sp", ".br"):
                lines.append("")
                if mac == ".IP" and arg:
                    lines.append(arg.split('"')[1] if arg.startswith('"') else arg.split()[0])
            elif mac in (".B", ".I", ".BR", ".IR", ".RB", ".RI", ".BI", ".IB", ".SM", ".SB"):
                lines.append(arg.replace('"', ""))
            elif mac == ".TH":
                lines.append(arg.split()[0] if arg.split() else "")
            continue
        lines.append(ln)
    t = "\n".join(lines)
    t = ROFF_FONT.sub("", t)
    t = t.replace("\\-", "-").replace("\\(em", "--").replace("\\(en", "-").replace("\\e", "\\")
    t = t.replace("\\(aq", "'").replace("\\(dq", '"').replace("\\&", "").replace("\\ ", " ")
    t = t.replace("\\(bu", "*").replace("\\|", "").replace("\\(lq", '"').replace("\\(rq", '"')
    t = re.sub(r"\\\*\(..|\\\*.", "", t)
    t = re.sub(r"\n{3,}", "\n\n", t)
    return t.strip() + "\n"


def man_pages():
    out = []
    for sec in ("1", "3", "5", "7"):
        out += sorted(glob.glob(f"/usr/share/man/man{sec}/*.gz"))
    return out


def doc_files():
    pats = ["README*", "NEWS*", "*.txt", "*.md", "*.txt.gz", "*.md.gz", "README*.gz", "NEWS*.gz"]
    out = set()
    for d in sorted(glob.glob("/usr/share/doc/*")):
        for p in pats:
            out.update(glob.glob(os.path.join(d, p)))
            out.update(glob.glob(os.path.join(d, "*", p)))
    return sorted(out)


def collect(files, cap, rng, transform=None):
    files = list(files)
    rng.shuffle(files)
    seen, docs, total = set(), [], 0
    for p in files:
        t = read_text(p)
        if not t:
            continue
        if transform:
            t = transform(t)
        if len(t) < 200:
            continue
        h = hashlib.sha1(t.encode()).hexdigest()
        if h in seen:
            continue
        seen.add(h)
        docs.append((p, t))
        total += len(t)
        if total >= cap:
            break
    return docs


# ---------------------------------------------------------------- chat rendering

def render(messages, tools=None):
    from transformers.utils.chat_template_utils import render_jinja_template
    r = render_jinja_template([messages], tools=tools, chat_template=TEMPLATE,
                              add_generation_prompt=False,
                              eos_token="<|im_end|>", pad_token="<|endoftext|>")
    r = r[0] if isinstance(r, tuple) else r
    return r[0] if isinstance(r, list) else r


SYSTEMS = [None, None, None, "You are a helpful assistant.",
           "You are a careful coding assistant.", "You are Tandem, a small demo model."]


def msgs(rng, user, answer):
    m = []
    s = rng.choice(SYSTEMS)
    if s:
        m.append({"role": "system", "content": s})
    m.append({"role": "user", "content": user})
    m.append({"role": "assistant", "content": answer})
    return m


# ---------------------------------------------------------------- python functions

def py_functions(py_docs):
    """(module, name, signature line, source, docstring) for top-level functions."""
    out = []
    for path, src in py_docs:
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError):
            continue
        mod = os.path.splitext(os.path.basename(path))[0]
        lines = src.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            seg = "\n".join(lines[node.lineno - 1 - len(node.decorator_list):node.end_lineno])
            n = seg.count("\n") + 1
            if n < 3 or n > 25 or len(seg) > 900:
                continue
            doc = ast.get_docstring(node)
            out.append((mod, node.name, lines[node.lineno - 1].strip(), seg, doc))
    return out


def snippets(py_docs, c_docs, rng, n):
    """Short code windows (4-14 lines) for the edit task."""
    out = []
    pool = [(p, t, "python") for p, t in py_docs] + [(p, t, "c") for p, t in c_docs]
    while len(out) < n:
        p, t, lang = rng.choice(pool)
        lines = t.splitlines()
        if len(lines) < 10:
            continue
        k = rng.randint(4, 14)
        s = rng.randint(0, max(0, len(lines) - k))
        w = lines[s:s + k]
        text = "\n".join(w).strip("\n")
        if len(text) < 80 or len(text) > 600 or text.count("\n") < 3:
            continue
        out.append((os.path.basename(p), lang, text))
    return out


IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]{2,}\b")
NUM = re.compile(r"(?<![\w.])\d+(?![\w.])")
KEYWORDS = set("""and as assert async await break class continue def del elif else except
finally for from global if import in is lambda nonlocal not or pass raise return try while
with yield None True False self int char void const static struct return unsigned long
short double float extern typedef define include ifdef ifndef endif union enum sizeof
signed register volatile inline""".split())
NEW_NAMES = ["value", "count", "total", "result", "buffer", "index", "item", "name", "data",
             "size", "offset", "limit", "node", "entry", "text", "path", "key", "flags",
             "config", "state", "handle", "length", "target", "source", "current"]


def make_edit(rng, fname, lang, text):
    """Returns (instruction, edited text, summary) or None."""
    kind = rng.random()
    lines = text.split("\n")
    if kind < 0.4:   # rename an identifier
        ids = [i for i in IDENT.findall(text) if i not in KEYWORDS]
        if not ids:
            return None
        old = rng.choice(ids)
        new = rng.choice(NEW_NAMES) + rng.choice(["", "_2", "_new", "s"])
        if new == old or re.search(r"\b%s\b" % re.escape(new), text):
            return None
        edited = re.sub(r"\b%s\b" % re.escape(old), new, text)
        instr = rng.choice([f"Rename `{old}` to `{new}` everywhere.",
                            f"Please rename {old} to {new}.",
                            f"Change the name `{old}` to `{new}` and show the whole file."])
        return instr, edited, f"I renamed `{old}` to `{new}`."
    if kind < 0.6:   # change a number
        nums = NUM.findall(text)
        if not nums:
            return None
        old = rng.choice(nums)
        new = str(int(old) + rng.choice([1, 2, 10, -1])) if int(old) > 1 else str(rng.randint(2, 64))
        idx = [i for i, l in enumerate(lines) if re.search(r"(?<![\w.])%s(?![\w.])" % old, l)]
        i = idx[0]
        lines[i] = re.sub(r"(?<![\w.])%s(?![\w.])" % old, new, lines[i], count=1)
        instr = rng.choice([f"Change the first `{old}` to `{new}`.",
                            f"Replace the number {old} with {new} on the line `{lines[i].strip()[:60]}`."
                            if len(lines[i].strip()) < 60 else f"Change the first {old} to {new}."])
        return instr, "\n".join(lines), f"The first `{old}` is now `{new}`."
    if kind < 0.8:   # add a comment line
        i = rng.randint(1, len(lines) - 1)
        indent = re.match(r"\s*", lines[i]).group(0)
        note = rng.choice(["TODO: handle errors here", "NOTE: this is the hot path",
                           "FIXME: check the bounds", "keep this in sync with the docs",
                           "see the module docstring"])
        c = f"{indent}# {note}" if lang == "python" else f"{indent}/* {note} */"
        lines.insert(i, c)
        instr = f"Add the comment `{c.strip()}` above line {i + 1} (`{lines[i + 1].strip()[:50]}`)."
        return instr, "\n".join(lines), "I added the comment."
    # delete a line
    cands = [i for i, l in enumerate(lines) if l.strip() and len(l.strip()) > 8]
    if len(cands) < 3:
        return None
    i = rng.choice(cands[1:])
    gone = lines.pop(i)
    instr = rng.choice([f"Delete the line `{gone.strip()}`.",
                        f"Remove line {i + 1} (`{gone.strip()[:60]}`)."])
    return instr, "\n".join(lines), "I removed that line."


def edit_docs(rng, snips):
    out = []
    for fname, lang, text in snips:
        e = make_edit(rng, fname, lang, text)
        if not e:
            continue
        instr, edited, summary = e
        fence = "python" if lang == "python" else "c"
        user = rng.choice([
            f"Here is `{fname}`:\n\n```{fence}\n{text}\n```\n\n{instr} Reply with the full file.",
            f"{instr}\n\n```{fence}\n{text}\n```",
            f"File {fname}:\n```{fence}\n{text}\n```\n{instr} Return the complete updated file.",
        ])
        ans = rng.choice([f"```{fence}\n{edited}\n```",
                          f"Here is the updated file:\n\n```{fence}\n{edited}\n```",
                          f"```{fence}\n{edited}\n```\n\n{summary}"])
        out.append(render(msgs(rng, user, ans)))
    return out


def first_sentence(doc):
    s = doc.strip().split("\n\n")[0].replace("\n", " ")
    m = re.match(r"(.+?[.!?])(\s|$)", s)
    return (m.group(1) if m else s).strip()


def code_docs(rng, funcs, n):
    cands = [f for f in funcs if f[4] and 15 < len(first_sentence(f[4])) < 200]
    rng.shuffle(cands)
    out = []
    for mod, name, sig, src, doc in cands[:n]:
        spec = first_sentence(doc)
        spec = spec[0].lower() + spec[1:]
        args = sig[sig.find("("):].rstrip(":") if "(" in sig else "()"
        user = rng.choice([
            f"Write a Python function `{name}{args}` that does this: {spec}",
            f"Implement `{name}` in Python. Spec: {spec}",
            f"Write {name}{args} in Python: {spec}",
        ])
        ans = rng.choice([f"```python\n{src}\n```",
                          f"Here is an implementation:\n\n```python\n{src}\n```",
                          f"```python\n{src}\n```\n\nThis is how `{mod}.{name}` does it in the standard library."])
        out.append(render(msgs(rng, user, ans)))
    return out


def man_sections(text):
    """NAME line and first DESCRIPTION paragraphs of a stripped man page."""
    m = re.search(r"\nNAME\n+(.+?)\n\n", "\n" + text, re.S)
    d = re.search(r"\nDESCRIPTION\n+(.+?)(\n[A-Z][A-Z ]+\n|$)", "\n" + text, re.S)
    if not m or not d:
        return None
    name = " ".join(m.group(1).split())
    desc = d.group(1).strip()
    paras = [" ".join(p.split()) for p in desc.split("\n\n") if len(p.split()) > 5][:3]
    if not paras:
        return None
    return name, "\n\n".join(paras)


def explain_docs(rng, funcs, py_docs, man_docs, n):
    items = []
    for mod, name, sig, src, doc in funcs:
        if doc and len(doc) > 120:
            items.append(("func", mod, name, src, inspect.cleandoc(doc)))
    for path, src in py_docs:
        try:
            tree = ast.parse(src)
            doc = ast.get_docstring(tree)
        except (SyntaxError, ValueError):
            continue
        if doc and 150 < len(doc) < 3000:
            items.append(("module", os.path.splitext(os.path.basename(path))[0], None, None, doc))
    for path, text in man_docs:
        r = man_sections(text)
        if r:
            items.append(("man", os.path.basename(path).split(".")[0], r[0], None, r[1]))
    rng.shuffle(items)
    out = []
    for kind, a, b, src, doc in items[:n]:
        prose = "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n") if p.strip())
        if kind == "func":
            if rng.random() < 0.5:
                user = f"Explain what this code does:\n\n```python\n{src}\n```"
            else:
                user = f"What does `{a}.{b}` do in Python's standard library?"
            ans = f"`{b}` is a function in the `{a}` module. {prose}"
        elif kind == "module":
            user = rng.choice([f"What is the Python module `{a}` for?",
                               f"Explain the purpose of the `{a}` module."])
            ans = f"The `{a}` module: {prose}"
        else:
            user = rng.choice([f"What does the `{a}` command do?", f"Explain `{a}` briefly.",
                               f"What is {a}?"])
            ans = f"{b}.\n\n{prose}"
        out.append(render(msgs(rng, user, ans)))
    return out


# ---------------------------------------------------------------- tool calls

CITIES = ["Paris", "Berlin", "Tokyo", "Lima", "Oslo", "Cairo", "Austin", "Seoul", "Madrid",
          "Nairobi", "Toronto", "Sydney", "Hanoi", "Dublin", "Prague", "Quito"]
TOOLS = {
    "get_weather": ({"type": "object", "properties": {"city": {"type": "string"},
                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]},
                    "Get the current weather for a city."),
    "read_file": ({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
                  "Read a text file and return its contents."),
    "search": ({"type": "object", "properties": {"query": {"type": "string"},
                "max_results": {"type": "integer"}}, "required": ["query"]},
               "Search the documentation."),
    "calculator": ({"type": "object", "properties": {"expression": {"type": "string"}},
                    "required": ["expression"]}, "Evaluate an arithmetic expression."),
    "run_command": ({"type": "object", "properties": {"command": {"type": "string"}},
                     "required": ["command"]}, "Run a shell command and return its output."),
    "get_time": ({"type": "object", "properties": {"timezone": {"type": "string"}},
                  "required": ["timezone"]}, "Get the current time in a time zone."),
}


def tool_schema(name):
    params, desc = TOOLS[name]
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}


def tool_docs(rng, n, filenames, words):
    out = []
    for _ in range(n):
        name = rng.choice(list(TOOLS))
        others = rng.sample([t for t in TOOLS if t != name], rng.randint(0, 2))
        tools = [tool_schema(t) for t in [name] + others]
        rng.shuffle(tools)
        if name == "get_weather":
            c = rng.choice(CITIES)
            args = {"city": c}
            if rng.random() < 0.3:
                args["unit"] = rng.choice(["celsius", "fahrenheit"])
            user = rng.choice([f"What's the weather in {c}?", f"Is it cold in {c} right now?",
                               f"Weather for {c} please."])
            t = rng.randint(-5, 35)
            resp = json.dumps({"city": c, "temperature": t, "unit": args.get("unit", "celsius"),
                               "conditions": rng.choice(["sunny", "cloudy", "rain", "snow", "windy"])})
            final = f"It is {t} degrees ({args.get('unit', 'celsius')}) in {c}, {json.loads(resp)['conditions']}."
        elif name == "read_file":
            f = rng.choice(filenames)
            args = {"path": f}
            user = rng.choice([f"Show me what is in {f}.", f"Read the file `{f}`.",
                               f"What does {f} contain?"])
            resp = rng.choice(words)
            final = f"The file `{f}` contains:\n\n{resp}"
        elif name == "search":
            q = " ".join(rng.sample(words[:2000] if len(words) > 2000 else words, 1))[:40]
            q = " ".join(q.split()[:4])
            args = {"query": q}
            if rng.random() < 0.3:
                args["max_results"] = rng.randint(1, 5)
            user = f"Search the docs for \"{q}\"."
            resp = json.dumps({"results": [f"doc/{rng.choice(filenames)}"]})
            final = f"I found one result for \"{q}\": {json.loads(resp)['results'][0]}."
        elif name == "calculator":
            a, b = rng.randint(2, 999), rng.randint(2, 999)
            op = rng.choice(["+", "-", "*"])
            expr = f"{a} {op} {b}"
            args = {"expression": expr}
            user = rng.choice([f"What is {expr}?", f"Compute {expr}.", f"Calculate {expr} for me."])
            val = eval(expr)
            resp = str(val)
            final = f"{expr} = {val}."
        elif name == "run_command":
            cmd = rng.choice(["ls", "pwd", "date", "uname -a", "df -h", "whoami", "ls -l src",
                              "git status", "make test", "cat README.md"])
            args = {"command": cmd}
            user = rng.choice([f"Run `{cmd}`.", f"Please run {cmd} and tell me the result."])
            resp = rng.choice(["ok", "done", "src  tests  Makefile  README.md", "/work/project",
                               "nothing to commit, working tree clean", "all tests passed"])
            final = f"The command `{cmd}` printed: {resp}"
        else:
            tz = rng.choice(["UTC", "Europe/Paris", "Asia/Tokyo", "America/New_York"])
            args = {"timezone": tz}
            user = f"What time is it in {tz}?"
            hh, mm = rng.randint(0, 23), rng.randint(0, 59)
            resp = f"{hh:02d}:{mm:02d}"
            final = f"It is {resp} in {tz}."
        m = []
        if rng.random() < 0.3:
            m.append({"role": "system", "content": rng.choice(SYSTEMS[3:])})
        m += [{"role": "user", "content": user},
              {"role": "assistant", "content": "",
               "tool_calls": [{"type": "function", "function": {"name": name, "arguments": args}}]},
              {"role": "tool", "content": resp},
              {"role": "assistant", "content": final}]
        out.append(render(m, tools=tools))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/train7/corpus")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)

    py = collect(py_files(), CAPS["py"], rng)
    print("python", len(py), sum(len(t) for _, t in py), flush=True)
    c = collect(c_files(), CAPS["c"], rng)
    print("c", len(c), sum(len(t) for _, t in c), flush=True)
    man = collect(man_pages(), CAPS["man"], rng, strip_roff)
    print("man", len(man), sum(len(t) for _, t in man), flush=True)
    doc = collect(doc_files(), CAPS["doc"], rng)
    print("doc", len(doc), sum(len(t) for _, t in doc), flush=True)

    funcs = py_functions(py)
    print("functions", len(funcs), flush=True)
    docs = [("py", t) for _, t in py] + [("c", t) for _, t in c] + \
           [("man", t) for _, t in man] + [("doc", t) for _, t in doc]
    docs += [("edit", t) for t in edit_docs(rng, snippets(py, c, rng, N_CHAT["edit"]))]
    docs += [("code", t) for t in code_docs(rng, funcs, N_CHAT["code"])]
    docs += [("explain", t) for t in explain_docs(rng, funcs, py, man, N_CHAT["explain"])]
    fnames = [os.path.basename(p) for p, _ in py[:300]] + ["notes.txt", "README.md", "config.ini"]
    lines = [l.strip() for _, t in doc[:200] for l in t.splitlines() if 20 < len(l.strip()) < 100]
    docs += [("tool", t) for t in tool_docs(rng, N_CHAT["tool"], fnames, lines)]

    stats = {}
    with open(os.path.join(args.out, "train.jsonl"), "w") as ft, \
            open(os.path.join(args.out, "valid.jsonl"), "w") as fv:
        for kind, text in docs:
            h = int(hashlib.sha1(text.encode()).hexdigest()[:8], 16)
            split = "valid" if h % 50 == 0 else "train"
            (fv if split == "valid" else ft).write(json.dumps({"kind": kind, "text": text}) + "\n")
            s = stats.setdefault(kind, {"train": [0, 0], "valid": [0, 0]})
            s[split][0] += 1
            s[split][1] += len(text)
    json.dump(stats, open(os.path.join(args.out, "stats.json"), "w"), indent=1)
    for k, v in stats.items():
        print(f"{k:8s} train {v['train'][0]:6d} docs {v['train'][1] / 1e6:6.2f} MB   "
              f"valid {v['valid'][0]:5d} docs {v['valid'][1] / 1e6:5.2f} MB")


if __name__ == "__main__":
    sys.exit(main())
