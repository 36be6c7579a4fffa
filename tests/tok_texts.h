/* The texts the tokenizer tests encode with kiln and with a reference
 * (the Hugging Face library: test_tokenizer_hf; llama.cpp:
 * test_gguf_tok): whitespace runs, code, digits, many scripts, emoji and
 * ZWJ sequences, combining marks, Unicode spaces, compatibility forms,
 * special-token strings, long repeats. One list, entries comma-separated,
 * for an array initialiser. */
#ifndef KILN_TEST_TOK_TEXTS_H
#define KILN_TEST_TOK_TEXTS_H
#define KILN_TEST_TOK_TEXTS \
    "", \
    "Hello world", \
    "Hello, world! How are you doing today?", \
    " leading space", \
    "   three leading spaces and trailing   ", \
    "\n\nnewlines\r\nand\ttabs\t\tend\n", \
    "I'm sure you're right, they've said we'll go; it's John's. I'M SURE YOU'RE RIGHT, SHE'LL", \
    "int main(void) {\n    for (int i = 0; i < 10; i++) printf(\"%d\\n\", i * 2);\n    return 0;\n}\n", \
    "def f(x):\n\treturn [y**2 for y in range(x) if y % 3 == 0]  # comment\n", \
    "digits 1 12 123 1234 12345 123456789 3.14159 1,000,000 2026-12-01", \
    "中文测试：我们今天去北京大学学习人工智能。", \
    "日本語のテキスト、カタカナとひらがな。東京は大きい都市です。", \
    "العربية: مرحبا بالعالم، كيف حالك اليوم؟", \
    "Ελληνικά και Русский текст, עברית, हिन्दी भाषा, 한국어 문장", \
    "emoji 😀 👍🏽 👩‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷 end", \
    "combining: e\xcc\x81 a\xcc\x80 n\xcc\x83 o\xcc\x88\xcc\x81 Zalgo: Z\xcc\xb7\xcd\x96" "a\xcc\xb8l\xcd\x9cg\xcc\xb6o", \
    "precomposed café naïve Ångström vs decomposed cafe\xcc\x81", \
    "unicode spaces:\xc2\xa0nbsp\xe3\x80\x80ideographic\xe2\x80\x89thin\xe2\x80\x8bzwsp\xc2\x85nel\xe2\x80\xa8ls end", \
    "ﬁ ligature, ①②③, ＡＢＣ fullwidth, ½ ¼, ℌ𝔢𝔩𝔩𝔬, K Kelvin, ſ long s", \
    "İstanbul ǅ ß ΣΑΣ", \
    "<|begin_of_text|>Hi<|end_of_text|> <|im_start|>user\nhello<|im_end|>\n<|endoftext|>", \
    "<s>[INST] hi [/INST]</s> <bos><start_of_turn>user text<end_of_turn> <eos><pad>", \
    "<|bos|>kiln<|eos|><|pad|> <|user|> lstrip test  <|user|>  x <|sep|>y", \
    "single word <w> and a<w>b and <w>, ZEBRA-CROSSING zebra-crossing", \
    "MixedCase CamelCaseWords snake_case_words kebab-case-words UPPERCASE", \
    "    indented code\n        more indented\n", \
    "a  b   c    d     e", \
    "!!!???...,,,;;;:::---___***&&&^^^%%%$$$###@@@", \
    "https://example.com/path?query=1&b=2#frag user@example.org", \
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX. 0123456789", \
    "the and thee then them then there thin think hand band", \
    "😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀", \
    "supercalifragilisticexpialidocioussupercalifragilisticexpialidocioussupercalifragilisticexpialidocious", \
    "\xe2\x96\x81" "already\xe2\x96\x81has\xe2\x96\x81metaspace", \
    " ", \
    "\n", \
    "x",
#endif
