/* Loading checked module files (see loaded.h). */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "loaded.h"

/* Modules are dlopen()ed through the descriptor of the file that was hashed
 * (/proc/self/fd/N names the open file itself, not a path that could be
 * swapped). The dynamic loader knows a loaded object by that name, though:
 * were N closed and reused for another file while the object is still
 * loaded, dlopen() of the new /proc/self/fd/N would return the old object.
 * So a loaded file keeps its descriptor open as long as it is loaded, and a
 * file loaded twice (the same device and inode) shares one handle. */
struct kiln_loaded {
    dev_t dev;
    ino_t ino;
    int fd, refs;
    void *handle; /* one dlopen() reference, held by this entry */
    kiln_loaded *next;
};
static kiln_loaded *loaded_files;
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

static void fd_path(char out[64], int fd) { snprintf(out, 64, "/proc/self/fd/%d", fd); }

/* The loaded entry for the open file fd (taking fd over), or NULL + error. */
kiln_loaded *kiln_loaded_open(int fd, const char *path) {
    struct stat st;
    char fdp[64];
    if (fstat(fd, &st) != 0) {
        kiln_error(KILN_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    pthread_mutex_lock(&load_mu);
    kiln_loaded *e = loaded_files;
    while (e && (e->dev != st.st_dev || e->ino != st.st_ino)) e = e->next;
    if (e) {
        e->refs++;
        close(fd);
    } else if (!(e = calloc(1, sizeof *e))) {
        kiln_error(KILN_ERR_OOM, "out of memory");
        close(fd);
    } else {
        fd_path(fdp, fd);
        *e = (kiln_loaded){.dev = st.st_dev, .ino = st.st_ino, .fd = fd, .refs = 1, .next = loaded_files};
        if ((e->handle = dlopen(fdp, RTLD_NOW | RTLD_LOCAL))) {
            loaded_files = e;
        } else {
            kiln_error(KILN_ERR_IO, "cannot load %s (through %s): %s", path, fdp, dlerror());
            close(fd);
            free(e);
            e = NULL;
        }
    }
    pthread_mutex_unlock(&load_mu);
    return e;
}

void kiln_loaded_close(kiln_loaded *e) {
    char fdp[64];
    pthread_mutex_lock(&load_mu);
    if (--e->refs == 0) {
        dlclose(e->handle);
        fd_path(fdp, e->fd);
        /* an object the loader keeps (marked not to be deleted) keeps its name */
        e->handle = dlopen(fdp, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
        if (!e->handle) {
            kiln_loaded **p = &loaded_files;
            while (*p != e) p = &(*p)->next;
            *p = e->next;
            close(e->fd);
            free(e);
        }
    }
    pthread_mutex_unlock(&load_mu);
}

void *kiln_loaded_handle(const kiln_loaded *e) { return e->handle; }
