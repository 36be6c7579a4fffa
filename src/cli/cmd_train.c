/* `kiln train`: flags (over an optional --config file) into a
 * kiln_train_config, the trainer, a progress bar, Ctrl-C handling, the
 * closing summary and plot. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "kiln/kernels.h"
#include "kiln/train.h"

/* The flags are the lines of KILN_TRAIN_SETTINGS (kiln/train.h) that have
 * an ARG: --key with '-' for '_' (--no-key for a FLAG that clears), and
 * each value goes through kiln_setting_parse, as train_config.json's do. */
#define COUNT_ONE(...) +1
enum { N_SETTINGS = 0 KILN_TRAIN_SETTINGS(COUNT_ONE) };
static char flag_names[N_SETTINGS][40];

static const char *flag_name(int i) {
    const kiln_setting *s = &kiln_train_settings[i];
    if (!flag_names[i][0]) {
        snprintf(flag_names[i], sizeof flag_names[i], "%s%s", s->kind == KILN_SETTING_FLAG && !s->limit ? "no-" : "", s->key);
        for (char *p = flag_names[i]; *p; p++)
            if (*p == '_') *p = '-';
    }
    return flag_names[i];
}

static void print_flag(FILE *f, const char *name, const char *arg, const char *help, const char *dflt) {
    char lhs[128];
    snprintf(lhs, sizeof lhs, "--%.40s%s%.60s", name, arg[0] ? " " : "", arg);
    fprintf(f, "  %-26s %s", lhs, help);
    if (dflt[0]) fprintf(f, " (default: %s)", dflt);
    fputc('\n', f);
}

static void usage(FILE *f) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    fprintf(f, "usage: kiln train [--config FILE] [flags]\n"
               "       kiln train --resume RUN_DIR [--steps N] [--device NAME]\n\n"
               "Trains a Llama-style model on token shards (see `kiln tokenize`). The\n"
               "--config file (JSON, keys as the flags with '_' for '-') is applied\n"
               "first, then the flags. Ctrl-C finishes the current step, saves and\n"
               "exits; a second Ctrl-C quits at once.\n\noptions:\n");
    fprintf(f, "  --config FILE              settings as JSON (e.g. a run's train_config.json)\n");
    fprintf(f, "  --resume RUN_DIR           continue a run from its newest checkpoint with its\n"
               "                             saved settings; only --steps may be raised\n"
               "                             (--threads and --device may change)\n");
    for (int i = 0; i < kiln_train_n_settings; i++) {
        const kiln_setting *s = &kiln_train_settings[i];
        char dflt[64] = "";
        if (!strcmp(s->key, "beta1")) {
            snprintf(dflt, sizeof dflt, "%g,%g", c.beta1, c.beta2);
            print_flag(f, "betas", "B1,B2", "AdamW betas", dflt);
        }
        if (!s->arg) continue;
        if (s->kind != KILN_SETTING_FLAG) kiln_setting_format(s, &c, dflt, sizeof dflt);
        print_flag(f, flag_name(i), s->arg, s->help, dflt);
    }
    fprintf(f, "  --threads N                compute threads (default: all cores)\n"
               "  --no-plot                  do not write RUN_DIR/loss.svg at the end\n"
               "  --no-overlap               under mpirun: all-reduce gradients after backward\n"
               "                             instead of overlapping buckets with it\n"
               "  -h, --help                 this text\n\n"
               "Data parallel: `mpirun -np P kiln train ...` (see the README): each rank runs\n"
               "--accum micro-batches per step, so a step holds P x accum x batch rows; rank 0\n"
               "logs and saves. Under mpirun, SIGUSR1 (kill -USR1 on mpirun) saves and stops.\n\n"
               "exit status: 0 done (or stopped by Ctrl-C and saved), 1 runtime error, 2 usage error\n");
}

/* Stores one flag's value; false (after printing why) on a bad value. */
static bool apply_flag(int k, const char *v, kiln_train_config *c) {
    const kiln_setting *s = &kiln_train_settings[k];
    kiln_status st = s->kind == KILN_SETTING_FLAG ? kiln_setting_parse(s, s->limit ? "true" : "false", c)
                                                  : kiln_setting_parse(s, v, c);
    if (st) fprintf(stderr, "kiln train: --%s: %s\n", flag_name(k), kiln_last_error());
    return !st;
}

/* --betas B1,B2: beta1 and beta2 at once */
static bool apply_betas(const char *v, kiln_train_config *c) {
    const char *comma = strchr(v, ',');
    char b1[64];
    bool ok = comma && (size_t)(comma - v) < sizeof b1;
    if (ok) {
        memcpy(b1, v, (size_t)(comma - v));
        b1[comma - v] = 0;
        ok = !kiln_setting_parse(kiln_setting_find("beta1"), b1, c) && !kiln_setting_parse(kiln_setting_find("beta2"), comma + 1, c);
    }
    if (!ok) fprintf(stderr, "kiln train: --betas: bad value '%s' (expected two numbers B1,B2 in [0, 1))\n", v);
    return ok;
}

typedef struct {
    const char *config, *resume, *threads;
    bool help, no_plot, no_overlap, steps_given, others_given;
} train_args;

/* The scanner's flags: the settings that have one, then the extras. */
enum { X_CONFIG, X_RESUME, X_THREADS, X_BETAS, X_NO_PLOT, X_NO_OVERLAP, N_EXTRA };
static kiln_cli_flag all_flags[N_SETTINGS + N_EXTRA];
static int flag_setting[N_SETTINGS + N_EXTRA]; /* setting index, or -1 - extra */
static int n_all;

static void build_flags(void) {
    static char dashed[N_SETTINGS][44];
    if (n_all) return;
    for (int i = 0; i < kiln_train_n_settings; i++) {
        if (!kiln_train_settings[i].arg) continue;
        snprintf(dashed[i], sizeof dashed[i], "--%.40s", flag_name(i));
        flag_setting[n_all] = i;
        all_flags[n_all++] = (kiln_cli_flag){dashed[i], kiln_train_settings[i].kind != KILN_SETTING_FLAG};
    }
    static const kiln_cli_flag extra[N_EXTRA] = {{"--config", true},  {"--resume", true},   {"--threads", true},
                                                 {"--betas", true},   {"--no-plot", false}, {"--no-overlap", false}};
    for (int e = 0; e < N_EXTRA; e++) flag_setting[n_all] = -1 - e, all_flags[n_all++] = extra[e];
}

/* Two passes: pass 0 only finds --config/--resume/--help/--threads (so the
 * file applies first); pass 1 applies the config flags in order. */
static int scan(int argc, char **argv, int pass, train_args *a, kiln_train_config *c) {
    build_flags();
    for (int i = 1; i < argc; i++) {
        const char *v;
        int f = kiln_cli_scan("train", argc, argv, &i, all_flags, n_all, &v);
        if (f == KILN_ARG_HELP) {
            a->help = true;
            continue;
        }
        if (f == KILN_ARG_POS) {
            fprintf(stderr, "kiln train: unexpected argument '%s' (see --help)\n", v);
            return 2;
        }
        if (f == KILN_ARG_ERROR) return 2;
        int k = flag_setting[f], e = k < 0 ? -1 - k : -1;
        if (pass == 0) {
            if (e == X_CONFIG) a->config = v;
            if (e == X_RESUME) a->resume = v;
            if (e == X_THREADS) a->threads = v;
            if (e == X_NO_PLOT) a->no_plot = true;
            if (e == X_NO_OVERLAP) a->no_overlap = true;
            if (k >= 0 && !strcmp(kiln_train_settings[k].key, "steps")) a->steps_given = true;
            else if (k >= 0 && !strcmp(kiln_train_settings[k].key, "device")) continue; /* where, not what: also with --resume */
            else if (k >= 0 || e == X_BETAS) a->others_given = true;
        } else if ((k >= 0 && !apply_flag(k, v, c)) || (e == X_BETAS && !apply_betas(v, c))) {
            return 2;
        }
    }
    return 0;
}

static int load_config_file(const char *path, kiln_train_config *c) {
    char *text = NULL;
    size_t n = 0;
    if (kiln_read_file(path, &text, &n) || kiln_train_config_parse(text, path, c)) {
        fprintf(stderr, "kiln train: %s\n", kiln_last_error());
        free(text);
        return 2;
    }
    free(text);
    return 0;
}

/* A run's saved settings: RUN_DIR/train_config.json, else its newest
 * checkpoint's copy. */
static int load_run_config(const char *run_dir, kiln_train_config *c) {
    char path[1200], ck[1024];
    snprintf(path, sizeof path, "%s/train_config.json", run_dir);
    if (access(path, R_OK) != 0) {
        if (kiln_checkpoint_latest(run_dir, ck, sizeof ck)) {
            fprintf(stderr, "kiln train: --resume %s: %s\n", run_dir, kiln_last_error());
            return 1;
        }
        snprintf(path, sizeof path, "%s/train_config.json", ck);
    }
    return load_config_file(path, c);
}

/* A new run needs its tokenizer: every checkpoint carries a copy, which is
 * what `kiln generate` and `kiln eval --text` read. Fine-tuning (--init)
 * takes the one of the run it starts from. */
static int need_tokenizer(kiln_train_config *c) {
    if (c->tokenizer[0]) return 0;
    char from[600];
    if (kiln_is_gguf_path(c->init) && strlen(c->init) < sizeof c->tokenizer) { /* the file holds its tokenizer */
        memcpy(c->tokenizer, c->init, strlen(c->init) + 1);
        return 0;
    }
    snprintf(from, sizeof from, "%s/tokenizer.json", c->init);
    if (c->init[0] && access(from, R_OK) == 0 && strlen(from) < sizeof c->tokenizer) {
        memcpy(c->tokenizer, from, strlen(from) + 1);
        return 0;
    }
    fprintf(stderr, "kiln train: no --tokenizer: give the tokenizer.json the shards were made with (%s), so the run "
                    "directory can be used by kiln generate\n", c->init[0] ? "--init's run has none" : "kiln tokenize --tokenizer");
    return 2;
}

/* Builds the configuration from defaults, --config or the resumed run, and
 * the flags. Returns an exit code (0: go on). */
static int build_config(int argc, char **argv, train_args *a, kiln_train_config *c) {
    kiln_train_config_default(c);
    int rc = scan(argc, argv, 0, a, c);
    if (rc || a->help) return rc;
    if (a->resume && (a->config || a->others_given)) {
        fprintf(stderr, "kiln train: --resume continues with the run's saved settings; only --steps (and --threads,"
                        " --device) may be given with it\n");
        return 2;
    }
    if (a->resume) {
        if ((rc = load_run_config(a->resume, c))) return rc;
        int64_t saved = c->steps;
        if ((rc = scan(argc, argv, 1, a, c))) return rc;
        if (a->steps_given && saved > 0 && c->steps < saved) {
            fprintf(stderr, "kiln train: --steps %lld is below the run's %lld (it may only be raised)\n",
                    (long long)c->steps, (long long)saved);
            return 2;
        }
        if (strlen(a->resume) >= sizeof c->run_dir) {
            fprintf(stderr, "kiln train: --resume: path too long\n");
            return 2;
        }
        snprintf(c->run_dir, sizeof c->run_dir, "%s", a->resume);
    } else {
        if (a->config && (rc = load_config_file(a->config, c))) return rc;
        if ((rc = scan(argc, argv, 1, a, c))) return rc;
    }
    if (a->threads && !kiln_cli_threads("train", a->threads)) return 2;
    if (kiln_train_config_validate(c)) {
        fprintf(stderr, "kiln train: %s\n", kiln_last_error());
        return 2;
    }
    return a->resume ? 0 : need_tokenizer(c);
}

/* ---- progress --------------------------------------------------------------- */

typedef struct {
    bool tty, bar_shown, estimated;
    int64_t log_every, first_step;
    double t0, t1, last_draw; /* t1: when the first step of this process ended */
} progress;

/* Steps timed before the run says how long it will take (the first one
 * includes building the compiled step, so it is left out when there are
 * more). */
enum { ESTIMATE_AFTER = 4 };

static void fmt_duration(double s, char *out, size_t n) {
    if (!(s >= 0) || s > 1e8) {
        snprintf(out, n, "?");
        return;
    }
    long t = lround(s);
    if (s < 10) snprintf(out, n, "%.1fs", s);
    else if (t >= 3600) snprintf(out, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, n, "%lds", t);
}

static double eta_s(const progress *p, const kiln_trainer_state *st) {
    int64_t done = st->step - p->first_step;
    if (done <= 0) return -1;
    return (kiln_time_now() - p->t0) / (double)done * (double)(st->total_steps - st->step);
}

static void clear_bar(progress *p) {
    if (p->tty && p->bar_shown) fputs("\r\033[K", stderr);
    p->bar_shown = false;
}

/* One line after the first steps of this process: the expected duration of
 * the rest at their speed (evaluations and saves come on top). */
static void estimate(progress *p, const kiln_trainer_state *st) {
    int64_t done = st->step - p->first_step, left = st->total_steps - st->step;
    if (p->estimated || done < ESTIMATE_AFTER || left <= 0) return;
    p->estimated = true;
    double per_step = (kiln_time_now() - p->t1) / (double)(done - 1);
    char d[32], e[32];
    fmt_duration(per_step, d, sizeof d);
    fmt_duration(per_step * (double)left, e, sizeof e);
    clear_bar(p);
    fprintf(stderr, "kiln train: %s a step over steps %lld-%lld: expect about %s for the %lld steps left (evaluations and "
            "saves take longer)\n", d, (long long)(p->first_step + 2), (long long)st->step, e, (long long)left);
}

static void on_step(progress *p, const kiln_event *e) {
    const kiln_trainer_state *st = e->state;
    const kiln_step_result *r = e->step;
    if (st->step - p->first_step == 1) p->t1 = kiln_time_now();
    estimate(p, st);
    char eta[32];
    fmt_duration(eta_s(p, st), eta, sizeof eta);
    if (p->tty) {
        /* at most ~10 redraws a second: fast tiny models would flood the terminal */
        double now = kiln_time_now();
        if (now - p->last_draw < 0.1 && st->step != st->total_steps && p->bar_shown) return;
        p->last_draw = now;
        enum { W = 20 };
        char bar[W + 1];
        int fill = st->total_steps > 0 ? (int)(W * st->step / st->total_steps) : 0;
        for (int i = 0; i < W; i++) bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
        bar[W] = 0;
        fprintf(stderr, "\r\033[Kstep %lld/%lld [%s] loss %.3f lr %.1e |g| %.2f %.0f tok/s ETA %s", (long long)st->step,
                (long long)st->total_steps, bar, r ? r->loss : st->last_loss, r ? r->lr : 0.0, r ? r->grad_norm : 0.0,
                e->tokens_per_s, eta);
        fflush(stderr);
        p->bar_shown = true;
    } else if (st->step % p->log_every == 0 || st->step == st->total_steps) {
        fprintf(stderr, "step %lld/%lld loss %.4f lr %.3e |g| %.3f %.0f tok/s ETA %s\n", (long long)st->step,
                (long long)st->total_steps, r ? r->loss : st->last_loss, r ? r->lr : 0.0, r ? r->grad_norm : 0.0,
                e->tokens_per_s, eta);
    }
}

static void on_event(const kiln_event *e, void *user) {
    progress *p = user;
    const kiln_trainer_state *st = e->state;
    long long step = st ? (long long)st->step : 0;
    switch (e->kind) {
    case KILN_EVENT_STEP: on_step(p, e); return;
    case KILN_EVENT_EVAL:
        clear_bar(p);
        if (e->n_val_metrics) { /* a preference objective: its loss has no perplexity; TRL's metrics instead */
            fprintf(stderr, "step %lld: val loss %.4f", step, e->val_loss);
            for (int j = 0; j < e->n_val_metrics; j++)
                if (strstr(e->val_metric_names[j], "accuracies") || strstr(e->val_metric_names[j], "margins"))
                    fprintf(stderr, ", %s %.4f", e->val_metric_names[j], e->val_metrics[j]);
            fprintf(stderr, "\n");
        } else {
            fprintf(stderr, "step %lld: val loss %.4f (perplexity %.2f)\n", step, e->val_loss, exp(e->val_loss));
        }
        break;
    case KILN_EVENT_SAVE:
        clear_bar(p);
        fprintf(stderr, "step %lld: saved %s\n", step, e->message ? e->message : "checkpoint");
        break;
    case KILN_EVENT_NAN:
        clear_bar(p);
        fprintf(stderr, "step %lld: non-finite %s", step, e->step && e->step->bad_micro >= 0 ? "loss" : "gradient norm");
        if (e->step && e->step->bad_micro >= 0) fprintf(stderr, " in micro-batch %d", e->step->bad_micro);
        fprintf(stderr, "%s%s\n", e->message ? ": " : "", e->message ? e->message : "");
        break;
    case KILN_EVENT_INFO:
        clear_bar(p);
        fprintf(stderr, "%s\n", e->message ? e->message : "");
        break;
    }
    fflush(stderr);
}

/* ---- Ctrl-C ------------------------------------------------------------------- */

/* Ctrl-C and SIGUSR1 (mpirun forwards it to every rank) are taken by a thread
 * of their own that waits in sigwait(): every other thread blocks them while
 * the run lasts. A handler must never run on a thread that computes: oneDNN
 * 2.6's JIT sgemm points rsp into a heap buffer, so a signal frame delivered
 * there overwrites the heap (oneDNN issue 4845, fixed upstream in 2026; with
 * AMX's tile state the frame is 11 KB and test_cli's Ctrl-C runs aborted with
 * "corrupted size vs. prev_size" in about one run of test_cli in four on a
 * Xeon; 16 in a row clean with the taker). */
typedef struct {
    sigset_t set;
    pthread_t thread;
    volatile sig_atomic_t done; /* the run is over: the next signal ends the taker */
} signal_taker;

static kiln_trainer *volatile g_trainer;
static volatile sig_atomic_t g_interrupts;

static void on_signal(int sig) {
    if (sig == SIGINT && ++g_interrupts >= 2) _exit(130);
    static const char msg[] = "\nkiln train: stopping after this step and saving (Ctrl-C again to quit now)\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    if (g_trainer) kiln_trainer_request_stop(g_trainer);
}

static void *take_signals(void *arg) {
    signal_taker *g = arg;
    for (int sig = 0;;)
        if (!sigwait(&g->set, &sig)) {
            if (g->done) return NULL;
            on_signal(sig);
        }
}

/* how = SIG_BLOCK: this thread and the OpenMP pool's threads (oneDNN's too;
 * threads made later inherit the mask) block the signals, and the taker
 * starts; SIG_UNBLOCK undoes it. */
static bool signals_to_taker(signal_taker *g, int how) {
    if (how == SIG_UNBLOCK) {
        /* a signal of its own ends it (not pthread_cancel: clang's ASan
         * runtime reports its own stack as overflowed after the unwind) */
        g->done = 1;
        pthread_kill(g->thread, SIGUSR1);
        pthread_join(g->thread, NULL);
    }
#pragma omp parallel
    pthread_sigmask(how, &g->set, NULL);
    pthread_sigmask(how, &g->set, NULL); /* this thread, in case it is not the pool's first */
    if (how == SIG_BLOCK && pthread_create(&g->thread, NULL, take_signals, g)) {
        pthread_sigmask(SIG_UNBLOCK, &g->set, NULL);
        return false;
    }
    return true;
}

/* --precision and --global-batch: what was chosen; at the end, the
 * predicted peak against the measured one. */
static void print_memory(kiln_trainer *t, bool end) {
    const kiln_train_config *c = kiln_trainer_config(t);
    const kiln_mem_choice *m = kiln_trainer_mem_choice(t);
    char a[32], b[32], d[32];
    if (!end && c->precision == KILN_BF16) fprintf(stderr, "kiln train: precision bf16: %s\n", kiln_bf16_path());
    if (!m) return;
    if (end) {
        double rss = (double)kiln_peak_rss();
        if (m->est.total)
            fprintf(stderr, "memory: predicted peak %s, measured peak RSS %s (%+.1f%%)\n", kiln_bytes_str(m->est.total, a, sizeof a),
                    kiln_bytes_str((int64_t)rss, b, sizeof b), 100.0 * (rss - (double)m->est.total) / (double)m->est.total);
        return;
    }
    fprintf(stderr, "kiln train: global batch %d = micro-batch %d x accum %d (largest that fits: %d) within %s%s\n",
            m->global_batch, m->micro_batch, m->accum, m->largest_fit, kiln_bytes_str(m->budget, a, sizeof a),
            m->budget_default ? " (70% of MemAvailable)" : "");
    const kiln_mem_estimate *e = &m->est;
    if (e->total)
        fprintf(stderr, "kiln train: predicted peak %s = arenas %s + parameters, gradients, AdamW %s + other %s\n",
                kiln_bytes_str(e->total, a, sizeof a), kiln_bytes_str(e->arena_train + e->arena_eval, b, sizeof b),
                kiln_bytes_str(e->params + e->grads + e->optim, d, sizeof d),
                kiln_bytes_str(e->batches + e->scratch + e->overhead, (char[32]){0}, 32));
    if (m->note[0]) fprintf(stderr, "kiln train: warning: %s\n", m->note);
}

static void summary(const kiln_trainer_state *st, const kiln_train_config *c, double wall) {
    char t[32];
    fmt_duration(st->elapsed_s > 0 ? st->elapsed_s : wall, t, sizeof t);
    bool stopped = st->step < st->total_steps;
    fprintf(stderr, "%s at step %lld/%lld: %lld tokens in %s", stopped ? "stopped" : "done", (long long)st->step,
            (long long)st->total_steps, (long long)st->tokens_seen, t);
    if (st->elapsed_s > 0) fprintf(stderr, " (%.0f tok/s)", (double)st->tokens_seen / st->elapsed_s);
    fprintf(stderr, ", loss %.4f", st->last_loss);
    if (isfinite(st->last_val_loss) && st->last_val_loss > 0 && c->objective == KILN_OBJECTIVE_CE)
        fprintf(stderr, ", val loss %.4f (perplexity %.2f)", st->last_val_loss, exp(st->last_val_loss));
    else if (isfinite(st->last_val_loss))
        fprintf(stderr, ", val loss %.4f", st->last_val_loss);
    fprintf(stderr, "\nrun: %s\n", c->run_dir);
}

/* The launcher's rank before MPI is up (to print a start-up error once). */
static bool env_rank0(void) {
    const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    int64_t r = 0;
    for (int i = 0; i < 3; i++)
        if (getenv(names[i])) return !kiln_parse_i64(getenv(names[i]), 0, INT64_MAX, &r) && r == 0;
    return true;
}

/* After a failure with several ranks: a stop every rank agreed on (a NaN with
 * --on-nan stop) ends normally; anything else ends the whole job, naming
 * this rank, so the others never wait forever in a collective. */
static int fail_job(kiln_status s) {
    if (kiln_dist_size() > 1 && s != KILN_ERR_NUMERIC) kiln_dist_abort(kiln_last_error());
    if (kiln_dist_rank() == 0) fprintf(stderr, "kiln train: %s\n", kiln_last_error());
    return 1;
}

/* What the run trains, as it is: --init's directory or --model (a preset or
 * a config.json), with the family and sizes of the model loaded (the
 * preset's default name would call an --init model "demo"). */
static void describe_model(const kiln_train_config *c, const kiln_llama *m, char *out, size_t n) {
    const kiln_llama_config *mc = &m->cfg;
    snprintf(out, n, "%s%.600s (%s, vocab %lld, hidden %lld, layers %lld, heads %lld, kv heads %lld)", c->init[0] ? "--init " : "",
             c->init[0] ? c->init : c->model, kiln_family_name(mc->family), (long long)mc->vocab_size, (long long)mc->hidden_size,
             (long long)mc->num_hidden_layers, (long long)mc->num_attention_heads, (long long)mc->num_key_value_heads);
}

static int train(int argc, char **argv) {
    train_args a = {0};
    kiln_train_config c;
    int rc = build_config(argc, argv, &a, &c);
    bool rank0 = kiln_dist_rank() == 0;
    if (a.help) {
        if (rank0) usage(stdout);
        return 0;
    }
    if (rc) return rc;
    kiln_dist_set_overlap(!a.no_overlap);
    kiln_trainer *t = NULL;
    kiln_status s = kiln_trainer_open(&c, a.resume != NULL, &t);
    if (s) return fail_job(s);
    const kiln_trainer_state *st0 = kiln_trainer_get_state(t);
    progress p = {.tty = isatty(STDERR_FILENO) != 0, .log_every = c.log_every > 0 ? c.log_every : 1,
                  .first_step = st0->step, .t0 = kiln_time_now()};
    if (rank0) {
        char what[900];
        describe_model(&c, kiln_trainer_model(t), what, sizeof what);
        fprintf(stderr, "kiln train: model %s, %lld parameters, %lld steps from step %lld, run dir %s\n", what,
                (long long)kiln_llama_num_params(kiln_trainer_model(t)), (long long)st0->total_steps, (long long)st0->step,
                c.run_dir);
        if (kiln_dist_size() > 1)
            fprintf(stderr, "kiln train: %d ranks x %d micro-batches x %d rows per step (%d threads each), %s\n",
                    kiln_dist_size(), c.accum, c.batch, kiln_num_threads(),
                    a.no_overlap ? "all-reduce after backward" : "all-reduce overlapped with backward");
        print_memory(t, false);
    }

    g_trainer = t;
    g_interrupts = 0;
    /* the handler stays for threads kiln did not make (an MPI library's):
     * a signal that lands there is handled, off every computing thread */
    struct sigaction sa = {0}, old, old_usr;
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    sigaction(SIGUSR1, &sa, &old_usr);
    signal_taker sig = {0};
    sigemptyset(&sig.set);
    sigaddset(&sig.set, SIGINT);
    sigaddset(&sig.set, SIGUSR1);
    bool taking = signals_to_taker(&sig, SIG_BLOCK);
    if (!taking) kiln_log(KILN_LOG_WARN, "kiln train: no thread of its own for Ctrl-C could start: the computing threads take it");
    s = kiln_trainer_run(t, rank0 ? on_event : NULL, &p);
    if (taking) signals_to_taker(&sig, SIG_UNBLOCK);
    sigaction(SIGINT, &old, NULL);
    sigaction(SIGUSR1, &old_usr, NULL);
    g_trainer = NULL;
    clear_bar(&p);
    if (s) rc = fail_job(s);
    if (rank0) summary(kiln_trainer_get_state(t), &c, kiln_time_now() - p.t0);
    if (rank0) print_memory(t, true);
    kiln_trainer_free(t);
    if (!a.no_plot && rank0) {
        if (kiln_cli_write_plot(c.run_dir, NULL)) fprintf(stderr, "kiln train: no plot: %s\n", kiln_last_error());
        else fprintf(stderr, "plot: %s/loss.svg\n", c.run_dir);
    }
    return rc;
}

int kiln_cmd_train(int argc, char **argv) {
    if (kiln_dist_init(&argc, &argv)) {
        if (env_rank0()) fprintf(stderr, "kiln train: %s\n", kiln_last_error());
        return 2;
    }
    int rc = train(argc, argv);
    kiln_dist_finalize();
    return rc;
}
