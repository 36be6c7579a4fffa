/* Run settings: the checked number parser (every refusal in one format),
 * train_config.json read with the same checks as the flags, the file named
 * in its errors, and written files read back. */
#include <stdlib.h>
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

int main(void) {
    parser();
    seed();
    TEST_END();
}
