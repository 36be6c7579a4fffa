/* Internal to the compile layer: dlopen() of a module file that was checked,
 * through the very descriptor that was hashed. */
#ifndef KILN_LOADED_H
#define KILN_LOADED_H
#include "kiln/core.h"
typedef struct kiln_loaded kiln_loaded;
/* Loads the open file fd (taken over, closed on failure); `path` names it
 * in messages. NULL + error. A file already loaded (same device and inode)
 * shares its handle. */
kiln_loaded *kiln_loaded_open(int fd, const char *path);
void *kiln_loaded_handle(const kiln_loaded *l);
/* dlclose()s when the last user is gone. NULL not allowed. */
void kiln_loaded_close(kiln_loaded *l);
#endif
