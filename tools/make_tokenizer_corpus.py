#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/corpus.jsonl: a deterministic corpus of tricky strings for the tokenizer golden
tests (python3 stdlib only; same output on every run). One JSON object per line: {"id": N, "text": "..."}."""
import json
import os
import random
import sys

SEED = 20240611
HAND = [
    "", " ", "  ", "\t", "\n", "\r\n", "\n\n\n", " \n ", "a", "A", "hello", " hello", "hello ", "  hello  world  ",
    "Hello, world!", "Hello world\n", "The quick brown fox jumps over the lazy dog.",
    # contractions in various cases
    "I'm", "I'M", "you're", "YOU'RE", "You'Re", "it's", "IT'S", "It'S", "don't", "DON'T", "Don'T", "we've", "WE'VE",
    "they'll", "THEY'LL", "she'd", "SHE'D", "'s", "'S", "'t", "'re", "'ve", "'m", "'ll", "'d", "''s", "'ss", "s's's",
    "rock 'n' roll", "O'Neil's dog's bone", "‘curly’ quotes’s", "he said \"don't\"",
    # digits
    "0", "12", "123", "1234", "12345", "1234567890", "3.14159", "-42", "1,000,000", "2024-06-11T12:34:56Z",
    "+1 (555) 123-4567", "v1.2.3", "0x1F", "1e-10", "٠١٢٣٤٥٦٧٨٩", "१२३४", "①②③", "½ ¾", "Ⅻ", "１２３４５",
    # whitespace variety
    "a\tb", "a\t\tb", "a  b", "a   b", "a\u00a0b", "a\u2009b", "a\u3000b", "a\u200bb", "\u00a0\u00a0", " \t \n \r ",
    "line1\nline2\r\nline3\rline4", "trailing spaces   ", "   leading spaces", "\n\n\nfoo\n\n\n", "\t\tindented\n\t\t\tmore",
    "a\u2028b\u2029c", "\u000b\u000c", "x\u0085y",
    # code
    "def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }",
    "if __name__ == '__main__':\n\tmain()", "SELECT * FROM users WHERE id = 42;", "<div class=\"x\">&amp;</div>",
    "{\"key\": [1, 2, {\"nested\": null}]}", "https://example.com/path?q=1&r=two#frag", "user@example.com",
    "a->b => c :: d !== e", "    ", "```python\nprint('x')\n```", "$ ls -la | grep foo && echo ok",
    "x=1;y=2;z=x+y", "/* comment */ // other", "__init__", "camelCaseIdentifier", "snake_case_identifier",
    # unicode scripts
    "日本語のテキスト", "中文测试，你好世界！", "漢字とひらがなとカタカナ", "한국어 텍스트입니다", "Привет, мир!",
    "Ελληνικά γράμματα", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีครับ ยินดีต้อนรับ", "ສະບາຍດີ",
    "ሰላም ልዑል", "Tiếng Việt có dấu", "Ünïcödé ßtraße", "ﬁ ﬂ ﬀ", "Ａｂｃ　ｘｙｚ", "ｶﾀｶﾅ", "㍿ ㌔", "ℌ𝔢𝔩𝔩𝔬",
    "𝓗𝓮𝓵𝓵𝓸", "ǅ ǆ Ǆ", "İstanbul ıi", "Ω Ω", "Å Å", "e\u0301", "e\u0301\u0302", "a\u0308o\u0308u\u0308",
    "\u1100\u1161\u11a8", "\u0915\u094d\u0937", "\u0e01\u0e33", "cafe\u0301 café", "Z\u0351\u036b\u0343\u036a\u0302algo",
    # emoji
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸🇯🇵", "❤️", "✌🏿", "👩🏻‍💻", "🧑‍🤝‍🧑", "1️⃣", "🫠🫡", "😀😀😀😀",
    "I ❤️ NY 🗽", "emoji at end 🎉", "🎉 emoji at start",
    # special tokens inside text
    "<|im_start|>", "<|im_end|>", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>", "x<|endoftext|>y", "<|begin_of_text|>", "<|begin_of_text|>Hello<|eot_id|>",
    "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "<|reserved_special_token_5|>", "<|eot_id|><|eot_id|>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>",
    "<start_of_image>", "<bos><bos>", "<｜begin▁of▁sentence｜>", "<｜User｜>hi<｜Assistant｜>", "<｜end▁of▁sentence｜>",
    "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "< |im_start| >",
    "<|im_start", "im_start|>", "<<|im_start|>>", " <|im_start|> ", "<s>", "</s>", "[INST] hi [/INST]",
    "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "<|python_tag|>", "<|image_pad|><|video_pad|>",
    # tricky / invalid-looking
    "<0x41>", "<0xFF>", "<0x>", "\u2581", "\u2581\u2581hello", "Ġ", "ĠĠ", "Ċ", "\ufffd", "\ufeffBOM", "\u0000",
    "\u0001\u0002\u0003", "\u007f", "\u0080\u009f", "\ue000", "\U000f0000", "\U0010fffd", "\U0001f9ff",
    "a\u0000b", "\\x00", "\\u0041", "%20%E2%82%AC", "&#x1F600;", "...", "!!!???", "--", "—–-", "•", "…", "«»", "¿¡",
    "((()))", "[[[]]]", "$$$", "@@@", "###", "***", "~~~", "|||", "^^^", "___", "```", "'''", '"""',
]


def random_unicode(rng, n):
    ranges = [(0x20, 0x7e), (0xa0, 0x17f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x5ff), (0x600, 0x6ff),
              (0x900, 0x97f), (0xe00, 0xe7f), (0x3040, 0x30ff), (0x4e00, 0x9fa5), (0xac00, 0xd7a3), (0x1f300, 0x1f64f),
              (0x300, 0x36f), (0x2000, 0x206f), (0xff00, 0xffef), (0x1d400, 0x1d7ff), (0x10000, 0x1007f)]
    out = []
    for _ in range(n):
        lo, hi = rng.choice(ranges)
        cp = rng.randint(lo, hi)
        if 0xd800 <= cp <= 0xdfff:
            cp = 0x41
        out.append(chr(cp))
    return "".join(out)


WORDS = ["the", "The", "THE", "a", "of", "and", "to", "in", "is", "it", "that", "for", "on", "with", "as", "was",
         "hello", "world", "token", "tokenizer", "inference", "runtime", "LLM", "GPU", "unbelievable", "antidisestablish",
         "naïve", "résumé", "coöperate", "Straße", "東京", "北京大学", "こんにちは", "カタカナ", "안녕", "мир", "слово",
         "سلام", "עברית", "हिन्दी", "ภาษาไทย", "😀", "👍🏽", "👨‍👩‍👧", "🇩🇪", "don't", "I'm", "we'LL", "it's", "O'Brien",
         "x", "y1", "foo_bar", "fooBar", "__main__", "3.14", "42", "2024", "1000000", "0.5", "++", "==", "!=", "->",
         "{", "}", "(", ")", "[", "]", ";", ":", ",", ".", "!", "?", "\"", "'", "`", "#", "$", "%", "&", "*", "/",
         "\\", "<", ">", "|", "~", "^", "-", "_", "+", "=", "@", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
         "<|begin_of_text|>", "<|eot_id|>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<think>",
         "<｜begin▁of▁sentence｜>", "<｜User｜>", "▁", "<0x0A>", "ĠĠ", "e\u0301", "\u00a0", "\u3000", "ﬁ", "ｘ"]
SEPS = [" ", " ", " ", " ", "", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "\u00a0", "\u3000", "\t\t", "    ",
        " \t ", "\n    ", "\n\t"]


def random_text(rng):
    kind = rng.random()
    if kind < 0.55:
        n = rng.randint(1, 25)
        parts = []
        for _ in range(n):
            parts.append(rng.choice(WORDS))
            parts.append(rng.choice(SEPS))
        s = "".join(parts)
        if rng.random() < 0.3:
            s = s.strip()
        return s
    if kind < 0.75:
        return random_unicode(rng, rng.randint(1, 40))
    if kind < 0.85:
        # whitespace + punctuation soup
        alphabet = " \t\n\r\u00a0\u2009.,;:!?'\"()[]{}<>|/-_=+*&^%$#@~`0123456789"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 50)))
    if kind < 0.95:
        # digits runs and mixes
        parts = []
        for _ in range(rng.randint(1, 8)):
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 15))))
            parts.append(rng.choice(["", " ", ".", ",", "-", "x", "abc", "\n", "日"]))
        return "".join(parts)
    # mixed scripts and emoji without separators
    return "".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12)))


def long_texts(rng):
    out = ["a" * 1000, "ab" * 600, "x" * 5000, "😀" * 300, "日本" * 400, " " * 2000, "\n" * 500, "\t" * 300,
           "1" * 2000, "supercalifragilisticexpialidocious" * 40, "-" * 1000, "=" * 300 + "\n" + "#" * 300,
           "\u00a0" * 200, "‍" * 50, "e\u0301" * 300]
    para = []
    for _ in range(300):
        para.append(rng.choice(WORDS))
        para.append(rng.choice(SEPS))
    out.append("".join(para))
    out.append("".join(random_unicode(rng, 2000)))
    code = "\n".join(f"    def method_{i}(self, x{i}: int) -> int:\n        return x{i} ** {i} + {i * 7}  # note {i}"
                     for i in range(60))
    out.append(code)
    return out


def main():
    rng = random.Random(SEED)
    texts = list(HAND)
    texts += long_texts(rng)
    while len(texts) < 2200:
        texts.append(random_text(rng))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenizer", "corpus.jsonl")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n")
    print(f"wrote {len(texts)} strings to {path}")


if __name__ == "__main__":
    main()
