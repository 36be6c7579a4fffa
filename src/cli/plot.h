/* SVG plots of training runs, written by kiln itself (no external tools).
 * Reads RUN_DIR/metrics.jsonl: training lines {"step", "loss", "lr", ...} and
 * evaluation lines {"step", "val_loss"}. Errors come back as a kiln_status
 * with kiln_last_error() naming the file and line; nothing here prints. */
#ifndef KILN_CLI_PLOT_H
#define KILN_CLI_PLOT_H

#include "kiln/core.h"

/* Plots one or more runs into one SVG: a loss panel (training and validation
 * loss vs step, one pair of curves per run) and a learning-rate panel. With
 * several runs the legend names each curve by its run directory's name.
 * out_path NULL: run_dirs[0]/loss.svg. Written atomically. */
kiln_status kiln_plot_runs(const char *const *run_dirs, int n_runs, const char *out_path);

#endif
