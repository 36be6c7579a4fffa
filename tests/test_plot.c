/* The SVG plot of metrics.jsonl (src/cli/plot.c, compiled in here because
 * the CLI is not part of libkiln). */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "../src/cli/plot.c"
#include "test.h"

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *path) {
    char *s = NULL;
    size_t n = 0;
    if (kiln_read_file(path, &s, &n)) return NULL;
    return s;
}

static int count(const char *s, const char *needle) {
    int k = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++) k++;
    return k;
}

static const char *good =
    "{\"step\":1,\"loss\":9.1,\"lr\":1e-5,\"grad_norm\":3.2,\"tokens_per_s\":1200}\n"
    "{\"step\":2,\"loss\":8.4,\"lr\":2e-5,\"grad_norm\":2.9,\"tokens_per_s\":1250}\n"
    "\n"
    "{\"step\":3,\"loss\":7.7,\"lr\":3e-5,\"grad_norm\":2.1,\"tokens_per_s\":1240}\n"
    "{\"step\":3,\"val_loss\":7.9}\n"
    "{\"step\":4,\"loss\":7.0,\"lr\":3e-5,\"grad_norm\":1.5,\"tokens_per_s\":1260}\n"
    "{\"step\":5,\"loss\":6.6,\"lr\":2e-5,\"grad_norm\":1.2,\"tokens_per_s\":1255}\n"
    "{\"step\":5,\"val_loss\":6.9}\n"
    "{\"step\":6,\"loss\":6.1,\"lr\":1e-5,\"grad_norm\":1.1,\"tokens_per_s\":1256}\n"
    "{\"step\":6,\"loss\":null,\"lr\":1e-5}\n" /* a logged NaN: skipped */
    "{\"step\":7,\"loss\":6.0,\"lr\":0,\"grad_norm\":1.0,\"tokens_per_s\":1258}\n"
    "{\"step\":7,\"loss\":6.0,\"lr\":0,\"grad_no"; /* an unfinished last write: ignored */

int main(void) {
    char dir[] = "/tmp/kiln_test_plot_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char run_a[300], run_b[300], path[400], out[400];
    snprintf(run_a, sizeof run_a, "%s/fp32", dir);
    snprintf(run_b, sizeof run_b, "%s/bf16", dir);
    mkdir(run_a, 0755);
    mkdir(run_b, 0755);

    /* one run, default output */
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_a);
    write_text(path, good);
    CHECK_OK((kiln_status)kiln_cli_write_plot(run_a, NULL));
    snprintf(out, sizeof out, "%s/loss.svg", run_a);
    char *svg = read_text(out);
    CHECK(svg != NULL, "no %s", out);
    if (svg) {
        CHECK(!strncmp(svg, "<svg", 4), "does not start with <svg: %.20s", svg);
        CHECK(strstr(svg, "</svg>") != NULL, "unterminated svg");
        CHECK(count(svg, "<polyline class=\"train\"") == 1, "training loss polyline");
        CHECK(count(svg, "<polyline class=\"val\"") == 1, "validation loss polyline");
        CHECK(count(svg, "<polyline class=\"lr\"") == 1, "lr polyline");
        CHECK(strstr(svg, "validation loss") && strstr(svg, "training loss"), "legend");
        CHECK(strstr(svg, "learning rate") != NULL, "lr panel title");
        /* 7 training points (the null and the cut-off line are not drawn) */
        const char *pl = strstr(svg, "<polyline class=\"train\"");
        const char *pts = pl ? strstr(pl, "points=\"") : NULL;
        int commas = 0;
        for (const char *p = pts ? pts + 8 : ""; *p && *p != '"'; p++) commas += *p == ',';
        CHECK(commas == 7, "training polyline has %d points", commas);
    }
    free(svg);

    /* two runs overlaid, run names in the legend */
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_b);
    write_text(path, "{\"step\":1,\"loss\":9.0,\"lr\":1e-5}\n{\"step\":2,\"loss\":8.0,\"lr\":2e-5}\n"
                     "{\"step\":2,\"val_loss\":8.2}\n");
    const char *both[2] = {run_a, run_b};
    snprintf(out, sizeof out, "%s/cmp.svg", dir);
    CHECK_OK(kiln_plot_runs(both, 2, out));
    svg = read_text(out);
    CHECK(svg != NULL, "no %s", out);
    if (svg) {
        CHECK(count(svg, "<polyline class=\"train\"") == 2, "two training curves");
        CHECK(count(svg, "<polyline class=\"val\"") == 2, "two validation curves");
        CHECK(strstr(svg, "fp32 training loss") && strstr(svg, "bf16 validation loss"), "run names in the legend");
        CHECK(strstr(svg, "reward accuracy") == NULL, "no accuracy panel without accuracies");
    }
    free(svg);

    /* a preference run: a third panel with the reward accuracies; a plain
     * run has none */
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_b);
    write_text(path, "{\"step\":1,\"loss\":0.69,\"lr\":1e-5,\"rewards/accuracies\":0.5}\n"
                     "{\"step\":2,\"loss\":0.5,\"lr\":2e-5,\"rewards/accuracies\":0.75}\n"
                     "{\"step\":2,\"val_loss\":0.4,\"val_rewards/accuracies\":1}\n");
    CHECK_OK((kiln_status)kiln_cli_write_plot(run_b, NULL));
    snprintf(out, sizeof out, "%s/loss.svg", run_b);
    char *ps = read_text(out);
    CHECK(ps && strstr(ps, "reward accuracy") && strstr(ps, "val rewards/accuracies") && count(ps, "<polyline class=\"train\"") == 2,
          "the preference run's plot has the accuracy panel");
    free(ps);

    /* a malformed line names the file and the line */
    write_text(path, "{\"step\":1,\"loss\":9.0}\n{\"step\":2,\"loss\":8.0}\n{\"step\":3,\"loss\":7.0,}\n"
                     "{\"step\":4,\"loss\":6.0}\n");
    kiln_status st = (kiln_status)kiln_cli_write_plot(run_b, NULL);
    CHECK(st == KILN_ERR_FORMAT, "malformed line: status %d", (int)st);
    CHECK(strstr(kiln_last_error(), "bf16/metrics.jsonl:3") != NULL, "error does not name file:line: %s", kiln_last_error());
    write_text(path, "{\"step\":1,\"loss\":\"high\"}\n");
    CHECK(kiln_cli_write_plot(run_b, NULL) != 0 && strstr(kiln_last_error(), "metrics.jsonl:1: \"loss\""),
          "wrong type: %s", kiln_last_error());
    write_text(path, "");
    CHECK(kiln_cli_write_plot(run_b, NULL) != 0 && strstr(kiln_last_error(), "no loss values"), "empty: %s",
          kiln_last_error());
    snprintf(path, sizeof path, "%s/missing", dir);
    CHECK(kiln_cli_write_plot(path, NULL) != 0 && strstr(kiln_last_error(), "missing/metrics.jsonl"), "missing: %s",
          kiln_last_error());

    /* clean up */
    const char *files[] = {"fp32/metrics.jsonl", "fp32/loss.svg", "bf16/metrics.jsonl", "cmp.svg", "fp32", "bf16"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        remove(path);
    }
    rmdir(dir);
    TEST_END();
}
