/* Run settings: the checked number parser (every refusal in one format),
 * train_config.json read with the same checks as the flags, the file named
 * in its errors, and written files read back. */
#include <stdlib.h>
#include <string.h>
#include "kiln/train.h"
#include "test.h"

static void parser(void) {
    int64_t i = 0;
    CHECK_OK(kiln_parse_i64("42", 0, 100, &i));
    CHECK(i == 42, "42");
    CHECK_OK(kiln_parse_i64("-7", -10, 10, &i));
    CHECK(i == -7, "-7");
    const char *bad_int[] = {"", " 1", "1 ", "abc", "12x", "0x10", "1e3", "99999999999999999999", "101"};
    for (int k = 0; k < 9; k++) {
        i = 5;
        CHECK(kiln_parse_i64(bad_int[k], 0, 100, &i) == KILN_ERR_INVALID && i == 5, "'%s' refused", bad_int[k]);
    }
    kiln_parse_i64("abc", 1, 4096, &i);
    CHECK(!strcmp(kiln_last_error(), "bad value 'abc' (expected an integer in [1, 4096])"), "message: %s", kiln_last_error());
    kiln_parse_i64("-1", 0, INT64_MAX, &i);
    CHECK(!strcmp(kiln_last_error(), "bad value '-1' (expected a non-negative integer)"), "message: %s", kiln_last_error());
    uint64_t u = 0;
    CHECK_OK(kiln_parse_u64("18446744073709551615", &u));
    CHECK(u == UINT64_MAX, "2^64-1");
    const char *bad_u[] = {"-1", "abc", "", "+1", " 1", "18446744073709551616", "1.5"};
    for (int k = 0; k < 7; k++) CHECK(kiln_parse_u64(bad_u[k], &u) == KILN_ERR_INVALID, "u64 '%s' refused", bad_u[k]);
    double d = 0;
    CHECK_OK(kiln_parse_f64("3e-4", -1e300, 1e300, &d));
    CHECK(d == 3e-4, "3e-4");
    CHECK_OK(kiln_parse_f64("1e-320", 0, 1, &d)); /* underflow to a denormal is still a number */
    const char *bad_f[] = {"", "nan", "inf", "1e999", "1.5x", "abc", " 2"};
    for (int k = 0; k < 7; k++) CHECK(kiln_parse_f64(bad_f[k], -1e300, 1e300, &d) == KILN_ERR_INVALID, "f64 '%s' refused", bad_f[k]);
    int64_t b = 0;
    CHECK_OK(kiln_parse_bytes("1.5GiB", &b));
    CHECK(b == 3LL << 29, "1.5GiB");
    CHECK_OK(kiln_parse_bytes("800MB", &b));
    CHECK(b == 800LL << 20, "800MB");
    const char *bad_b[] = {"lots", "-1G", "0", "1Q", "1GX", "", "1e30"};
    for (int k = 0; k < 7; k++) CHECK(kiln_parse_bytes(bad_b[k], &b) == KILN_ERR_INVALID, "size '%s' refused", bad_b[k]);
    CHECK(kiln_parse_leading_i64("123 kB", 0, INT64_MAX, &i) == KILN_OK && i == 123, "leading digits");
    CHECK(kiln_parse_leading_i64("4242.x", 1, 100, &i) == KILN_ERR_INVALID, "leading digits out of range");
    CHECK(kiln_parse_leading_i64(" 5", 0, 9, &i) == KILN_ERR_INVALID && kiln_parse_leading_i64("-5", -9, 9, &i) == KILN_ERR_INVALID,
          "leading digits: digits first");
    CHECK(kiln_parse_leading_i64("123456789012345678901234", 0, INT64_MAX, &i) == KILN_ERR_INVALID, "too many digits");
    /* Hugging Face's shard sizes: decimal units, and the binary ones spelled out */
    CHECK(kiln_parse_bytes_hf("5GB", &b) == KILN_OK && b == 5000000000LL, "5GB");
    CHECK(kiln_parse_bytes_hf("2GiB", &b) == KILN_OK && b == 2LL << 30, "2GiB");
    CHECK(kiln_parse_bytes_hf("1.5MB", &b) == KILN_OK && b == 1500000, "1.5MB");
    CHECK(kiln_parse_bytes_hf("40000", &b) == KILN_OK && b == 40000, "bytes");
    const char *bad_hf[] = {"", "5XB", "-1GB", "GB", "0", "5 GB", "1e30GB"};
    for (int k = 0; k < 7; k++) CHECK(kiln_parse_bytes_hf(bad_hf[k], &b) == KILN_ERR_INVALID, "shard size '%s' refused", bad_hf[k]);
    char t[32];
    CHECK(!strcmp(kiln_bytes_text(1LL << 30, t, sizeof t), "1G") && !strcmp(kiln_bytes_text(1536LL << 20, t, sizeof t), "1536M") &&
              !strcmp(kiln_bytes_text(1000, t, sizeof t), "1000"),
          "sizes written back exactly");
}

/* seed from train_config.json: the same checks as --seed */
static void seed(void) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    CHECK_OK(kiln_train_config_parse("{\"seed\": \"18446744073709551615\"}", "a.json", &c));
    CHECK(c.seed == UINT64_MAX, "seed 2^64-1 from a string");
    CHECK_OK(kiln_train_config_parse("{\"seed\": 7}", "a.json", &c));
    CHECK(c.seed == 7, "seed 7");
    const char *bad[] = {"\"abc\"", "\"-1\"", "-1", "\"\"", "1.5", "\"12abc\""};
    for (int k = 0; k < 6; k++) {
        char js[64];
        snprintf(js, sizeof js, "{\"seed\": %s}", bad[k]);
        c.seed = 99;
        CHECK(kiln_train_config_parse(js, "a.json", &c) == KILN_ERR_INVALID && c.seed == 99 &&
                  strstr(kiln_last_error(), "a.json") && strstr(kiln_last_error(), "seed"),
              "seed %s refused naming the file: %s", bad[k], kiln_last_error());
    }
}

/* All settings as text: the flag path and the JSON path store the same. */
static bool same(const kiln_train_config *a, const kiln_train_config *b, const char **key) {
    for (int i = 0; i < kiln_train_n_settings; i++) {
        char x[600], y[600];
        const kiln_setting *s = &kiln_train_settings[i];
        if (s->kind == KILN_SETTING_F64 ? *(const double *)((const char *)a + s->offset) != *(const double *)((const char *)b + s->offset)
                                        : strcmp(kiln_setting_format(s, a, x, sizeof x), kiln_setting_format(s, b, y, sizeof y))) {
            *key = s->key;
            return false;
        }
    }
    return true;
}

static void table(void) {
    kiln_train_config d, c;
    kiln_train_config_default(&d);
    CHECK_OK(kiln_train_config_validate(&d));
    const char *k = "";
    /* written and read back */
    char *js = kiln_train_config_to_json(&d);
    CHECK(js != NULL, "to_json");
    kiln_train_config_default(&c);
    c.batch = 99, c.lr = 5, c.compile = KILN_RUN_STRICT, c.seed = 1;
    CHECK_OK(kiln_train_config_parse(js, "written.json", &c));
    CHECK(same(&c, &d, &k), "round trip of the defaults differs at %s", k);
    free(js);
    /* every setting's default, given as a flag's text, reads back as itself */
    for (int i = 0; i < kiln_train_n_settings; i++) {
        const kiln_setting *s = &kiln_train_settings[i];
        char text[600];
        kiln_setting_format(s, &d, text, sizeof text);
        kiln_train_config_default(&c);
        CHECK(kiln_setting_parse(s, text, &c) == KILN_OK && same(&c, &d, &k), "%s '%s' as text", s->key, text);
        CHECK(kiln_setting_find(s->key) == s, "find %s", s->key);
    }
    /* a non-default of every kind, through JSON, and back out */
    kiln_train_config_default(&c);
    CHECK_OK(kiln_train_config_parse("{\"compile\": \"none\", \"precision\": \"bfloat16\", \"recompute\": \"layer\", "
                                     "\"pack\": \"padded\", \"shuffle\": false, \"mem_budget\": \"1.5G\", \"global_batch\": 6, "
                                     "\"micro_batch\": \"3\", \"seed\": \"9\", \"lr\": 0.25, \"warmup\": 7, \"freeze\": \"x.*\"}",
                                     "a.json", &c));
    CHECK(c.compile == KILN_RUN_EAGER && c.precision == KILN_BF16 && c.recompute == KILN_RECOMPUTE_LAYER &&
              c.pack == KILN_PACK_PADDED && !c.shuffle && c.mem_budget == 3LL << 29 && c.global_batch == 6 && c.micro_batch == 3 &&
              c.seed == 9 && c.lr == 0.25 && c.warmup == 7 && !strcmp(c.freeze, "x.*"),
          "typed fields from JSON");
    js = kiln_train_config_to_json(&c);
    CHECK(js && strstr(js, "\"compile\": \"off\"") && strstr(js, "\"precision\": \"bf16\"") &&
              strstr(js, "\"mem_budget\": \"1536M\"") && strstr(js, "\"micro_batch\": \"3\""),
          "canonical names written: %s", js ? js : "");
    kiln_train_config back;
    kiln_train_config_default(&back);
    CHECK(js && kiln_train_config_parse(js, "b.json", &back) == KILN_OK && same(&back, &c, &k), "non-defaults round trip (%s)", k);
    free(js);
    /* a train_config.json as kiln wrote it before the settings table (every
     * key; enums, sizes and micro_batch as strings; the seed as a string) */
    const char *old =
        "{\"data\": \"d\", \"run_dir\": \"r\", \"model\": \"tiny\", \"tokenizer\": \"t.json\", \"init\": \"\", \"freeze\": \"\", "
        "\"batch\": 2, \"accum\": 3, \"seq_len\": 32, \"pack\": \"packed\", \"shuffle\": true, \"loss_norm\": \"steps\", "
        "\"lr\": 0.002, \"min_lr\": 0.0001, \"beta1\": 0.8, \"beta2\": 0.95, \"eps\": 1e-08, \"weight_decay\": 0.1, "
        "\"clip\": 1.0, \"decay_embeddings\": false, \"warmup\": 20, \"steps\": 10, \"epochs\": 1, \"eval_every\": 50, "
        "\"eval_batches\": 20, \"save_every\": 100, \"log_every\": 10, \"keep\": 3, \"on_nan\": \"stop\", "
        "\"seed\": \"1234\", \"compile\": \"interpret\", \"precision\": \"fp32\", \"recompute\": \"none\", "
        "\"compile_dynamic\": false, \"global_batch\": 0, \"micro_batch\": \"\", \"mem_budget\": \"\"}";
    kiln_train_config_default(&c);
    CHECK_OK(kiln_train_config_parse(old, "old/train_config.json", &c));
    CHECK(c.batch == 2 && c.loss_norm == KILN_LOSS_NORM_STEPS && c.on_nan == KILN_ON_NAN_STOP && c.compile == KILN_RUN_INTERPRET &&
              c.micro_batch == 0 && c.mem_budget == 0 && c.beta1 == 0.8 && c.seed == 1234 && c.steps == 10,
          "a train_config.json written before the table loads");
    CHECK_OK(kiln_train_config_validate(&c));
}

/* out-of-range values in a settings file are refused naming the file and the
 * key, whatever the kind */
static void ranges(void) {
    const char *bad[][2] = {
        {"batch", "0"},        {"seq_len", "1"},          {"epochs", "0"},        {"keep", "-1"},
        {"lr", "0"},           {"lr", "-1e-3"},           {"beta1", "1"},         {"eps", "0"},
        {"clip", "-1"},        {"warmup", "-5"},          {"global_batch", "-2"}, {"batch", "5000000000"},
        {"batch", "2.5"},      {"batch", "\"8x\""},       {"pack", "\"zip\""},    {"precision", "\"fp16\""},
        {"mem_budget", "\"lots\""}, {"micro_batch", "\"0\""}, {"micro_batch", "0"},  {"shuffle", "1"},
        {"data", "5"},         {"compile", "\"bogus\""},  {"lr", "\"nan\""},         {"steps", "null"},
    };
    int n = (int)(sizeof bad / sizeof bad[0]);
    for (int i = 0; i < n; i++) {
        kiln_train_config c;
        kiln_train_config_default(&c);
        char js[128], want[64];
        snprintf(js, sizeof js, "{\"%s\": %s}", bad[i][0], bad[i][1]);
        snprintf(want, sizeof want, "cfg.json: %s: bad value", bad[i][0]);
        kiln_status st = kiln_train_config_parse(js, "cfg.json", &c);
        CHECK(st != KILN_OK && !strncmp(kiln_last_error(), want, strlen(want)), "%s refused naming the file: %s", js,
              kiln_last_error());
    }
    /* set directly (a library caller): validation applies the same ranges */
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.beta2 = 1.5;
    CHECK(kiln_train_config_validate(&c) && !strcmp(kiln_last_error(), "beta2: bad value '1.5' (expected a number in [0, 1))"),
          "validate: %s", kiln_last_error());
    kiln_train_config_default(&c);
    c.compile = 77;
    CHECK(kiln_train_config_validate(&c) && strstr(kiln_last_error(), "compile: bad value"), "validate enum: %s", kiln_last_error());
    kiln_train_config_default(&c);
    c.min_lr = 1;
    CHECK(kiln_train_config_validate(&c) && strstr(kiln_last_error(), "min_lr"), "min_lr <= lr: %s", kiln_last_error());
    kiln_train_config_default(&c);
    c.recompute = KILN_RECOMPUTE_LAYER;
    CHECK(kiln_train_config_validate(&c) && strstr(kiln_last_error(), "needs --compile"), "recompute needs compile: %s",
          kiln_last_error());
}

/* One vocabulary (issue 22 item 19): every compile mode of KILN_COMPILE_MODES
 * is a --compile choice with its index as value, parses to the same options
 * through kiln_compile_mode_parse and through the run settings, and the help
 * names it; the recompute settings likewise. */
static void vocabulary(void) {
    const kiln_setting *sc = kiln_setting_find("compile"), *sr = kiln_setting_find("recompute");
    int n = 0;
    for (int i = 0; kiln_compile_modes[i].name; i++, n++) {
        const char *name = kiln_compile_modes[i].name;
        int v = -1;
        CHECK(kiln_parse_choice(name, sc->choices, &v) == KILN_OK && v == i, "--compile %s is choice %d (got %d)", name, i, v);
        kiln_compile_options a, b;
        kiln_compile_options_default(&a);
        kiln_compile_options_default(&b);
        CHECK_OK(kiln_compile_mode_parse(name, &a));
        kiln_train_config c;
        kiln_train_config_default(&c);
        c.compile = i;
        CHECK_OK(kiln_train_compile_options(&c, &b));
        CHECK(a.mode == b.mode && a.interpret == b.interpret && a.strict == b.strict, "mode %s: parse and settings agree", name);
        CHECK(strstr(sc->help, name) != NULL, "the --compile help names %s", name);
    }
    CHECK(n == KILN_RUN_N_MODES && n == 6, "%d compile modes", n);
    kiln_compile_options o;
    kiln_compile_options_default(&o);
    CHECK(kiln_compile_mode_parse("eager", &o) == KILN_OK && o.mode == KILN_COMPILE_OFF, "alias eager = off");
    CHECK(kiln_compile_mode_parse("fast", &o) != KILN_OK && strstr(kiln_last_error(), "reduce-overhead"),
          "an unknown mode lists the modes: %s", kiln_last_error());
    const char *rn[] = {"none", "attention", "layer", "pointwise"};
    for (int i = 0; i < 4; i++) {
        int v = -1;
        CHECK(kiln_parse_choice(rn[i], sr->choices, &v) == KILN_OK && v == i, "--recompute %s", rn[i]);
        CHECK(kiln_recompute_parse(rn[i], &o) == KILN_OK && o.recompute == i, "recompute_parse %s", rn[i]);
    }
    CHECK(kiln_recompute_parse("all", &o) != KILN_OK && strstr(kiln_last_error(), "attention"), "unknown recompute: %s",
          kiln_last_error());
}

int main(void) {
    vocabulary();
    parser();
    seed();
    table();
    ranges();
    TEST_END();
}
