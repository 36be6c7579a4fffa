/* `kiln plot RUN_DIR [RUN_DIR...] [-o FILE]` */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "plot.h"

static const char *plot_usage =
    "usage: kiln plot RUN_DIR [RUN_DIR...] [-o FILE]\n"
    "\n"
    "Draws RUN_DIR/metrics.jsonl as an SVG: training and validation loss vs\n"
    "step, and the learning rate vs step. Several runs (up to 4) are overlaid\n"
    "in one figure, each curve named by its run directory in the legend (for\n"
    "example bf16 against fp32).\n"
    "\n"
    "options:\n"
    "  -o, --output FILE  where to write the SVG (default: RUN_DIR/loss.svg of\n"
    "                     the first run)\n"
    "  -h, --help         this text\n";

int kiln_cmd_plot(int argc, char **argv) {
    const char *runs[4], *out = NULL;
    int n = 0;
    static const char *const names[] = {"-o", "--output"};
    for (int i = 1; i < argc; i++) {
        const char *v;
        int k = kiln_cli_arg("plot", argc, argv, &i, names, 2, &v);
        if (k == KILN_ARG_HELP) return fputs(plot_usage, stdout), 0;
        if (k == KILN_ARG_ERROR) return 2;
        if (k >= 0) {
            out = v;
        } else if (n == 4) {
            fprintf(stderr, "kiln plot: at most 4 runs in one plot\n");
            return 2;
        } else {
            runs[n++] = v;
        }
    }
    if (n == 0) {
        fputs(plot_usage, stderr);
        return 2;
    }
    if (kiln_plot_runs(runs, n, out)) {
        fprintf(stderr, "kiln plot: %s\n", kiln_last_error());
        return 1;
    }
    if (out) printf("wrote %s\n", out);
    else printf("wrote %s/loss.svg\n", runs[0]);
    return 0;
}
