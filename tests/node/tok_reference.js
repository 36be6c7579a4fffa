// The reference for tests/test_tokenizer_hf.c: the Hugging Face `tokenizers`
// library (Rust, through @anush008/tokenizers) encodes and decodes every
// text with every tokenizer.json given.
//   node tests/node/tok_reference.js TEXTS.json OUT.json FILE...
// TEXTS.json is an array of strings; OUT.json gets, per file, per text:
// ids with and without special tokens and the decodes of both.
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require(path.join(__dirname, 'node_modules', '@anush008', 'tokenizers'));

async function main() {
  const [textsPath, outPath, ...files] = process.argv.slice(2);
  const texts = JSON.parse(fs.readFileSync(textsPath, 'utf8'));
  const out = [];
  for (const file of files) {
    const tok = Tokenizer.fromFile(file);
    const rows = [];
    for (const text of texts) {
      // Python's encode(text) defaults to add_special_tokens=True; pass both explicitly.
      const withSp = (await tok.encode(text, null, { addSpecialTokens: true })).getIds();
      const noSp = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
      rows.push({
        ids: Array.from(withSp),
        ids_plain: Array.from(noSp),
        decoded: await tok.decode(Array.from(withSp), false),
        decoded_skip: await tok.decode(Array.from(withSp), true),
      });
    }
    out.push({ file, rows });
  }
  fs.writeFileSync(outPath, JSON.stringify(out));
}

main().catch((e) => {
  console.error(String(e && e.stack ? e.stack : e));
  process.exit(1);
});
