"""Test strings for the tokenizer golden vectors (shared by tok_golden.py).

The 1 MB strings are not stored: gen_long(kind) builds them from a fixed
fragment list and a 32-bit LCG, and tests/c/test_tokenizer.c builds the same
bytes with the same algorithm (keep the two in sync)."""

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n-1) + fib(n-2)\n",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum=${add(1, 2)}`);\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
    "<div class=\"x\"><a href='/p?q=1&r=2'>link</a></div>",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "for i in $(seq 1 10); do echo \"$i\"; done | grep -v 3 >> /tmp/out.txt",
    "public static void main(String[] args) { System.out.println(\"Hello\"); }",
    "    \t  mixed_indent = {'a': [1,2,3]}  # comment\r\n",
    "x=1;y=2;z=x+y//3**4%5^6&7|8~9",
    "template<typename T> T max(T a, T b) { return a > b ? a : b; }",
    "@decorator(arg=1)\nclass Foo(Base, metaclass=Meta):\n    __slots__ = ('a',)\n",
    "\\begin{equation} E = mc^2 \\end{equation}",
    "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,3 +1,4 @@\n-old\n+new\n",
]

WHITESPACE = [
    " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", "\r", " \n", "\n ",
    "  \n  ", "a  b", "a   b   c", "a\tb", "a \t b", "a\n\nb", "a\r\nb", "a \r\n b", "   leading",
    "trailing   ", "\u00a0", "a\u00a0b", "\u00a0\u00a0x", "\u3000", "x\u3000y", "\u2003em space",
    "\u200bzero width", "a\u2028b", "a\u2029b", "\u0085nel", "\x0bvt\x0cff", "\x1c\x1d\x1e\x1f",
    " \u00a0 \u00a0 ", "\t \n \r\n \t", " " * 40, "\n" * 20, "x" + " " * 17 + "y",
]

UNICODE = [
    "caf\u00e9", "cafe\u0301", "e\u0301\u0302\u0303", "\u1e9b\u0323", "\u0041\u030a", "\u212b",
    "\uac00\u11a8", "\u1100\u1161\u11a8", "\u304b\u3099", "\u30ab\u3099",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01", "\u6211\u559c\u6b22\u5403\u82f9\u679c\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "abc \u0645\u0631\u062d\u0628\u0627 def", "\u202eRTL override\u202c", "\u0928\u092e\u0938\u094d\u0924\u0947",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac", "\U0001f600", "\U0001f44d\U0001f3fd",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466", "\U0001f3f3\ufe0f\u200d\U0001f308",
    "\U0001f1fa\U0001f1f8\U0001f1ef\U0001f1f5", "\u2764\ufe0f", "I \u2764\ufe0f \U0001f355!",
    "\U0001d54f\U0001d552\U0001d55d\U0001d565", "\u00bd \u00b2 \u2460 \u2167", "\ufb01 \ufb02",
    "\u0130stanbul", "stra\u00dfe STRASSE", "\u01c5 \u1e9e", "\ufeffBOM", "\ufffd", "\u0000nul",
    "a\u0300\u0301\u0302\u0303\u0304\u0305b", "\u0915\u094d\u0937", "\u0bb8\u0bcd\u0bb0\u0bc0",
    "\u1f00\u0345", "x\u20d7", "\u0300leading mark", "mark\u0300 after space \u0301",
    "\u3042\u3044\u3046\u3048\u304a", "\uff21\uff22\uff23\uff11\uff12\uff13",
    "\U00020000\U0002a6d6", "\ue000private", "\U0010fffd",
]

NUMBERS = [
    "0", "1", "12", "123", "1234", "12345", "1234567890", "3.14159", "-42", "+7", "1e10", "6.02e23",
    "1,000,000", "0x1F", "0b1010", "v1.2.3", "2024-01-31", "12:34:56", "$1,234.56", "99%", "\u0661\u0662\u0663",
    "\u0967\u0968\u0969", "\u2155", "\uff11\uff12", "1st 2nd 3rd 4th", "a1b2c3", "007", "3/4",
]

CONTRACTIONS = [
    "don't", "Don't", "DON'T", "I'm", "I'M", "you're", "YOU'RE", "we've", "they'll", "she'd", "it's",
    "It'S", "o'clock", "rock'n'roll", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "''", "'", "x'",
    "\u2019s", "can't won't shouldn't", "l'homme", "\u017f's", "'\u017f", "'S'T'RE",
]

PROSE = [
    "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "  Hello  World  ", "HELLO", "hello", "Hello\nWorld", "what's up?!", "...", "!!!???", "---",
    "e.g. i.e. etc.", "\"quoted\" and 'single'", "(parens) [brackets] {braces}", "a-b_c.d/e\\f",
    "user@example.com", "https://example.com/path?x=1#frag", "#hashtag @mention", "C++ C# F#",
    "~!@#$%^&*()_+`-=[]\\{}|;':\",./<>?", "   \n\n   Paragraph one.\n\nParagraph two.   \n",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt.",
]


def special_tokens(added):
    """Every added token inline, alone, glued to text, and with spaces."""
    out = []
    for tok in added:
        out += [tok, "a" + tok + "b", " " + tok + " ", tok + tok, "\n" + tok + "\n"]
    out += ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<|im_start|", "<|im_end", "|>",
            "<<|endoftext|>>", "<think>\nhmm\n</think>\n\nok", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
            "<|endoftext|><|endoftext|>", "<|fim_prefix|>def<|fim_suffix|>\n<|fim_middle|>"]
    return out


INVALID = [  # raw bytes
    b"\xff", b"\xfe\xff", b"abc\x80def", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82x", b"\xe2\x82\xac\xe2",
    b"\xf0\x9f\x98", b"\xf0\x9f\x98x", b"\xf0\x80\x80\x80", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80",
    b"\xf5\x80", b"ok \x80\x81\x82 ok", b"\xe0\x80\x80", b"\xe0\xa0", b"a\xf0\x9f\x98\x80\xf0b",
    b"<|im_start|>\xffuser", b"\xc3\xa9\xcc", b"  \xa0 ",
]

LONG_FRAGMENTS = [
    "the ", "quick ", "brown ", "fox ", "jumps ", "over ", "lazy ", "dog", ". ", ", ", "\n", "\n\n", "    ",
    "\t", "def ", "return ", "(x)", "[i]", "{}", " = ", "==", "+= 1;", "// comment", "# note", "12345",
    "3.14", "don't ", "it's ", "\u4f60\u597d", "\u4e16\u754c", "\u3002", "caf\u00e9 ", "e\u0301", "\U0001f600",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\u0645\u0631\u062d\u0628\u0627 ", "\u00a0", "\r\n",
    "<|im_end|>", "<think>", "   \n", "Hello", "WORLD", "_snake_case_", "camelCase", "!!!", "...",
]


def lcg(state):
    return (state * 1103515245 + 12345) & 0xFFFFFFFF


def gen_long(kind, size=1_000_000):
    """kind: 'mixed' (fragments), 'letters' (one 1 MB word), 'spaces' (whitespace runs)."""
    if kind == "letters":
        return ("abcdefghijklmnopqrstuvwxyz" * (size // 26 + 1))[:size]
    if kind == "spaces":
        out, n, st = [], 0, 7
        while n < size:
            st = lcg(st)
            piece = " " * ((st >> 16) % 5000 + 1) + ("\n" if (st >> 8) & 1 else "x")
            out.append(piece)
            n += len(piece)
        return "".join(out)
    out, n, st = [], 0, 12345
    while n < size:
        st = lcg(st)
        frag = LONG_FRAGMENTS[(st >> 16) % len(LONG_FRAGMENTS)]
        out.append(frag)
        n += len(frag.encode())
    return "".join(out)


def all_strings(added):
    """Returns a list of str or bytes (invalid UTF-8)."""
    base = CODE + WHITESPACE + UNICODE + NUMBERS + CONTRACTIONS + PROSE + special_tokens(added)
    out = list(base)
    # deterministic combinations of two or three strings from different groups
    groups = [CODE, WHITESPACE, UNICODE, NUMBERS, CONTRACTIONS, PROSE]
    st = 99
    for i in range(80):
        parts = []
        for _ in range(2 + i % 2):
            st = lcg(st)
            g = groups[(st >> 16) % len(groups)]
            st = lcg(st)
            parts.append(g[(st >> 16) % len(g)])
        out.append("".join(parts))
    out += INVALID
    out += ["", "a", "ab", "abc " * 200, "a" * 300, "\u4f60" * 300, " " * 1000, "\n" * 500, "! " * 300]
    return out
