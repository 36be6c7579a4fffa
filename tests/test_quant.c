/* ggml's block formats (kiln/quant.h) against ggml itself, loaded from
 * node-llama-cpp's prebuilt libggml-base.so: the type table against
 * ggml_get_type_traits; dequantization of random blocks (random bytes,
 * finite f16 scales) against each type's to_float, bit for bit;
 * quantization of many rows (random, zeros, all equal, tiny and huge
 * magnitudes, outliers, sparse, one sign; odd row counts; several row
 * lengths) against ggml_quantize_chunk, byte for byte. Without the library
 * it says so in one line and checks the round trip error bounds alone. */
#include "ggml_ref.h"
#include "kiln/gguf.h"
#include "kiln/quant.h"
#include "test.h"

static ggml_ref G;
static bool have_ref;
static uint64_t g_seed = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) { return kiln_rng_u64(0x51ab, g_seed++); }
static float unif(void) { return (float)((double)(rnd() >> 11) * 0x1p-53); }
static float gauss(void) {
    double u = (double)((rnd() >> 11) + 1) * 0x1p-53, v = (double)(rnd() >> 11) * 0x1p-53;
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

enum { K_GAUSS, K_ZERO, K_EQUAL, K_TINY, K_HUGE, K_OUTLIER, K_SPARSE, K_POS, K_NEG, K_UNIFORM, K_MIXED, N_KINDS };
static const char *kind_name[N_KINDS] = {"gauss", "zeros", "equal", "tiny", "huge", "outlier",
                                         "sparse", "positive", "negative", "uniform", "mixed-scale"};

static void gen(int kind, float *x, int64_t n) {
    float c = gauss();
    for (int64_t i = 0; i < n; i++) {
        float v = gauss();
        switch (kind) {
        case K_GAUSS: x[i] = v; break;
        case K_ZERO: x[i] = 0; break;
        case K_EQUAL: x[i] = c; break;
        case K_TINY: x[i] = v * 1e-20f; break;
        case K_HUGE: x[i] = v * 1e15f; break;
        case K_OUTLIER: x[i] = rnd() % 97 == 0 ? v * 100 : v * 0.01f; break;
        case K_SPARSE: x[i] = rnd() % 8 == 0 ? v : 0; break;
        case K_POS: x[i] = fabsf(v) + 0.5f; break;
        case K_NEG: x[i] = -fabsf(v) - 0.25f; break;
        case K_UNIFORM: x[i] = unif() * 2 - 1; break;
        case K_MIXED: x[i] = v * powf(10.f, (float)(int)(rnd() % 9) - 4); break;
        }
    }
}

/* The byte offsets of a block's f16 scales (made finite in random blocks). */
static int scale_offsets(kiln_qtype t, int *off) {
    switch (t) {
    case KILN_QT_Q8_0:
    case KILN_QT_Q4_0:
    case KILN_QT_Q5_0: off[0] = 0; return 1;
    case KILN_QT_Q4_1:
    case KILN_QT_Q5_1:
    case KILN_QT_Q4_K:
    case KILN_QT_Q5_K: off[0] = 0, off[1] = 2; return 2;
    case KILN_QT_Q6_K: off[0] = 208; return 1;
    default: return 0;
    }
}

static void check_table(void) {
    CHECK(kiln_qtype_count() == 11, "%d types", kiln_qtype_count());
    for (int i = 0; i < kiln_qtype_count(); i++) {
        const kiln_qtype_info *q = kiln_qtype_at(i);
        CHECK(kiln_qtype_find((int)q->type) == q && kiln_qtype_by_name(q->name) == q, "%s lookup", q->name);
        CHECK(kiln_q_row_bytes(q->type, 4 * q->block) == (size_t)(4 * q->bytes), "%s row bytes", q->name);
        CHECK(q->block == 1 || kiln_q_row_bytes(q->type, q->block + 1) == 0, "%s partial block accepted", q->name);
        /* the GGUF reader's table (formats layer) agrees */
        CHECK(kiln_ggml_nbytes((kiln_ggml_type)q->type, 4 * q->block) == (size_t)(4 * q->bytes), "gguf.h size of %s",
              q->name);
        if (have_ref) {
            char why[256];
            const struct ggml_type_traits_ref *tr = ggml_ref_traits(&G, (int)q->type, why, sizeof why);
            CHECK(tr && !strcasecmp(tr->type_name, q->name) && tr->blck_size == q->block &&
                      tr->type_size == (size_t)q->bytes && tr->is_quantized == q->quantized,
                  "%s against ggml: %s", q->name, tr ? tr->type_name : why);
        }
    }
    CHECK(kiln_qtype_find(10) == NULL && kiln_qtype_by_name("q2_k") == NULL, "q2_k known");
    float x[32] = {0};
    uint8_t y[64];
    CHECK(kiln_q_quantize((kiln_qtype)10, x, y, 32) == KILN_ERR_UNSUPPORTED && strstr(kiln_last_error(), "type 10"),
          "q2_k: %s", kiln_last_error());
    CHECK(kiln_q_quantize(KILN_QT_Q4_K, x, y, 32) == KILN_ERR_SHAPE && strstr(kiln_last_error(), "q4_k") &&
              strstr(kiln_last_error(), "256"),
          "q4_k of 32: %s", kiln_last_error());
    CHECK(kiln_q_dequantize(KILN_QT_Q8_0, y, x, 33) == KILN_ERR_SHAPE, "q8_0 of 33");
}

/* Random blocks, dequantized by kiln and by ggml's to_float. */
static void check_dequant(const kiln_qtype_info *q, const struct ggml_type_traits_ref *tr) {
    const int nb = 4096 / q->block > 64 ? 4096 / q->block : 64;
    const int64_t n = (int64_t)nb * q->block;
    size_t nbytes = kiln_q_row_bytes(q->type, n);
    uint8_t *b = malloc(nbytes);
    float *mine = malloc((size_t)n * 4), *theirs = malloc((size_t)n * 4);
    int bad = 0, rounds = 8;
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < nbytes; i++) b[i] = (uint8_t)rnd();
        int off[2], ns = scale_offsets(q->type, off);
        for (int k = 0; k < nb; k++)
            for (int s = 0; s < ns; s++) {
                uint16_t h = (uint16_t)rnd();
                if (((h >> 10) & 0x1f) == 0x1f) h &= 0xbfff; /* inf/NaN exponent -> finite */
                if (r == 1) h = 0;                           /* zero scales */
                memcpy(b + (size_t)k * q->bytes + off[s], &h, 2);
            }
        if (q->type == KILN_QT_F32) /* finite floats */
            for (int64_t i = 0; i < n; i++) {
                float f = gauss() * powf(2.f, (float)(int)(rnd() % 200) - 100);
                memcpy(b + 4 * i, &f, 4);
            }
        CHECK_OK(kiln_q_dequantize(q->type, b, mine, n));
        if (tr) {
            tr->to_float(b, theirs, n);
            for (int64_t i = 0; i < n; i++)
                if (memcmp(&mine[i], &theirs[i], 4) && bad++ < 3)
                    { uint32_t a, c; memcpy(&a, &mine[i], 4), memcpy(&c, &theirs[i], 4); fprintf(stderr, "  %s value %lld: kiln %a (%08x) ggml %a (%08x)\n", q->name, (long long)i, mine[i], a, theirs[i], c); }
        }
    }
    if (tr) {
        CHECK(bad == 0, "%s: %d values differ from ggml's to_float", q->name, bad);
        printf("  dequantize %-5s %d blocks x %d rounds: bit-exact with ggml's to_float\n", q->name, nb, rounds);
    }
    free(b), free(mine), free(theirs);
}

typedef struct {
    double max_rel, sum_sq, sum_ref;
    int64_t rows, bytes_bad, rows_bad;
} qstats;

/* Quantizes nrows rows of n_per_row values of one kind with kiln and with
 * ggml_quantize_chunk (also from a start row), and the round trip. */
static void check_quant_case(const kiln_qtype_info *q, int kind, int64_t nrows, int64_t n_per_row, qstats *st) {
    int64_t n = nrows * n_per_row;
    float *x = malloc((size_t)n * 4), *back = malloc((size_t)n * 4);
    size_t nbytes = kiln_q_row_bytes(q->type, n), row_bytes = kiln_q_row_bytes(q->type, n_per_row);
    uint8_t *mine = malloc(nbytes), *theirs = malloc(nbytes);
    for (int64_t r = 0; r < nrows; r++) gen(kind, x + r * n_per_row, n_per_row);
    CHECK_OK(kiln_q_quantize(q->type, x, mine, n));
    if (have_ref) {
        memset(theirs, 0xa5, nbytes);
        size_t got = G.quantize_chunk((int)q->type, x, theirs, 0, nrows, n_per_row, NULL);
        CHECK(got == nbytes, "%s: ggml wrote %zu bytes, not %zu", q->name, got, nbytes);
        for (int64_t r = 0; r < nrows; r++) {
            const uint8_t *a = mine + r * row_bytes, *b = theirs + r * row_bytes;
            if (memcmp(a, b, row_bytes)) {
                st->rows_bad++;
                for (size_t i = 0; i < row_bytes; i++) st->bytes_bad += a[i] != b[i];
                if (st->rows_bad <= 2) {
                    size_t i = 0;
                    while (a[i] == b[i]) i++;
                    fprintf(stderr, "  %s %s row %lld (n %lld): byte %zu (block %zu +%zu) kiln %02x ggml %02x\n",
                            q->name, kind_name[kind], (long long)r, (long long)n_per_row, i, i / q->bytes,
                            i % q->bytes, a[i], b[i]);
                }
            }
        }
        if (nrows > 1) { /* a chunk that starts at row 1 */
            memset(theirs, 0, nbytes);
            G.quantize_chunk((int)q->type, x, theirs, n_per_row, nrows - 1, n_per_row, NULL);
            CHECK(!memcmp(mine + row_bytes, theirs + row_bytes, nbytes - row_bytes), "%s chunk from row 1", q->name);
        }
    }
    CHECK_OK(kiln_q_dequantize(q->type, mine, back, n));
    if (kind != K_HUGE && kind != K_TINY) { /* f16 scales hold neither */
        for (int64_t b0 = 0; b0 < n; b0 += q->block > 32 ? q->block : 32) {
            int64_t bl = q->block > 32 ? q->block : 32;
            double amax = 0, emax = 0;
            for (int64_t i = b0; i < b0 + bl; i++) {
                amax = fmax(amax, fabs(x[i]));
                emax = fmax(emax, fabs((double)back[i] - x[i]));
                st->sum_sq += ((double)back[i] - x[i]) * ((double)back[i] - x[i]);
                st->sum_ref += (double)x[i] * x[i];
            }
            if (amax > 0) st->max_rel = fmax(st->max_rel, emax / amax);
            else CHECK(emax == 0, "%s: zeros came back as %g", q->name, emax);
        }
    }
    st->rows += nrows;
    free(x), free(back), free(mine), free(theirs);
}

static void check_quant(const kiln_qtype_info *q) {
    static const int64_t rows[] = {1, 3, 7, 2};
    static const int64_t lens32[] = {32, 96, 256, 4096}, lens256[] = {256, 768, 2048, 4096};
    const int64_t *lens = q->block == 256 ? lens256 : lens32;
    qstats st = {0};
    int cases = 0;
    for (int kind = 0; kind < N_KINDS; kind++)
        for (int li = 0; li < 4; li++)
            for (int ri = 0; ri < 4; ri++) {
                int64_t nr = rows[ri] + (kind % 3 == 0 && li == 1 ? 10 : 0);
                check_quant_case(q, kind, nr, lens[li], &st), cases++;
            }
    /* the bound the round trip must keep, of a block's largest magnitude */
    double bound = q->type == KILN_QT_Q8_0 ? 0.006
                   : q->type == KILN_QT_Q4_0 ? 0.13
                   : q->type == KILN_QT_Q4_1 ? 0.07
                   : q->type == KILN_QT_Q5_0 ? 0.07
                   : q->type == KILN_QT_Q5_1 ? 0.04
                   : q->type == KILN_QT_Q4_K ? 0.2
                   : q->type == KILN_QT_Q5_K ? 0.1
                   : q->type == KILN_QT_Q6_K ? 0.05
                   : q->type == KILN_QT_F32 ? 0
                                            : 0.004;
    CHECK(st.max_rel <= bound, "%s: round trip error %.3g of the block's largest value (bound %.3g)", q->name,
          st.max_rel, bound);
    if (have_ref)
        CHECK(st.rows_bad == 0, "%s: %lld of %lld rows (%lld bytes) differ from ggml_quantize_chunk", q->name,
              (long long)st.rows_bad, (long long)st.rows, (long long)st.bytes_bad);
    printf("  quantize   %-5s %3d cases, %4lld rows: %s; round trip max err %.4f of block max, rms rel %.5f\n", q->name,
           cases, (long long)st.rows,
           !have_ref ? "no reference" : st.rows_bad ? "DIFFERS from ggml" : "byte-exact with ggml_quantize_chunk",
           st.max_rel, sqrt(st.sum_sq / (st.sum_ref > 0 ? st.sum_ref : 1)));
}

int main(void) {
    char why[1500];
    have_ref = ggml_ref_load(&G, why, sizeof why);
    if (have_ref && !ggml_ref_traits(&G, 0, why, sizeof why)) have_ref = false;
    if (!have_ref) printf("test_quant: no ggml reference (%s): internal checks only\n", why);
    check_table();
    for (int i = 0; i < kiln_qtype_count(); i++) {
        const kiln_qtype_info *q = kiln_qtype_at(i);
        const struct ggml_type_traits_ref *tr = have_ref ? ggml_ref_traits(&G, (int)q->type, why, sizeof why) : NULL;
        CHECK(!have_ref || (tr && (tr->to_float || q->type == KILN_QT_F32)), "%s: ggml has no to_float", q->name);
        check_dequant(q, tr && tr->to_float ? tr : NULL); /* f32 has none: a copy */
        check_quant(q);
    }
    TEST_END();
}
