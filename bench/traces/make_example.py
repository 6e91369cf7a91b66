#!/usr/bin/env python3
"""Writes agent-example.json: a hand-written coding-agent session in the shape
an OpenAI-API agent sends it (each turn the full, growing messages array:
stable system prompt and tools, user task, assistant tool calls, tool
results). Run: python3 bench/traces/make_example.py > bench/traces/agent-example.json"""
import json

SYSTEM = """You are a coding agent working in a git repository on the user's machine.
You can read files, search the tree, edit files and run shell commands through the tools you are given.
Rules:
- Read before you edit; keep changes minimal and in the style of the surrounding code.
- Run the tests after every change and report what you ran.
- Never run destructive commands (rm -rf, git reset --hard, force pushes).
- When a command fails, read the error and fix the cause rather than retrying blindly.
- Answer in short plain sentences; show diffs only when asked.
The repository is a small C library for parsing INI files (src/ini.c, src/ini.h, tests/test_ini.c, Makefile)."""

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a text file of the repository.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "start_line": {"type": "integer"},
                                                    "end_line": {"type": "integer"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the repository with a regular expression.",
     "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                    "required": ["pattern"]}}},
    {"type": "function", "function": {"name": "edit_file", "description": "Replace an exact string in a file with another.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"},
                                                    "new": {"type": "string"}}, "required": ["path", "old", "new"]}}},
    {"type": "function", "function": {"name": "run", "description": "Run a shell command in the repository root.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
]

INI_C = "\n".join([
    '#include "ini.h"', "#include <ctype.h>", "#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>", "",
    "static char *trim(char *s) {", "    while (isspace((unsigned char)*s)) s++;", "    char *e = s + strlen(s);",
    "    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;", "    return s;", "}", "",
    "int ini_parse(FILE *f, ini_handler h, void *user) {", "    char line[256], section[64] = \"\";", "    int lineno = 0;",
    "    while (fgets(line, sizeof line, f)) {", "        lineno++;", "        char *s = trim(line);",
    "        if (*s == ';' || *s == '#' || !*s) continue;", "        if (*s == '[') {", "            char *end = strchr(s, ']');",
    "            if (!end) return lineno;", "            *end = 0;", "            strncpy(section, s + 1, sizeof section - 1);",
    "            continue;", "        }", "        char *eq = strchr(s, '=');", "        if (!eq) return lineno;", "        *eq = 0;",
    "        if (!h(user, section, trim(s), trim(eq + 1))) return lineno;", "    }", "    return 0;", "}"])

TEST_OUT_FAIL = """cc -O2 -Wall -Isrc -o build/test_ini tests/test_ini.c src/ini.c
./build/test_ini
test_ini.c:41: FAIL: long line: expected key "path" = 300 chars, got 254 chars
test_ini.c:58: FAIL: line 7 is 300 bytes; parser reported an error at line 8 (continuation of the split line)
12 passed, 2 failed
make: *** [Makefile:14: test] Error 1"""

TEST_OUT_OK = """cc -O2 -Wall -Isrc -o build/test_ini tests/test_ini.c src/ini.c
./build/test_ini
14 passed, 0 failed"""

TEST_SRC = "\n".join(["#include \"ini.h\"", "#include <stdio.h>", "#include <string.h>", "", "static int passed, failed;",
                      "#define CHECK(c, ...) do { if (c) passed++; else { failed++; printf(__VA_ARGS__); } } while (0)", "",
                      "/* ... 30 lines of earlier tests elided by the agent's read window ... */", "",
                      "static void test_long_line(void) {", "    char buf[400];", "    memset(buf, 'a', 300);", "    buf[300] = 0;",
                      "    /* a 300-byte value must parse as one value */", "    check_value(\"[s]\\npath=\", buf);", "}"])


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


steps = [
    ("user", "The INI parser breaks on lines longer than 255 bytes (see issue #12). Please fix it and make sure the tests pass."),
    ("call", "I'll look at the parser first.", call("c1", "read_file", {"path": "src/ini.c"})),
    ("tool", "c1", INI_C),
    ("call", "Let me run the tests to see the failure.", call("c2", "run", {"command": "make test"})),
    ("tool", "c2", TEST_OUT_FAIL),
    ("call", "", call("c3", "read_file", {"path": "tests/test_ini.c", "start_line": 30, "end_line": 60})),
    ("tool", "c3", TEST_SRC),
    ("call", "The parser reads with a fixed 256-byte buffer. I'll check whether the header documents a line limit.",
     call("c4", "search", {"pattern": "256|line length|INI_MAX", "path": "src"})),
    ("tool", "c4", "src/ini.c:14:    char line[256], section[64] = \"\";"),
    ("call", "No documented limit. I'll switch to getline so lines of any length work.",
     call("c5", "edit_file", {"path": "src/ini.c", "old": "    char line[256], section[64] = \"\";\n    int lineno = 0;\n    while (fgets(line, sizeof line, f)) {\n        lineno++;\n        char *s = trim(line);",
                              "new": "    char *line = NULL, section[64] = \"\";\n    size_t cap = 0;\n    int lineno = 0, rc = 0;\n    while (getline(&line, &cap, f) != -1) {\n        lineno++;\n        char *s = trim(line);"})),
    ("tool", "c5", "edited src/ini.c: 1 replacement"),
    ("call", "Now every early return must free the line buffer.",
     call("c6", "edit_file", {"path": "src/ini.c", "old": "            if (!end) return lineno;", "new": "            if (!end) { rc = lineno; break; }"})),
    ("tool", "c6", "edited src/ini.c: 1 replacement"),
    ("call", "", call("c7", "edit_file", {"path": "src/ini.c", "old": "        if (!eq) return lineno;", "new": "        if (!eq) { rc = lineno; break; }"})),
    ("tool", "c7", "edited src/ini.c: 1 replacement"),
    ("call", "", call("c8", "edit_file", {"path": "src/ini.c", "old": "        if (!h(user, section, trim(s), trim(eq + 1))) return lineno;\n    }\n    return 0;",
                                          "new": "        if (!h(user, section, trim(s), trim(eq + 1))) { rc = lineno; break; }\n    }\n    free(line);\n    return rc;"})),
    ("tool", "c8", "edited src/ini.c: 1 replacement"),
    ("call", "getline needs _POSIX_C_SOURCE; let me check the build flags.", call("c9", "search", {"pattern": "CFLAGS|std=", "path": "Makefile"})),
    ("tool", "c9", "Makefile:3:CFLAGS ?= -O2 -Wall -std=c99"),
    ("call", "", call("c10", "edit_file", {"path": "src/ini.c", "old": "#include \"ini.h\"", "new": "#define _POSIX_C_SOURCE 200809L\n#include \"ini.h\""})),
    ("tool", "c10", "edited src/ini.c: 1 replacement"),
    ("call", "Running the tests again.", call("c11", "run", {"command": "make test"})),
    ("tool", "c11", TEST_OUT_OK),
    ("call", "Let me also run them under AddressSanitizer to check for leaks.", call("c12", "run", {"command": "make clean test CFLAGS='-O1 -g -fsanitize=address'"})),
    ("tool", "c12", TEST_OUT_OK + "\n(no leaks reported)"),
    ("final", "Fixed: src/ini.c now reads lines with getline, so any length works; every early return frees the buffer. "
              "`make test` passes 14/14, also under AddressSanitizer with no leaks."),
]

messages = [{"role": "system", "content": SYSTEM}]
turns = []
for st in steps:
    kind = st[0]
    if kind == "user":
        messages.append({"role": "user", "content": st[1]})
    elif kind == "tool":
        messages.append({"role": "tool", "tool_call_id": st[1], "content": st[2]})
    if kind in ("user", "tool"):
        # the agent sends the conversation so far and gets the next assistant turn
        turns.append({"messages": json.loads(json.dumps(messages)), "max_tokens": 256})
    if kind == "call":
        messages.append({"role": "assistant", "content": st[1], "tool_calls": [st[2]]})
    elif kind == "final":
        messages.append({"role": "assistant", "content": st[1]})

print(json.dumps({"description": "coding agent fixing a line-length bug in a small C INI parser: read, test, search, edit, re-test "
                                 "(hand-written; stable system prompt and tools, growing history)",
                  "tools": TOOLS, "turns": turns}, indent=1))
