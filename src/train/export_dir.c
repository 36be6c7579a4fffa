/* Model-directory exports (`kiln export RUN --merge-lora -o DIR`) and the
 * safety of every export target. A directory export is written whole beside
 * the target (DIR.kiln-tmp-<pid>), each file fsynced, the directory
 * fsynced, and swapped in with one rename (renameat2 RENAME_EXCHANGE, then
 * the old tree removed; where the kernel cannot exchange, the old one is
 * renamed aside to DIR.kiln-old-<pid> first), so a reader of DIR sees the
 * old complete directory or the new complete one, never a mix, and no file
 * of an older export survives. What a killed export leaves (those two names,
 * and kiln_atomic's FILE.tmp.<pid>... for a GGUF file) is removed by the
 * next export into the same target once its process is gone. A target is
 * refused when it is the model being exported, lies inside a run directory
 * or a checkpoint, or is a directory kiln could not have written (replacing
 * it would delete someone's files). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "export_gguf_impl.h"

#define PATH_CAP 4096
#define TMP_TAG ".kiln-tmp-"
#define OLD_TAG ".kiln-old-"

static kiln_status join(char *out, const char *dir, const char *name) {
    if (snprintf(out, PATH_CAP, "%s/%s", dir, name) >= PATH_CAP)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s/%s", dir, name);
    return KILN_OK;
}

static bool has_entry(const char *dir, const char *name) {
    char p[PATH_CAP];
    struct stat s;
    return !join(p, dir, name) && lstat(p, &s) == 0;
}

/* The process named by the digits at the start of s (up to a '.' or the
 * end) is gone: kill(pid, 0) fails with ESRCH. Our own pid is alive. */
static bool pid_gone(const char *s) {
    char digits[24];
    size_t n = strspn(s, "0123456789");
    if (n == 0 || n >= sizeof digits || (s[n] && s[n] != '.')) return false;
    memcpy(digits, s, n);
    digits[n] = 0;
    int64_t pid = 0;
    if (kiln_parse_i64(digits, 1, INT_MAX, &pid)) return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* "<base><tag><pid>..." of a dead process */
static bool stale_name(const char *name, const char *base, const char *tag) {
    size_t lb = strlen(base), lt = strlen(tag);
    return !strncmp(name, base, lb) && !strncmp(name + lb, tag, lt) && pid_gone(name + lb + lt);
}

/* The absolute, symlink-free form of path, which need not exist (its parent
 * must). */
static kiln_status canonical(const char *path, char *out) {
    char buf[PATH_CAP];
    if (realpath(path, buf)) return snprintf(out, PATH_CAP, "%s", buf) < PATH_CAP ? KILN_OK
                                                                           : kiln_error(KILN_ERR_INVALID, "path too long: %s", buf);
    if (errno != ENOENT) return kiln_error(KILN_ERR_IO, "%s: %s", path, strerror(errno));
    char copy[PATH_CAP];
    if (snprintf(copy, sizeof copy, "%s", path) >= (int)sizeof copy) return kiln_error(KILN_ERR_INVALID, "path too long: %s", path);
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = 0;
    char *slash = strrchr(copy, '/');
    const char *base = slash ? slash + 1 : copy;
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return kiln_error(KILN_ERR_INVALID, "%s does not name a directory to create", path);
    const char *parent = slash ? (slash == copy ? "/" : copy) : ".";
    if (slash && slash != copy) *slash = 0;
    if (!realpath(parent, buf))
        return kiln_error(KILN_ERR_IO, "cannot create %s: its parent directory %s: %s", path, parent, strerror(errno));
    if (snprintf(out, PATH_CAP, "%s%s%s", buf, strcmp(buf, "/") ? "/" : "", base) >= PATH_CAP)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s/%s", buf, base);
    return KILN_OK;
}

/* a equals b or lies below it (both canonical) */
static bool within(const char *a, const char *b) {
    size_t n = strlen(b);
    return !strncmp(a, b, n) && (a[n] == 0 || a[n] == '/' || (n == 1 && b[0] == '/'));
}

/* A run directory or a checkpoint: trainer_state.json (a checkpoint's
 * file, a run directory's link to its newest one) or checkpoint-<step>/. */
static bool is_run_dir(const char *dir) {
    if (has_entry(dir, "trainer_state.json")) return true;
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));) {
        const char *nm = e->d_name;
        if (strncmp(nm, "checkpoint-", 11) || !nm[11] || strspn(nm + 11, "0123456789") != strlen(nm + 11)) continue;
        char p[PATH_CAP];
        struct stat s;
        found = !join(p, dir, nm) && stat(p, &s) == 0 && S_ISDIR(s.st_mode);
    }
    closedir(d);
    return found;
}

static void split(const char *path, char *parent, char *base) {
    const char *slash = strrchr(path, '/');
    snprintf(base, PATH_CAP, "%s", slash ? slash + 1 : path);
    if (!slash) snprintf(parent, PATH_CAP, ".");
    else if (slash == path) snprintf(parent, PATH_CAP, "/");
    else snprintf(parent, PATH_CAP, "%.*s", (int)(slash - path), path);
}

kiln_status kiln_export_clean(const char *target) {
    char t[PATH_CAP], parent[PATH_CAP], base[PATH_CAP], p[PATH_CAP], names[600] = "";
    if (canonical(target, t)) return KILN_OK; /* no parent directory: nothing there to clean (the write says why) */
    kiln_status st = KILN_OK;
    split(t, parent, base);
    DIR *d = opendir(parent);
    if (!d) return kiln_error(KILN_ERR_IO, "cannot read %s: %s", parent, strerror(errno));
    struct stat s;
    bool target_there = lstat(t, &s) == 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const char *nm = e->d_name;
        bool dir_tmp = stale_name(nm, base, TMP_TAG), dir_old = stale_name(nm, base, OLD_TAG);
        bool file_tmp = stale_name(nm, base, ".tmp.");
        if ((!dir_tmp && !dir_old && !file_tmp) || join(p, parent, nm) || lstat(p, &s) != 0) continue;
        if (file_tmp && !S_ISREG(s.st_mode)) continue;
        if (dir_old && !target_there && S_ISDIR(s.st_mode)) {
            /* killed between moving the old directory aside and moving the
             * new one in (a kernel without RENAME_EXCHANGE): the old one
             * goes back, so the target is never missing for long */
            if (rename(p, t) == 0) {
                target_there = true;
                kiln_log(KILN_LOG_INFO, "kiln export: put back %s as %s, moved aside by an interrupted export", p, t);
                continue;
            }
        }
        if ((st = kiln_remove_tree(p))) break;
        size_t used = strlen(names);
        if (used + strlen(nm) + 8 < sizeof names) snprintf(names + used, sizeof names - used, "%s%s", n ? ", " : "", nm);
        n++;
    }
    closedir(d);
    if (n)
        kiln_log(KILN_LOG_INFO, "kiln export: removed %d leftover%s of interrupted exports into %s (their processes are gone): %s",
                 n, n > 1 ? "s" : "", t, names);
    return st;
}

/* The files a model directory kiln writes may hold (an older export, or a
 * copy of a checkpoint's model files); anything else in a target is
 * someone's data. */
static bool model_file(const char *nm) {
    static const char *const known[] = {"config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json",
                                        "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
                                        "adapter_config.json", "adapter_model.safetensors", NULL};
    size_t len = strlen(nm);
    for (int i = 0; known[i]; i++) {
        size_t k = strlen(known[i]);
        /* the file, or a temporary of it a killed writer left */
        if (!strncmp(nm, known[i], k) && (nm[k] == 0 || !strncmp(nm + k, ".tmp.", 5))) return true;
    }
    return !strncmp(nm, "model-", 6) && strstr(nm, "-of-") && len > 12 && !strcmp(nm + len - 12, ".safetensors");
}

kiln_status kiln_export_check_target(const char *source, const char *model_dir, const char *target) {
    char t[PATH_CAP], r[PATH_CAP], b[PATH_CAP], up[PATH_CAP];
    kiln_status st = canonical(target, t);
    if (!st) st = canonical(source, r);
    if (!st) st = canonical(model_dir, b);
    if (st) return st;
    if (!strcmp(t, b) && strcmp(r, b))
        return kiln_error(KILN_ERR_INVALID,
                          "refusing to write %s: it is the checkpoint of %s being exported (its base weights and adapters "
                          "would be overwritten)",
                          target, source);
    if (!strcmp(t, b) || !strcmp(t, r))
        return kiln_error(KILN_ERR_INVALID, "refusing to write %s: it is the directory being exported (%s)", target, source);
    if (within(t, r))
        return kiln_error(KILN_ERR_INVALID, "refusing to write %s: it is inside %s, the directory being exported", target, source);
    if (within(t, b))
        return kiln_error(KILN_ERR_INVALID, "refusing to write %s: it is inside %s, the model directory being exported", target,
                          model_dir);
    /* the target and every directory above it: none may be a run or a
     * checkpoint (an export there would be taken for, or mix with, the
     * run's own files) */
    snprintf(up, sizeof up, "%s", t);
    for (;;) {
        struct stat s;
        if (stat(up, &s) == 0 && S_ISDIR(s.st_mode) && is_run_dir(up))
            return kiln_error(KILN_ERR_INVALID,
                              "refusing to write %s: %s is a run directory or a checkpoint (it holds trainer_state.json or "
                              "checkpoint-*/); export outside it",
                              target, up);
        char *slash = strrchr(up, '/');
        if (!slash || slash == up) break;
        *slash = 0;
    }
    /* the base a LoRA run was trained from (adapter_config.json's
     * base_model_name_or_path, when it is a directory here) */
    char ac[PATH_CAP + 32], base_dir[PATH_CAP];
    snprintf(ac, sizeof ac, "%s/adapter_config.json", b);
    json_t *o = json_load_file(ac, 0, NULL);
    const char *bm = json_string_value(json_object_get(o, "base_model_name_or_path"));
    struct stat s;
    if (bm && *bm && stat(bm, &s) == 0 && S_ISDIR(s.st_mode) && realpath(bm, base_dir) && within(t, base_dir)) {
        st = kiln_error(KILN_ERR_INVALID, "refusing to write %s: it is the base model directory %s of %s", target, bm, model_dir);
        json_decref(o);
        return st;
    }
    json_decref(o);
    if (lstat(t, &s) != 0) return KILN_OK;
    if (!S_ISDIR(s.st_mode)) return kiln_error(KILN_ERR_INVALID, "refusing to replace %s: it exists and is not a directory", target);
    /* an existing directory is replaced whole: only one kiln could have
     * written */
    DIR *d = opendir(t);
    if (!d) return kiln_error(KILN_ERR_IO, "cannot read %s: %s", target, strerror(errno));
    bool has_config = false;
    int n = 0;
    char odd[256] = "";
    for (struct dirent *e; (e = readdir(d));) {
        const char *nm = e->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..")) continue;
        n++;
        char p[PATH_CAP];
        bool reg = !join(p, t, nm) && lstat(p, &s) == 0 && S_ISREG(s.st_mode);
        if (reg && !strcmp(nm, "config.json")) has_config = true;
        if ((!reg || !model_file(nm)) && !odd[0]) {
            size_t k = strnlen(nm, 200);
            memcpy(odd, nm, k);
            odd[k] = 0;
            if (!reg) strcat(odd, " (not a regular file)");
        }
    }
    closedir(d);
    if (n && !has_config)
        return kiln_error(KILN_ERR_INVALID,
                          "refusing to replace %s: it is a non-empty directory without config.json, not a model directory "
                          "kiln writes (its files would be deleted); choose another -o or empty it",
                          target);
    if (odd[0])
        return kiln_error(KILN_ERR_INVALID,
                          "refusing to replace %s: it holds %s, which is not a file of a model directory kiln writes "
                          "(config.json, model weights, tokenizer and generation files); replacing the directory would "
                          "delete it",
                          target, odd);
    return KILN_OK;
}

static kiln_status copy_if_present(const char *from_dir, const char *to_dir, const char *name) {
    char src[PATH_CAP], dst[PATH_CAP];
    kiln_status st = join(src, from_dir, name);
    if (!st) st = join(dst, to_dir, name);
    if (st) return st;
    struct stat s;
    if (stat(src, &s) != 0) return KILN_OK;
    return kiln_copy_file_atomic(src, dst);
}

/* Moves the complete staging directory `tmp` to `final` in one step. */
static kiln_status swap_in(const char *tmp, const char *final, const char *parent, const char *base) {
    struct stat s;
    if (lstat(final, &s) != 0) {
        if (rename(tmp, final) != 0) return kiln_error(KILN_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
        return kiln_fsync_dir(parent);
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        kiln_status st = kiln_fsync_dir(parent);
        if (kiln_remove_tree(tmp)) /* now the old directory; the next export removes it */
            kiln_log(KILN_LOG_WARN, "kiln export: %s", kiln_last_error());
        return st;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
        return kiln_error(KILN_ERR_IO, "cannot exchange %s and %s: %s", tmp, final, strerror(errno));
    char old[PATH_CAP];
    if (snprintf(old, sizeof old, "%s/%s" OLD_TAG "%ld", parent, base, (long)getpid()) >= (int)sizeof old)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s", final);
    kiln_remove_tree(old);
    if (rename(final, old) != 0) return kiln_error(KILN_ERR_IO, "cannot move %s aside: %s", final, strerror(errno));
    if (rename(tmp, final) != 0) {
        int e = errno;
        rename(old, final);
        return kiln_error(KILN_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(e));
    }
    kiln_status st = kiln_fsync_dir(parent);
    if (kiln_remove_tree(old)) kiln_log(KILN_LOG_WARN, "kiln export: %s", kiln_last_error());
    return st;
}

kiln_status kiln_lora_export_merged(const char *run_or_model_dir, const char *out_dir) {
    char dir[PATH_CAP], path[PATH_CAP + 32], t[PATH_CAP], parent[PATH_CAP], base[PATH_CAP], tmp[PATH_CAP];
    kiln_status st = kiln_model_dir_resolve(run_or_model_dir, dir, sizeof dir);
    if (st) return st;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (access(path, F_OK) != 0)
        return kiln_error(KILN_ERR_INVALID, "%s has no LoRA adapters (%s is missing): nothing to merge", dir, path);
    if ((st = kiln_export_check_target(run_or_model_dir, dir, out_dir)) || (st = kiln_export_clean(out_dir)) ||
        (st = canonical(out_dir, t)))
        return st;
    split(t, parent, base);
    if (snprintf(tmp, sizeof tmp, "%s/%s" TMP_TAG "%ld", parent, base, (long)getpid()) >= (int)sizeof tmp)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s", t);
    kiln_llama *m = NULL;
    if ((st = kiln_load_model_dir(dir, &m))) return st;
    st = kiln_llama_lora_merge(m);
    if (!st) st = kiln_remove_tree(tmp);
    if (!st && mkdir(tmp, 0755) != 0) st = kiln_error(KILN_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    bool made = !st;
    snprintf(path, sizeof path, "%s/config.json", tmp);
    if (!st) st = kiln_llama_config_save(path, &m->cfg);
    kiln_weights_options wo = {KILN_F32, KILN_DEFAULT_SHARD_BYTES};
    if (!st) st = kiln_save_model_weights(tmp, m, &wo);
    kiln_llama_free(m);
    /* only these: never the adapters (they are in the weights now), the
     * optimiser or the trainer state */
    static const char *const extra[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                        "chat_template.jinja"};
    for (int i = 0; i < 4 && !st; i++) st = copy_if_present(dir, tmp, extra[i]);
    if (!st) st = kiln_fsync_dir(tmp);
    if (!st) st = swap_in(tmp, t, parent, base);
    if (st && made) {
        kiln_status keep = kiln_last_status();
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kiln_last_error());
        kiln_remove_tree(tmp);
        return kiln_error(keep ? keep : st, "exporting %s merged into %s: %s", dir, out_dir, msg);
    }
    return st ? kiln_error_context(st, "exporting %s merged into %s", dir, out_dir) : KILN_OK;
}
