/* How much memory this process could still take, so a model too large for
 * the machine is refused before anything is allocated (instead of the
 * kernel's OOM killer ending the run halfway through initialisation). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "kiln/core.h"

/* One unsigned number from a one-line file ("max" and errors: 0). */
static uint64_t read_u64_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[64];
    int64_t v = 0;
    if (!fgets(line, sizeof line, f) || kiln_parse_leading_i64(line, 0, INT64_MAX, &v)) v = 0;
    fclose(f);
    return (uint64_t)v;
}

static uint64_t meminfo_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    int64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "MemAvailable:", 13)) { /* "MemAvailable:   1234 kB" */
            if (kiln_parse_leading_i64(line + 13 + strspn(line + 13, " \t"), 0, INT64_MAX / 1024, &kb)) kb = 0;
            break;
        }
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* Room left under a container's memory limit (cgroup v2, else v1); 0: no
 * limit found. */
static uint64_t cgroup_room(void) {
    static const char *const lim[][2] = {
        {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"},
    };
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++) {
        uint64_t max = read_u64_file(lim[i][0]);
        if (!max || max >= (UINT64_MAX >> 2)) continue; /* "max" or the v1 "unlimited" sentinel */
        uint64_t used = read_u64_file(lim[i][1]);
        return used < max ? max - used : 1;
    }
    return 0;
}

uint64_t kiln_mem_available_bytes(const char **source) {
    const char *src = "MemAvailable in /proc/meminfo";
    uint64_t avail = meminfo_available();
    if (!avail) {
        long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0) {
            avail = (uint64_t)pages * (uint64_t)page;
            src = "available pages from sysconf";
        }
    }
    uint64_t room = cgroup_room();
    if (room && (!avail || room < avail)) {
        avail = room;
        src = "room left under the cgroup memory limit";
    }
    if (source) *source = avail ? src : "unknown";
    return avail;
}
