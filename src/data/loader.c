/* The batch loader: packed windows or document-aligned padded rows, in a
 * per-epoch permutation that is a pure function of (seed, epoch). */
#include <stdlib.h>
#include <string.h>
#include "data_impl.h"

struct kiln_loader {
    kiln_loader_config cfg;
    char *path;
    kiln_shard *shard;
    const kiln_shard_info *info;
    int64_t n_items;
    uint64_t *row_start; /* padded mode: per row */
    uint32_t *row_len;
    int32_t pad_id;
    int64_t *perm;       /* permutation of perm_epoch (shuffle only) */
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
    }
    if (!b || !b->input_ids || !b->targets || !b->pad_mask) {
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
    free(b);
}

/* Rows of padded mode: each document's inputs (all but its last token) cut
 * into pieces of at most T. Two passes: count, then fill. */
static kiln_status build_rows(kiln_loader *l) {
    const kiln_shard_info *in = l->info;
    uint64_t T = (uint64_t)l->cfg.seq_len;
    for (int pass = 0; pass < 2; pass++) {
        int64_t r = 0;
        uint64_t s = 0;
        for (uint64_t i = 0; i < in->count; i++) {
            bool end = kiln_shard_token(l->shard, i) == in->eos_id || i + 1 == in->count;
            if (!end) continue;
            uint64_t inputs = i - s; /* tokens s..i, the last one only as a target */
            for (uint64_t o = 0; o < inputs; o += T, r++) {
                if (pass) {
                    l->row_start[r] = s + o;
                    l->row_len[r] = (uint32_t)(inputs - o < T ? inputs - o : T);
                }
            }
            s = i + 1;
        }
        if (!pass) {
            l->n_items = r;
            l->row_start = malloc((size_t)(r ? r : 1) * sizeof *l->row_start);
            l->row_len = malloc((size_t)(r ? r : 1) * sizeof *l->row_len);
            if (!l->row_start || !l->row_len) return kiln_error(KILN_ERR_OOM, "out of memory for %lld rows", (long long)r);
        }
    }
    return KILN_OK;
}

kiln_status kiln_loader_open(const kiln_loader_config *cfg, kiln_loader **out) {
    *out = NULL;
    if (!cfg->path) return kiln_error(KILN_ERR_INVALID, "loader: no shard path");
    if (cfg->batch_size <= 0 || cfg->seq_len <= 0)
        return kiln_error(KILN_ERR_INVALID, "loader: batch size %d and sequence length %d must be positive",
                          cfg->batch_size, cfg->seq_len);
    if (cfg->mode != KILN_PACK_PACKED && cfg->mode != KILN_PACK_PADDED)
        return kiln_error(KILN_ERR_INVALID, "loader: unknown packing mode %d", (int)cfg->mode);
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
        if (cfg->mode == KILN_PACK_PACKED)
            l->n_items = l->info->count > T ? (int64_t)((l->info->count - 1) / T) : 0;
        else
            st = build_rows(l);
    }
    if (!st && l->n_items == 0)
        st = kiln_error(KILN_ERR_INVALID, "%s: %llu tokens make no %s row of length %d", cfg->path,
                        (unsigned long long)l->info->count, cfg->mode == KILN_PACK_PACKED ? "packed" : "padded",
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
    free(l->perm);
    free(l->path);
    free(l);
}

int64_t kiln_loader_items(const kiln_loader *l) { return l->n_items; }
int64_t kiln_loader_len(const kiln_loader *l) {
    return (l->n_items + l->cfg.batch_size - 1) / l->cfg.batch_size;
}
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

/* Fills one row; returns its number of targets (masked tokens are inputs
 * but never targets). */
static int64_t fill_row(const kiln_loader *l, int64_t item, int32_t *in, int32_t *tg, int32_t *mask) {
    int T = l->cfg.seq_len;
    uint64_t start = l->cfg.mode == KILN_PACK_PACKED ? (uint64_t)item * (uint64_t)T : l->row_start[item];
    int len = l->cfg.mode == KILN_PACK_PACKED ? T : (int)l->row_len[item];
    const uint8_t *lm = kiln_shard_mask(l->shard);
    int64_t n = 0;
    for (int t = 0; t < len; t++) {
        uint64_t j = start + (uint64_t)t + 1;
        in[t] = (int32_t)kiln_shard_token(l->shard, j - 1);
        tg[t] = !lm || lm[j] ? (int32_t)kiln_shard_token(l->shard, j) : KILN_IGNORE_INDEX;
        n += tg[t] != KILN_IGNORE_INDEX;
        mask[t] = 1;
    }
    for (int t = len; t < T; t++) {
        in[t] = l->pad_id;
        tg[t] = KILN_IGNORE_INDEX;
        mask[t] = 0;
    }
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
    int64_t first = index * B, rows = l->n_items - first < B ? l->n_items - first : B;
    b->rows = (int)rows;
    b->n_targets = 0;
    b->epoch = epoch;
    b->index = index;
    for (int r = 0; r < B; r++) {
        int32_t *in = b->input_ids + (size_t)r * T, *tg = b->targets + (size_t)r * T, *mk = b->pad_mask + (size_t)r * T;
        if (r < rows) {
            int64_t item = l->cfg.shuffle ? l->perm[first + r] : first + r;
            b->n_targets += fill_row(l, item, in, tg, mk);
        } else {
            for (int t = 0; t < T; t++) {
                in[t] = l->pad_id;
                tg[t] = KILN_IGNORE_INDEX;
                mk[t] = 0;
            }
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
