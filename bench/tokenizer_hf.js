// The Hugging Face side of bench/tokenizer.c: times the HF `tokenizers`
// library (Rust, via @anush008/tokenizers) encoding a corpus.
//   node bench/tokenizer_hf.js TOKENIZER.json CORPUS
// Prints one JSON line: seconds for encode(whole text) and for
// encodeBatch(paragraphs) (best of 2 each), the id count and a checksum of
// the ids of the whole text (to check kiln gives the same ids).
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require(path.join(__dirname, '..', 'tests', 'node', 'node_modules', '@anush008', 'tokenizers'));

function checksum(ids) {
  let h = 0;
  for (let i = 0; i < ids.length; i++) h = (Math.imul(h, 31) + ids[i]) >>> 0;
  return h;
}

async function main() {
  const [file, corpus] = process.argv.slice(2);
  const tok = Tokenizer.fromFile(file);
  const text = fs.readFileSync(corpus, 'utf8');
  const docs = text.split('\n\n');
  await tok.encode('warm up', null, { addSpecialTokens: false });
  let whole = Infinity, batch = Infinity, ids = null;
  for (let rep = 0; rep < 2; rep++) {
    let t0 = process.hrtime.bigint();
    const e = await tok.encode(text, null, { addSpecialTokens: false });
    whole = Math.min(whole, Number(process.hrtime.bigint() - t0) / 1e9);
    ids = e.getIds();
    t0 = process.hrtime.bigint();
    await tok.encodeBatch(docs, { addSpecialTokens: false });
    batch = Math.min(batch, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  console.log(JSON.stringify({ whole_s: whole, batch_s: batch, n_ids: ids.length, checksum: checksum(ids) }));
}

main().catch((e) => {
  console.error(String(e && e.stack ? e.stack : e));
  process.exit(1);
});
