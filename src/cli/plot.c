/* SVG loss and learning-rate plots from metrics.jsonl (see plot.h). */
#include "plot.h"
#include "cli.h"
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double x, y;
} plot_pt;

typedef struct {
    plot_pt *p;
    int n, cap;
} plot_series;

typedef struct {
    char name[128];
    plot_series train, val, lr;
    plot_series acc, val_acc; /* a preference objective's rewards/accuracies */
} plot_run;

/* ---- reading metrics.jsonl --------------------------------------------- */

/* Appends (x, y). A step at or before the previous one means the run was
 * resumed from an earlier checkpoint and logged those steps again: the newer
 * values replace the older ones. */
static kiln_status series_add(plot_series *s, double x, double y) {
    if (!isfinite(x) || !isfinite(y)) return KILN_OK; /* a skipped NaN step: leave a gap-free line */
    while (s->n > 0 && s->p[s->n - 1].x >= x) s->n--;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        plot_pt *p = realloc(s->p, (size_t)cap * sizeof *p);
        if (!p) return kiln_error(KILN_ERR_OOM, "plot: out of memory");
        s->p = p;
        s->cap = cap;
    }
    s->p[s->n++] = (plot_pt){x, y};
    return KILN_OK;
}

/* 1: *v holds the number; 0: key absent or null; -1: present but not a number. */
static int get_num(json_t *o, const char *key, double *v) {
    json_t *j = json_object_get(o, key);
    if (!j || json_is_null(j)) return 0;
    if (!json_is_number(j)) return -1;
    *v = json_number_value(j);
    return 1;
}

static kiln_status parse_line(const char *path, int line_no, json_t *o, plot_run *r) {
    static const char *const keys[] = {"loss", "val_loss", "lr", "rewards/accuracies", "val_rewards/accuracies"};
    plot_series *dst[] = {&r->train, &r->val, &r->lr, &r->acc, &r->val_acc};
    if (!json_is_object(o)) return kiln_error(KILN_ERR_FORMAT, "%s:%d: expected a JSON object", path, line_no);
    double step = 0, v = 0;
    int has = get_num(o, "step", &step);
    if (has < 0) return kiln_error(KILN_ERR_FORMAT, "%s:%d: \"step\" is not a number", path, line_no);
    for (int k = 0; k < 5; k++) {
        int got = get_num(o, keys[k], &v);
        if (got < 0) return kiln_error(KILN_ERR_FORMAT, "%s:%d: \"%s\" is not a number", path, line_no, keys[k]);
        if (got && !has) return kiln_error(KILN_ERR_FORMAT, "%s:%d: \"%s\" without a \"step\"", path, line_no, keys[k]);
        if (got) {
            kiln_status st = series_add(dst[k], step, v);
            if (st) return st;
        }
    }
    return KILN_OK;
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

static void run_name(const char *dir, char *out, size_t n) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && dir[start - 1] != '/') start--;
    snprintf(out, n, "%.*s", (int)(len - start), dir + start);
}

/* A final line without its newline may be a write in progress (plotting a
 * run that is still training): it is skipped if it does not parse. */
static kiln_status read_metrics(const char *run_dir, plot_run *r) {
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    run_name(run_dir, r->name, sizeof r->name);
    char *buf = NULL;
    size_t n = 0;
    kiln_status st = kiln_read_file(path, &buf, &n);
    if (st) return kiln_error_context(st, "plot");
    size_t pos = 0;
    for (int line_no = 1; pos < n && !st; line_no++) {
        const char *nl = memchr(buf + pos, '\n', n - pos);
        size_t len = nl ? (size_t)(nl - (buf + pos)) : n - pos;
        if (!blank(buf + pos, len)) {
            json_error_t err;
            json_t *o = json_loadb(buf + pos, len, 0, &err);
            if (!o && nl)
                st = kiln_error(KILN_ERR_FORMAT, "%s:%d: not valid JSON (%s)", path, line_no, err.text);
            else if (o)
                st = parse_line(path, line_no, o, r);
            json_decref(o);
        }
        pos += len + 1;
    }
    free(buf);
    return st;
}

/* ---- SVG text ----------------------------------------------------------- */

typedef kiln_strbuf sbuf;
#define sb_printf kiln_strbuf_printf

static void sb_escaped(sbuf *b, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': sb_printf(b, "&amp;"); break;
        case '<': sb_printf(b, "&lt;"); break;
        case '>': sb_printf(b, "&gt;"); break;
        case '"': sb_printf(b, "&quot;"); break;
        default: sb_printf(b, "%c", *s);
        }
    }
}

/* ---- axes ---------------------------------------------------------------- */

typedef struct {
    double lo, hi, step;
} plot_axis;

typedef struct {
    double x0, y0, w, h; /* pixel box of the plotting area */
    plot_axis x, y;
    int id;
} plot_panel;

/* 1, 2 or 5 times a power of ten, giving about `target` intervals */
static double nice_step(double range, int target) {
    double raw = range / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

static plot_axis make_axis(double lo, double hi, int target, bool from_zero) {
    if (from_zero && lo > 0) lo = 0;
    if (!(hi > lo)) {
        double pad = fabs(lo) > 0 ? fabs(lo) * 0.1 : 1;
        lo -= from_zero && lo == 0 ? 0 : pad;
        hi += pad;
    }
    plot_axis a;
    a.step = nice_step(hi - lo, target);
    a.lo = floor(lo / a.step + 1e-9) * a.step;
    a.hi = ceil(hi / a.step - 1e-9) * a.step;
    return a;
}

static double px(const plot_panel *p, double x) { return p->x0 + (x - p->x.lo) / (p->x.hi - p->x.lo) * p->w; }
static double py(const plot_panel *p, double y) { return p->y0 + p->h - (y - p->y.lo) / (p->y.hi - p->y.lo) * p->h; }

static void tick_label(char *out, size_t n, double v, double step) {
    v = round(v / step) * step;
    if (fabs(v) < step * 1e-6) v = 0;
    snprintf(out, n, "%.6g", v);
}

static void draw_axes(sbuf *b, const plot_panel *p, const char *title, const char *ylabel) {
    sb_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fff\" stroke=\"#444\"/>\n", p->x0, p->y0,
              p->w, p->h);
    char lab[64];
    for (double v = p->x.lo; v <= p->x.hi + p->x.step * 1e-6; v += p->x.step) {
        double X = px(p, v);
        tick_label(lab, sizeof lab, v, p->x.step);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", X, p->y0, X, p->y0 + p->h);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>\n", X, p->y0 + p->h, X,
                  p->y0 + p->h + 5);
        sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", X, p->y0 + p->h + 19, lab);
    }
    for (double v = p->y.lo; v <= p->y.hi + p->y.step * 1e-6; v += p->y.step) {
        double Y = py(p, v);
        tick_label(lab, sizeof lab, v, p->y.step);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", p->x0, Y, p->x0 + p->w, Y);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>\n", p->x0 - 5, Y, p->x0, Y);
        sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", p->x0 - 8, Y + 4, lab);
    }
    sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">%s</text>\n",
              p->x0 + p->w / 2, p->y0 - 10, title);
    sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", p->x0 + p->w / 2, p->y0 + p->h + 38);
    sb_printf(b, "<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n", p->x0 - 62,
              p->y0 + p->h / 2, ylabel);
    sb_printf(b, "<clipPath id=\"clip%d\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n", p->id,
              p->x0, p->y0, p->w, p->h);
}

/* Long runs are thinned to about 3000 points per curve (the last is kept). */
static void draw_series(sbuf *b, const plot_panel *p, const plot_series *s, const char *cls, const char *color,
                        bool markers) {
    if (s->n == 0) return;
    int stride = s->n > 3000 ? (s->n + 2999) / 3000 : 1;
    sb_printf(b, "<polyline class=\"%s\" clip-path=\"url(#clip%d)\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" "
                 "stroke-linejoin=\"round\" points=\"", cls, p->id, color);
    for (int i = 0; i < s->n; i += stride) sb_printf(b, "%.1f,%.1f ", px(p, s->p[i].x), py(p, s->p[i].y));
    if ((s->n - 1) % stride) sb_printf(b, "%.1f,%.1f", px(p, s->p[s->n - 1].x), py(p, s->p[s->n - 1].y));
    sb_printf(b, "\"/>\n");
    if (markers && s->n <= 200)
        for (int i = 0; i < s->n; i++)
            sb_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\" clip-path=\"url(#clip%d)\"/>\n",
                      px(p, s->p[i].x), py(p, s->p[i].y), color, p->id);
}

typedef struct {
    const char *label, *run, *color;
    bool dashed;
} legend_entry;

static void draw_legend(sbuf *b, const plot_panel *p, const legend_entry *e, int n) {
    double w = 0;
    for (int i = 0; i < n; i++) {
        double len = (double)(strlen(e[i].label) + (e[i].run ? strlen(e[i].run) + 1 : 0));
        if (len > w) w = len;
    }
    w = w * 7 + 44;
    double x = p->x0 + p->w - w - 8, y = p->y0 + 8;
    sb_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"#fff\" fill-opacity=\"0.85\" stroke=\"#bbb\"/>\n",
              x, y, w, 8 + 18 * n);
    for (int i = 0; i < n; i++) {
        double ly = y + 16 + 18 * i;
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"%s/>\n", x + 8,
                  ly - 4, x + 32, ly - 4, e[i].color, e[i].dashed ? " stroke-dasharray=\"5,3\"" : "");
        sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\">", x + 38, ly);
        if (e[i].run) {
            sb_escaped(b, e[i].run);
            sb_printf(b, " ");
        }
        sb_printf(b, "%s</text>\n", e[i].label);
    }
}

/* ---- the figure ------------------------------------------------------------ */

static const char *const train_colors[] = {"#1f77b4", "#2ca02c", "#9467bd", "#8c564b"};
static const char *const val_colors[] = {"#ff7f0e", "#d62728", "#e377c2", "#bcbd22"};

static void range_of(const plot_series *s, double *xlo, double *xhi, double *ylo, double *yhi) {
    for (int i = 0; i < s->n; i++) {
        *xlo = fmin(*xlo, s->p[i].x), *xhi = fmax(*xhi, s->p[i].x);
        *ylo = fmin(*ylo, s->p[i].y), *yhi = fmax(*yhi, s->p[i].y);
    }
}

static void render(sbuf *b, const plot_run *runs, int n_runs) {
    bool acc = false; /* a third panel: the reward accuracy of preference runs */
    for (int r = 0; r < n_runs; r++) acc = acc || runs[r].acc.n || runs[r].val_acc.n;
    const double W = 960, H = acc ? 930 : 720;
    double xlo = INFINITY, xhi = -INFINITY, llo = INFINITY, lhi = -INFINITY, rlo = INFINITY, rhi = -INFINITY, d0, d1;
    for (int r = 0; r < n_runs; r++) {
        range_of(&runs[r].train, &xlo, &xhi, &llo, &lhi);
        range_of(&runs[r].val, &xlo, &xhi, &llo, &lhi);
        d0 = INFINITY, d1 = -INFINITY;
        range_of(&runs[r].lr, &d0, &d1, &rlo, &rhi);
        xlo = fmin(xlo, d0), xhi = fmax(xhi, d1);
    }
    if (!isfinite(rlo)) rlo = 0, rhi = 1;
    plot_axis xa = make_axis(fmin(xlo, 0), xhi, 8, true);
    plot_panel loss = {90, 60, W - 120, 380, xa, make_axis(llo, lhi, 6, false), 0};
    plot_panel lr = {90, 510, W - 120, 150, xa, make_axis(rlo, rhi, 4, true), 1};

    sb_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                 "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n", W, H, W, H);
    sb_printf(b, "<rect width=\"100%%\" height=\"100%%\" fill=\"#fafafa\"/>\n");
    sb_printf(b, "<text x=\"%.1f\" y=\"24\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">kiln: ", W / 2);
    for (int r = 0; r < n_runs; r++) {
        if (r) sb_printf(b, " vs ");
        sb_escaped(b, runs[r].name);
    }
    sb_printf(b, "</text>\n");

    draw_axes(b, &loss, "loss", "loss");
    legend_entry le[8] = {{0}};
    int ne = 0;
    for (int r = 0; r < n_runs; r++) {
        const char *tc = train_colors[r % 4], *vc = val_colors[r % 4], *name = n_runs > 1 ? runs[r].name : NULL;
        draw_series(b, &loss, &runs[r].train, "train", tc, false);
        draw_series(b, &loss, &runs[r].val, "val", vc, true);
        le[ne++] = (legend_entry){"training loss", name, tc, false};
        if (runs[r].val.n) le[ne++] = (legend_entry){"validation loss", name, vc, false};
    }
    draw_legend(b, &loss, le, ne);

    draw_axes(b, &lr, "learning rate", "lr");
    ne = 0;
    for (int r = 0; r < n_runs; r++) {
        draw_series(b, &lr, &runs[r].lr, "lr", train_colors[r % 4], false);
        if (runs[r].lr.n) le[ne++] = (legend_entry){"lr", n_runs > 1 ? runs[r].name : NULL, train_colors[r % 4], false};
    }
    if (ne == 0)
        sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888\">no learning-rate values</text>\n",
                  lr.x0 + lr.w / 2, lr.y0 + lr.h / 2);
    else if (n_runs > 1)
        draw_legend(b, &lr, le, ne);
    if (acc) {
        plot_panel ap = {90, 720, W - 120, 150, xa, make_axis(0, 1, 4, false), 2};
        draw_axes(b, &ap, "reward accuracy", "accuracy");
        ne = 0;
        for (int r = 0; r < n_runs; r++) {
            const char *tc = train_colors[r % 4], *vc = val_colors[r % 4], *name = n_runs > 1 ? runs[r].name : NULL;
            draw_series(b, &ap, &runs[r].acc, "train", tc, false);
            draw_series(b, &ap, &runs[r].val_acc, "val", vc, true);
            if (runs[r].acc.n) le[ne++] = (legend_entry){"rewards/accuracies", name, tc, false};
            if (runs[r].val_acc.n) le[ne++] = (legend_entry){"val rewards/accuracies", name, vc, false};
        }
        draw_legend(b, &ap, le, ne);
    }
    sb_printf(b, "</svg>\n");
}

kiln_status kiln_plot_runs(const char *const *run_dirs, int n_runs, const char *out_path) {
    if (n_runs < 1 || n_runs > 4) return kiln_error(KILN_ERR_INVALID, "plot: 1 to 4 runs, got %d", n_runs);
    plot_run *runs = calloc((size_t)n_runs, sizeof *runs);
    if (!runs) return kiln_error(KILN_ERR_OOM, "plot: out of memory");
    kiln_status st = KILN_OK;
    bool any = false;
    for (int r = 0; r < n_runs && !st; r++) {
        st = read_metrics(run_dirs[r], &runs[r]);
        any = any || runs[r].train.n || runs[r].val.n;
    }
    if (!st && !any)
        st = kiln_error(KILN_ERR_FORMAT, "plot: no loss values in %s/metrics.jsonl%s", run_dirs[0], n_runs > 1 ? " (or the others)" : "");
    char def[4096];
    if (!st) {
        if (!out_path) {
            snprintf(def, sizeof def, "%s/loss.svg", run_dirs[0]);
            out_path = def;
        }
        sbuf b = {0};
        render(&b, runs, n_runs);
        if (b.oom) st = kiln_error(KILN_ERR_OOM, "plot: out of memory");
        else st = kiln_write_file_atomic(out_path, b.s, b.n);
        if (st) kiln_error_context(st, "plot: writing %s", out_path);
        free(b.s);
    }
    for (int r = 0; r < n_runs; r++) {
        free(runs[r].train.p);
        free(runs[r].val.p);
        free(runs[r].lr.p);
        free(runs[r].acc.p);
        free(runs[r].val_acc.p);
    }
    free(runs);
    return st;
}

/* The entry `kiln train` calls at the end of a run (declared in cli.h). */
int kiln_cli_write_plot(const char *run_dir, const char *out_path) {
    const char *dirs[1] = {run_dir};
    return (int)kiln_plot_runs(dirs, 1, out_path);
}
