/* The batch loader: packed windows, document-aligned padded rows, whole
 * documents packed into rows as segments, or preference pairs as two rows
 * each, in a per-epoch permutation that is a pure function of (seed, epoch). */
#include <stdlib.h>
#include <string.h>
#include "data_impl.h"

struct kiln_loader {
    kiln_loader_config cfg;
    char *path;
    kiln_shard *shard;
    const kiln_shard_info *info;
    int64_t n_items;
    uint64_t *row_start; /* padded mode: per row; documents mode: per piece */
    uint32_t *row_len;
    int64_t n_pieces;
    int64_t *doc_piece;  /* documents: first piece of each document, n_docs + 1 */
    int64_t n_docs;
    int64_t *row_first;  /* documents: row r holds pieces row_piece[row_first[r] .. row_first[r+1]) */
    int64_t *row_piece;
    int32_t pad_id;
    int64_t *perm;       /* permutation of perm_epoch (shuffle only) */
    const float *ref;    /* pairs: the reference's log-probs of each document (kiln_loader_set_ref), or NULL */
    int64_t perm_epoch;
    kiln_loader_state state;
};

kiln_batch *kiln_batch_alloc(int B, int T) {
    if (B <= 0 || T <= 0) {
        kiln_error(KILN_ERR_INVALID, "batch shape %d x %d: both must be positive", B, T);
        return NULL;
    }
    kiln_batch *b = calloc(1, sizeof *b);
    size_t n = (size_t)B * (size_t)T;
    if (b) {
        b->B = B;
        b->T = T;
        b->input_ids = malloc(n * sizeof(int32_t));
        b->targets = malloc(n * sizeof(int32_t));
        b->pad_mask = malloc(n * sizeof(int32_t));
        b->positions = malloc(n * sizeof(int32_t));
        b->segments = malloc(n * sizeof(int32_t));
        b->ref_logps = calloc((size_t)B, sizeof(float));
        b->doc = malloc((size_t)B * sizeof(int64_t));
    }
    if (!b || !b->input_ids || !b->targets || !b->pad_mask || !b->positions || !b->segments || !b->ref_logps || !b->doc) {
        kiln_batch_free(b);
        kiln_error(KILN_ERR_OOM, "out of memory for a %d x %d batch", B, T);
        return NULL;
    }
    return b;
}

void kiln_batch_free(kiln_batch *b) {
    if (!b) return;
    free(b->input_ids);
    free(b->targets);
    free(b->pad_mask);
    free(b->positions);
    free(b->segments);
    free(b->ref_logps);
    free(b->doc);
    free(b);
}

/* Rows of padded mode (the pieces of documents mode): each document's
 * inputs (all but its last token) cut into pieces of at most T. Two passes:
 * count, then fill. */
static kiln_status build_rows(kiln_loader *l) {
    const kiln_shard_info *in = l->info;
    uint64_t T = (uint64_t)l->cfg.seq_len;
    for (int pass = 0; pass < 2; pass++) {
        int64_t r = 0, d = 0;
        uint64_t s = 0;
        for (uint64_t i = 0; i < in->count; i++) {
            bool end = kiln_shard_token(l->shard, i) == in->eos_id || i + 1 == in->count;
            if (!end) continue;
            uint64_t inputs = i - s; /* tokens s..i, the last one only as a target */
            if (pass && l->doc_piece) l->doc_piece[d] = r;
            d += inputs > 0;
            for (uint64_t o = 0; o < inputs; o += T, r++) {
                if (pass) {
                    l->row_start[r] = s + o;
                    l->row_len[r] = (uint32_t)(inputs - o < T ? inputs - o : T);
                }
            }
            s = i + 1;
        }
        if (!pass) {
            l->n_items = l->n_pieces = r;
            l->n_docs = d;
            /* documents are delimited by eos: a header that counts fewer
             * means eos occurs inside documents (a chat template ending
             * each turn with it), and packing splits them there */
            uint64_t spans = 0;
            for (uint64_t i = 0; i < in->count; i++) spans += kiln_shard_token(l->shard, i) == in->eos_id || i + 1 == in->count;
            if (l->cfg.mode == KILN_PACK_DOCUMENTS && in->n_docs && spans > in->n_docs)
                kiln_log(KILN_LOG_WARN,
                         "%s: the header counts %llu documents but eos (id %u) ends %llu spans: documents holding the "
                         "eos id are split there, and --pack documents keeps the pieces from attending to each other",
                         l->cfg.path, (unsigned long long)in->n_docs, in->eos_id, (unsigned long long)spans);
            l->row_start = malloc((size_t)(r ? r : 1) * sizeof *l->row_start);
            l->row_len = malloc((size_t)(r ? r : 1) * sizeof *l->row_len);
            if (l->cfg.mode == KILN_PACK_DOCUMENTS) l->doc_piece = malloc((size_t)(d + 1) * sizeof *l->doc_piece);
            if (!l->row_start || !l->row_len || (l->cfg.mode == KILN_PACK_DOCUMENTS && !l->doc_piece))
                return kiln_error(KILN_ERR_OOM, "out of memory for %lld rows", (long long)r);
        } else if (l->doc_piece) {
            l->doc_piece[d] = r;
        }
    }
    return KILN_OK;
}

/* Rows open for more pieces while packing: first fit over the most recent
 * ones, so short pieces fill the gaps long ones leave, in bounded time. */
#define OPEN_ROWS 8

/* Documents mode: the pieces go into rows whole, document by document in a
 * seeded order (file order without shuffle), each piece into the first of
 * the open rows with room for it, else a new row. Done once, so the number
 * of rows is the same in every epoch (epochs then permute the rows). */
static kiln_status pack_documents(kiln_loader *l) {
    int64_t nd = l->n_docs, np = l->n_pieces, T = l->cfg.seq_len;
    int64_t *order = malloc((size_t)(nd ? nd : 1) * sizeof *order);
    int64_t *row_of = malloc((size_t)(np ? np : 1) * sizeof *row_of);
    int64_t *placed = malloc((size_t)(np ? np : 1) * sizeof *placed);
    int64_t *free_of = malloc((size_t)(np ? np : 1) * sizeof *free_of); /* room left per row */
    l->row_first = calloc((size_t)np + 2, sizeof *l->row_first);
    l->row_piece = malloc((size_t)(np ? np : 1) * sizeof *l->row_piece);
    kiln_status st = KILN_OK;
    if (!order || !row_of || !placed || !free_of || !l->row_first || !l->row_piece) {
        st = kiln_error(KILN_ERR_OOM, "out of memory packing %lld documents", (long long)nd);
        goto done;
    }
    for (int64_t i = 0; i < nd; i++) order[i] = i;
    if (l->cfg.shuffle) {
        uint64_t key = kiln_rng_u64(l->cfg.seed, 0xd0c5ULL << 32);
        for (int64_t i = nd - 1; i > 0; i--) {
            uint64_t r = kiln_rng_u64(key, (uint64_t)i);
            int64_t j = (int64_t)(((unsigned __int128)r * (uint64_t)(i + 1)) >> 64);
            int64_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
    }
    int64_t rows = 0, n_placed = 0;
    for (int64_t k = 0; k < nd; k++) {
        int64_t d = order[k];
        for (int64_t p = l->doc_piece[d]; p < l->doc_piece[d + 1]; p++) {
            int64_t len = l->row_len[p], r = rows - OPEN_ROWS > 0 ? rows - OPEN_ROWS : 0;
            while (r < rows && free_of[r] < len) r++;
            if (r == rows) free_of[rows++] = T;
            free_of[r] -= len;
            row_of[p] = r;
            placed[n_placed++] = p;
        }
    }
    /* rows as lists of pieces in the order they were placed */
    for (int64_t i = 0; i < n_placed; i++) l->row_first[row_of[placed[i]] + 2]++;
    for (int64_t r = 0; r < rows; r++) l->row_first[r + 2] += l->row_first[r + 1];
    for (int64_t i = 0; i < n_placed; i++) l->row_piece[l->row_first[row_of[placed[i]] + 1]++] = placed[i];
    l->n_items = rows;
done:
    free(order);
    free(row_of);
    free(placed);
    free(free_of);
    return st;
}

static const char *mode_name(kiln_pack_mode m) {
    return m == KILN_PACK_PACKED ? "packed" : m == KILN_PACK_PADDED ? "padded" : m == KILN_PACK_DOCUMENTS ? "documents" : "pairs";
}

/* Pairs mode: the items are the pairs, each document one row. */
static kiln_status check_pairs(kiln_loader *l) {
    const uint64_t *end = kiln_shard_doc_ends(l->shard);
    uint64_t T = (uint64_t)l->cfg.seq_len;
    for (uint64_t d = 0; d < l->info->n_docs; d++) {
        uint64_t inputs = end[d] - (d ? end[d - 1] : 0) - 1; /* the eos is only a target */
        if (inputs > T)
            return kiln_error(KILN_ERR_INVALID,
                              "%s: pair %llu (documents %llu and %llu): its %s document has %llu inputs (prompt and answer), "
                              "more than --seq-len %d; tokenize with --max-len %d (answers cut to fit) or raise --seq-len",
                              l->cfg.path, (unsigned long long)(d / 2), (unsigned long long)(d & ~1ull),
                              (unsigned long long)(d | 1), d & 1 ? "rejected" : "chosen", (unsigned long long)inputs,
                              l->cfg.seq_len, l->cfg.seq_len);
    }
    l->n_items = (int64_t)(l->info->n_docs / 2);
    return KILN_OK;
}

kiln_status kiln_loader_open(const kiln_loader_config *cfg, kiln_loader **out) {
    *out = NULL;
    if (!cfg->path) return kiln_error(KILN_ERR_INVALID, "loader: no shard path");
    if (cfg->batch_size <= 0 || cfg->seq_len <= 0)
        return kiln_error(KILN_ERR_INVALID, "loader: batch size %d and sequence length %d must be positive",
                          cfg->batch_size, cfg->seq_len);
    if (cfg->mode != KILN_PACK_PACKED && cfg->mode != KILN_PACK_PADDED && cfg->mode != KILN_PACK_DOCUMENTS &&
        cfg->mode != KILN_PACK_PAIRS)
        return kiln_error(KILN_ERR_INVALID, "loader: unknown packing mode %d", (int)cfg->mode);
    if (cfg->mode == KILN_PACK_PAIRS && cfg->batch_size % 2)
        return kiln_error(KILN_ERR_INVALID,
                          "loader: --pack pairs needs an even batch size (rows 2i and 2i+1 are the chosen and rejected "
                          "answer of one pair), got %d", cfg->batch_size);
    kiln_loader *l = calloc(1, sizeof *l);
    if (!l) return kiln_error(KILN_ERR_OOM, "out of memory");
    l->cfg = *cfg;
    l->path = strdup(cfg->path);
    l->cfg.path = l->path;
    l->perm_epoch = -1;
    kiln_status st = l->path ? kiln_shard_open(cfg->path, &l->shard) : kiln_error(KILN_ERR_OOM, "out of memory");
    if (!st) {
        l->info = kiln_shard_get_info(l->shard);
        l->pad_id = l->info->pad_id < l->info->vocab_size ? (int32_t)l->info->pad_id : 0;
        uint64_t T = (uint64_t)cfg->seq_len;
        bool pairs = l->info->flags & KILN_SHARD_PAIRS;
        if (pairs && cfg->mode != KILN_PACK_PAIRS)
            st = kiln_error(KILN_ERR_INVALID,
                            "%s holds preference pairs (%llu pairs of a chosen and a rejected document): read it with "
                            "--pack pairs, not %s",
                            cfg->path, (unsigned long long)(l->info->n_docs / 2), mode_name(cfg->mode));
        else if (!pairs && cfg->mode == KILN_PACK_PAIRS)
            st = kiln_error(KILN_ERR_INVALID,
                            "%s holds no preference pairs (%llu documents): --pack pairs reads the shards kiln tokenize "
                            "makes of {\"prompt\", \"chosen\", \"rejected\"} JSONL",
                            cfg->path, (unsigned long long)l->info->n_docs);
        else if (cfg->mode == KILN_PACK_PAIRS)
            st = check_pairs(l);
        else if (cfg->mode == KILN_PACK_PACKED)
            l->n_items = l->info->count > T ? (int64_t)((l->info->count - 1) / T) : 0;
        else
            st = build_rows(l);
        if (!st && cfg->mode == KILN_PACK_DOCUMENTS) st = pack_documents(l);
    }
    if (!st && l->n_items == 0)
        st = kiln_error(KILN_ERR_INVALID, "%s: %llu tokens make no %s row of length %d", cfg->path,
                        (unsigned long long)l->info->count, mode_name(cfg->mode),
                        cfg->seq_len);
    if (st) {
        kiln_loader_close(l);
        return st;
    }
    *out = l;
    return KILN_OK;
}

void kiln_loader_close(kiln_loader *l) {
    if (!l) return;
    kiln_shard_close(l->shard);
    free(l->row_start);
    free(l->row_len);
    free(l->doc_piece);
    free(l->row_first);
    free(l->row_piece);
    free(l->perm);
    free(l->path);
    free(l);
}

/* items of the permutation per micro-batch: rows, or pairs of rows */
static int64_t per_batch(const kiln_loader *l) {
    return l->cfg.mode == KILN_PACK_PAIRS ? l->cfg.batch_size / 2 : l->cfg.batch_size;
}
int64_t kiln_loader_items(const kiln_loader *l) { return l->cfg.mode == KILN_PACK_PAIRS ? 2 * l->n_items : l->n_items; }
int64_t kiln_loader_pairs(const kiln_loader *l) { return l->cfg.mode == KILN_PACK_PAIRS ? l->n_items : 0; }
int64_t kiln_loader_len(const kiln_loader *l) { return (l->n_items + per_batch(l) - 1) / per_batch(l); }
const kiln_shard_info *kiln_loader_info(const kiln_loader *l) { return l->info; }

/* Fisher-Yates driven by the counter-based RNG: depends on (seed, epoch) only. */
static kiln_status ensure_perm(kiln_loader *l, int64_t epoch) {
    if (!l->cfg.shuffle || l->perm_epoch == epoch) return KILN_OK;
    if (!l->perm) {
        l->perm = malloc((size_t)l->n_items * sizeof *l->perm);
        if (!l->perm) return kiln_error(KILN_ERR_OOM, "out of memory for the shuffle of %lld rows", (long long)l->n_items);
    }
    uint64_t key = kiln_rng_u64(l->cfg.seed, 0x5eed0000ULL + (uint64_t)epoch);
    for (int64_t i = 0; i < l->n_items; i++) l->perm[i] = i;
    for (int64_t i = l->n_items - 1; i > 0; i--) {
        uint64_t r = kiln_rng_u64(key, (uint64_t)i);
        int64_t j = (int64_t)(((unsigned __int128)r * (uint64_t)(i + 1)) >> 64);
        int64_t t = l->perm[i];
        l->perm[i] = l->perm[j];
        l->perm[j] = t;
    }
    l->perm_epoch = epoch;
    return KILN_OK;
}

/* Inputs [start, start + len) of the shard at row offset o, as segment
 * `seg` with positions from 0; returns the number of targets (masked
 * tokens are inputs but never targets). */
static int64_t fill_span(const kiln_loader *l, uint64_t start, int len, int32_t seg, int32_t *in, int32_t *tg,
                         int32_t *mask, int32_t *pos, int32_t *sg) {
    const uint8_t *lm = kiln_shard_mask(l->shard);
    int64_t n = 0;
    for (int t = 0; t < len; t++) {
        uint64_t j = start + (uint64_t)t + 1;
        in[t] = (int32_t)kiln_shard_token(l->shard, j - 1);
        tg[t] = !lm || lm[j] ? (int32_t)kiln_shard_token(l->shard, j) : KILN_IGNORE_INDEX;
        n += tg[t] != KILN_IGNORE_INDEX;
        mask[t] = 1;
        pos[t] = t;
        sg[t] = seg;
    }
    return n;
}

static void fill_pad(const kiln_loader *l, int from, int32_t *in, int32_t *tg, int32_t *mask, int32_t *pos, int32_t *sg) {
    for (int t = from; t < l->cfg.seq_len; t++) {
        in[t] = l->pad_id;
        tg[t] = KILN_IGNORE_INDEX;
        mask[t] = 0;
        pos[t] = t;
        sg[t] = 0;
    }
}

/* Fills one row; returns its number of targets. */
static int64_t fill_row(const kiln_loader *l, int64_t item, int32_t *in, int32_t *tg, int32_t *mask, int32_t *pos,
                        int32_t *sg) {
    int T = l->cfg.seq_len, used = 0;
    int64_t n = 0;
    if (l->cfg.mode == KILN_PACK_PAIRS) { /* item: a document, 2 * pair + (rejected) */
        const uint64_t *end = kiln_shard_doc_ends(l->shard);
        uint64_t start = item ? end[item - 1] : 0;
        used = (int)(end[item] - start - 1);
        n = fill_span(l, start, used, 1, in, tg, mask, pos, sg);
    } else if (l->cfg.mode == KILN_PACK_DOCUMENTS) {
        for (int64_t k = l->row_first[item]; k < l->row_first[item + 1]; k++) {
            int64_t p = l->row_piece[k];
            int len = (int)l->row_len[p];
            n += fill_span(l, l->row_start[p], len, (int32_t)(k - l->row_first[item] + 1), in + used, tg + used,
                           mask + used, pos + used, sg + used);
            used += len;
        }
    } else {
        uint64_t start = l->cfg.mode == KILN_PACK_PACKED ? (uint64_t)item * (uint64_t)T : l->row_start[item];
        used = l->cfg.mode == KILN_PACK_PACKED ? T : (int)l->row_len[item];
        n = fill_span(l, start, used, 1, in, tg, mask, pos, sg);
    }
    fill_pad(l, used, in, tg, mask, pos, sg);
    return n;
}

kiln_status kiln_loader_get(kiln_loader *l, int64_t epoch, int64_t index, kiln_batch *b) {
    int B = l->cfg.batch_size, T = l->cfg.seq_len;
    if (!b || b->B != B || b->T != T)
        return kiln_error(KILN_ERR_SHAPE, "loader: batch is %d x %d, the loader makes %d x %d", b ? b->B : 0,
                          b ? b->T : 0, B, T);
    if (epoch < 0 || index < 0 || index >= kiln_loader_len(l))
        return kiln_error(KILN_ERR_RANGE, "loader: batch (epoch %lld, index %lld) out of range: %lld batches per epoch",
                          (long long)epoch, (long long)index, (long long)kiln_loader_len(l));
    kiln_status st = ensure_perm(l, epoch);
    if (st) return st;
    bool pairs = l->cfg.mode == KILN_PACK_PAIRS;
    int64_t per = per_batch(l), first = index * per, items = l->n_items - first < per ? l->n_items - first : per;
    int64_t rows = pairs ? 2 * items : items;
    b->rows = (int)rows;
    b->n_targets = 0;
    b->epoch = epoch;
    b->index = index;
    b->segmented = l->cfg.mode == KILN_PACK_DOCUMENTS;
    b->has_ref = l->ref != NULL;
    for (int r = 0; r < B; r++) {
        size_t o = (size_t)r * T;
        int32_t *in = b->input_ids + o, *tg = b->targets + o, *mk = b->pad_mask + o;
        b->doc[r] = -1;
        b->ref_logps[r] = 0;
        if (r < rows) {
            int64_t k = first + (pairs ? r / 2 : r), item = l->cfg.shuffle ? l->perm[k] : k;
            if (pairs) item = 2 * item + (r & 1); /* chosen, then rejected */
            b->n_targets += fill_row(l, item, in, tg, mk, b->positions + o, b->segments + o);
            if (pairs) b->doc[r] = item;
            if (l->ref) b->ref_logps[r] = l->ref[item];
        } else {
            fill_pad(l, 0, in, tg, mk, b->positions + o, b->segments + o);
        }
    }
    return KILN_OK;
}

kiln_status kiln_loader_next(kiln_loader *l, kiln_batch *b) {
    kiln_status st = kiln_loader_get(l, l->state.epoch, l->state.next_index, b);
    if (st) return st;
    if (++l->state.next_index >= kiln_loader_len(l)) {
        l->state.epoch++;
        l->state.next_index = 0;
    }
    return KILN_OK;
}

kiln_loader_state kiln_loader_get_state(const kiln_loader *l) { return l->state; }

kiln_status kiln_loader_set_state(kiln_loader *l, kiln_loader_state st) {
    if (st.epoch < 0 || st.next_index < 0 || st.next_index > kiln_loader_len(l))
        return kiln_error(KILN_ERR_RANGE, "loader state (epoch %lld, index %lld) out of range: %lld batches per epoch",
                          (long long)st.epoch, (long long)st.next_index, (long long)kiln_loader_len(l));
    if (st.next_index == kiln_loader_len(l)) {
        st.epoch++;
        st.next_index = 0;
    }
    l->state = st;
    return KILN_OK;
}

kiln_status kiln_loader_set_ref(kiln_loader *l, const float *logps, uint64_t n) {
    if (l->cfg.mode != KILN_PACK_PAIRS)
        return kiln_error(KILN_ERR_INVALID, "%s: reference log-probabilities belong to a pairs loader", l->path);
    if (logps && n != 2 * (uint64_t)l->n_items)
        return kiln_error(KILN_ERR_INVALID, "%s: %llu reference log-probabilities for %llu documents", l->path,
                          (unsigned long long)n, (unsigned long long)(2 * l->n_items));
    l->ref = logps;
    return KILN_OK;
}

uint64_t kiln_loader_shard_hash(const kiln_loader *l) { return kiln_shard_hash(l->shard); }
