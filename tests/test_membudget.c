/* Memory-aware micro-batch choice: size parsing, the plan estimate (its
 * arena is the compiled plan's, it grows with b, bf16 changes the graph),
 * the choice (largest fitting divisor, the note when N has none close, a
 * budget below one sequence names the smallest that works, eager refuses
 * auto), settings validation, and the trainer applying the choice. */
#include <stdlib.h>
#include <unistd.h>
#include "kiln/eager.h"
#include "kiln/train.h"
#include "test.h"
#include "test_models.h"


static void parse_sizes(void) {
    struct { const char *s; int64_t v; } ok[] = {
        {"512M", 512LL << 20}, {"1G", 1LL << 30}, {"1.5G", 3LL << 29}, {"800MB", 800LL << 20},
        {"1GiB", 1LL << 30},   {"4096", 4096},    {"2k", 2048},         {"1T", 1LL << 40},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int64_t v = -1;
        CHECK(kiln_parse_bytes(ok[i].s, &v) == KILN_OK && v == ok[i].v, "'%s' -> %lld", ok[i].s, (long long)v);
    }
    const char *bad[] = {"", "abc", "1X", "-1", "0", "1GB!", "nan", "1e30G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v;
        CHECK(kiln_parse_bytes(bad[i], &v) != KILN_OK && strstr(kiln_last_error(), "memory size"), "'%s' refused: %s",
              bad[i], kiln_last_error());
    }
    CHECK(kiln_mem_available() > 0, "MemAvailable readable");
}

static void estimate(kiln_llama *m) {
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    kiln_mem_estimate e1, e2, e4;
    CHECK_OK(kiln_train_plan_bytes(m, 1, 32, &co, &e1));
    CHECK_OK(kiln_train_plan_bytes(m, 2, 32, &co, &e2));
    CHECK_OK(kiln_train_plan_bytes(m, 4, 32, &co, &e4));
    int64_t np = kiln_llama_num_params(m) * 4;
    CHECK(e1.params == np && e1.grads == np && e1.optim == 2 * np, "parameters, gradients, moments");
    CHECK(e1.arena_train > e1.arena_eval && e1.arena_eval > 0, "training arena above eval arena");
    CHECK(e1.total < e2.total && e2.total < e4.total, "grows with b: %lld %lld %lld", (long long)e1.total,
          (long long)e2.total, (long long)e4.total);
    CHECK(e1.total == e1.arena_train + e1.arena_eval + e1.params + e1.grads + e1.optim + e1.batches + e1.scratch + e1.overhead,
          "total is the sum of its parts");
    /* the estimate's arena is the one the compiled step allocates */
    co.interpret = true;
    kiln_compiled *cs = kiln_train_compile(m, &co, true);
    kiln_batch *b = kiln_batch_alloc(2, 32);
    for (int i = 0; i < 64; i++) b->input_ids[i] = 3 + i % 50, b->targets[i] = 4 + i % 50, b->pad_mask[i] = 1;
    kiln_tensor *in[4];
    test_step_inputs(b, 1.0f / 64, in);
    float rep[1];
    CHECK_OK(kiln_compiled_run(cs, in, rep));
    CHECK(kiln_compiled_stats(cs).arena_bytes == e2.arena_train, "estimate arena %lld == compiled arena %lld",
          (long long)e2.arena_train, (long long)kiln_compiled_stats(cs).arena_bytes);
    test_release_inputs(in);
    kiln_batch_free(b);
    kiln_compiled_free(cs);
    co.interpret = false;
    /* bf16: casts before the products and the fused head's bf16 form: a different plan */
    kiln_dtype old = kiln_autocast_set(KILN_BF16);
    kiln_mem_estimate h;
    CHECK_OK(kiln_train_plan_bytes(m, 2, 32, &co, &h));
    kiln_autocast_set(old);
    CHECK(h.scratch > 0 && e2.scratch == 0, "bf16 counts operand scratch (%lld)", (long long)h.scratch);
    CHECK(h.arena_train != e2.arena_train, "bf16 changes the plan");
}

static void choose(kiln_llama *m) {
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    kiln_mem_estimate e1, e3, e4;
    CHECK_OK(kiln_train_plan_bytes(m, 1, 32, &co, &e1));
    CHECK_OK(kiln_train_plan_bytes(m, 3, 32, &co, &e3));
    CHECK_OK(kiln_train_plan_bytes(m, 4, 32, &co, &e4));
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.seq_len = 32;
    c.compile = KILN_RUN_COMPILE_DEFAULT;
    c.micro_batch = KILN_MICRO_BATCH_AUTO;
    c.mem_budget = e3.total; /* b = 3 fits, 4 does not */
    kiln_mem_choice ch;
    c.global_batch = 12;
    CHECK_OK(kiln_train_choose_batch(&c, m, &ch));
    CHECK(ch.micro_batch == 3 && ch.accum == 4 && ch.largest_fit == 3 && !ch.note[0], "12 -> 3 x 4 (got %d x %d, fit %d)",
          ch.micro_batch, ch.accum, ch.largest_fit);
    CHECK(ch.est.total == e3.total && ch.est.total <= ch.budget, "predicted peak of the choice");
    c.global_batch = 10; /* largest fit 3 does not divide 10: 2 x 5, with a note */
    CHECK_OK(kiln_train_choose_batch(&c, m, &ch));
    CHECK(ch.micro_batch == 2 && ch.accum == 5 && ch.largest_fit == 3 && ch.note[0], "10 -> 2 x 5 (got %d x %d): %s",
          ch.micro_batch, ch.accum, ch.note);
    c.global_batch = 2; /* N caps b */
    CHECK_OK(kiln_train_choose_batch(&c, m, &ch));
    CHECK(ch.micro_batch == 2 && ch.accum == 1, "2 -> 2 x 1");
    c.mem_budget = e1.total - 1;
    CHECK(kiln_train_choose_batch(&c, m, &ch) == KILN_ERR_LIMIT && strstr(kiln_last_error(), "smallest budget"),
          "too small: %s", kiln_last_error());
    char want[64];
    snprintf(want, sizeof want, "--mem-budget %lldM", (long long)((e1.total + (1 << 20) - 1) >> 20));
    CHECK(strstr(kiln_last_error(), want) != NULL, "names the budget that works (%s)", want);
    c.mem_budget = e1.total;
    CHECK_OK(kiln_train_choose_batch(&c, m, &ch));
    CHECK(ch.micro_batch == 1 && ch.accum == 2, "exactly one sequence's budget fits b = 1");
    c.mem_budget = 0; /* default: 70% of MemAvailable */
    CHECK_OK(kiln_train_choose_batch(&c, m, &ch));
    CHECK(ch.budget_default && ch.budget > 0 && ch.micro_batch == 2, "default budget");
    c.compile = KILN_RUN_EAGER;
    CHECK(kiln_train_choose_batch(&c, m, &ch) == KILN_ERR_INVALID && strstr(kiln_last_error(), "--compile"),
          "eager refuses auto: %s", kiln_last_error());
    c.micro_batch = 2;
    CHECK_OK(kiln_train_choose_batch(&c, m, &ch));
    CHECK(ch.micro_batch == 2 && ch.accum == 1, "a fixed micro-batch works eager");
    /* settings validation */
    kiln_train_config_default(&c);
    CHECK_OK(kiln_train_config_validate(&c));
    const char *bad[][3] = {{"precision", "fp16", "precision"}, {"micro_batch", "auto", "global_batch"},
                            {"micro_batch", "x", "micro_batch"}, {"mem_budget", "lots", "memory size"}};
    for (int i = 0; i < 4; i++) {
        kiln_train_config_default(&c);
        char json[128];
        snprintf(json, sizeof json, "{\"%s\": \"%s\"}", bad[i][0], bad[i][1]);
        /* enums and sizes are parsed when read, the rules between settings at validation */
        CHECK((kiln_train_config_parse(json, "t", &c) || kiln_train_config_validate(&c)) && strstr(kiln_last_error(), bad[i][2]),
              "%s refused: %s", json, kiln_last_error());
    }
    kiln_train_config_default(&c);
    CHECK_OK(kiln_train_config_parse("{\"global_batch\": 6, \"micro_batch\": \"4\"}", "t", &c));
    CHECK(kiln_train_config_validate(&c) && strstr(kiln_last_error(), "multiple"), "6 is not a multiple of 4: %s",
          kiln_last_error());
    CHECK_OK(kiln_train_config_parse("{\"precision\": \"bf16\", \"global_batch\": 8, \"micro_batch\": \"auto\", "
                                     "\"mem_budget\": \"1G\"}", "t", &c));
    char *js = kiln_train_config_to_json(&c);
    CHECK(js && strstr(js, "\"precision\": \"bf16\"") && strstr(js, "\"mem_budget\": \"1G\""), "saved in train_config.json");
    free(js);
}

/* The trainer applies the choice: batch and accum from global_batch. */
static void trainer(const char *dir, kiln_llama *m) {
    kiln_shard_info info = {.vocab_size = 61, .eos_id = 1, .pad_id = 2, .bos_id = 0xffffffffu, .n_docs = 1};
    int32_t tok[3000];
    for (int i = 0; i < 3000; i++) tok[i] = 3 + (int32_t)(kiln_rng_u64(9, (uint64_t)i) % 58);
    char p[600];
    snprintf(p, sizeof p, "%s/train.bin", dir);
    CHECK_OK(kiln_shard_write(p, tok, 3000, &info));
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    kiln_mem_estimate e2;
    /* under the precision the trainer runs (bf16 where it is emulated holds
     * rounded operands in fp32: more than the fp32 plan); the preset "tiny"
     * differs: only for the budget's scale */
    kiln_dtype old_prec = kiln_autocast_set(KILN_BF16);
    CHECK_OK(kiln_train_plan_bytes(m, 2, 32, &co, &e2));
    kiln_autocast_set(old_prec);
    kiln_train_config c;
    kiln_train_config_default(&c);
    snprintf(c.data, sizeof c.data, "%s", dir);
    snprintf(c.run_dir, sizeof c.run_dir, "%s/run", dir);
    snprintf(c.model, sizeof c.model, "%s/model.json", dir);
    char *mj = kiln_llama_config_to_json(&m->cfg);
    snprintf(p, sizeof p, "%s/model.json", dir);
    CHECK_OK(kiln_write_file_atomic(p, mj, strlen(mj)));
    free(mj);
    c.compile = KILN_RUN_INTERPRET;
    c.precision = KILN_BF16;
    c.mem_budget = e2.total + 1000;
    c.seq_len = 32, c.global_batch = 6, c.steps = 2, c.eval_every = 0, c.save_every = 0, c.warmup = 1;
    kiln_trainer *t = NULL;
    CHECK_OK(kiln_trainer_open(&c, false, &t));
    if (!t) return;
    const kiln_mem_choice *ch = kiln_trainer_mem_choice(t);
    CHECK(ch && kiln_trainer_config(t)->batch == ch->micro_batch && kiln_trainer_config(t)->accum == ch->accum &&
              ch->micro_batch * ch->accum == 6,
          "trainer uses the choice (%d x %d)", ch ? ch->micro_batch : 0, ch ? ch->accum : 0);
    CHECK_OK(kiln_trainer_run(t, NULL, NULL));
    CHECK(kiln_trainer_get_state(t)->step == 2 && isfinite(kiln_trainer_get_state(t)->last_loss), "bf16 run trains");
    CHECK(kiln_autocast_get() == KILN_F32, "the run restores autocast");
    kiln_trainer_free(t);
    c.mem_budget = 1024;
    snprintf(c.run_dir, sizeof c.run_dir, "%s/run2", dir);
    CHECK(kiln_trainer_open(&c, false, &t) == KILN_ERR_LIMIT && !t, "a too-small budget fails before training: %s",
          kiln_last_error());
    CHECK(access(c.run_dir, F_OK) != 0, "nothing written");
}

int main(void) {
    char dir[64];
    if (!t_tmpdir(dir, sizeof dir, "test_membudget")) return 1;
    char cache[600];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("KILN_CACHE_DIR", cache, 1);
    kiln_eager_enable();
    kiln_llama_config mc = test_tiny_config();
    kiln_llama *m = kiln_llama_new(&mc, 5);
    parse_sizes();
    estimate(m);
    choose(m);
    trainer(dir, m);
    kiln_llama_free(m);
    CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
