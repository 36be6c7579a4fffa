/* TensorBoard event files (tfevents.c): TFRecord framing around hand-encoded
 * tensorflow.Event protobufs, written by the trainer beside metrics.jsonl.
 * Not a public header. */
#ifndef KILN_TFEVENTS_H
#define KILN_TFEVENTS_H
#include <stdint.h>
#include "kiln/core.h"

typedef struct kiln_tfevents kiln_tfevents;

/* Creates dir/events.out.tfevents.<time>.<host>.<pid>.kiln (a new file per
 * call, as TensorFlow starts one per process; <time> is past that of the
 * directory's other events files, so that name order is the order they were
 * written; ".<n>.kiln" when the name is taken) and writes its first records: the Event with file_version
 * "brain.Event:2", then a SessionLog START at first_step, after which
 * TensorBoard drops what earlier files of the directory logged at
 * first_step or later (a resumed run logs those steps again; a fresh run
 * starts at step 1). */
kiln_status kiln_tfevents_open(const char *dir, int64_t first_step, kiln_tfevents **out);
/* One Event at `step` with a Summary of n scalars (tags[i], values[i] as
 * float32): one append-mode write(2), so a killed process loses nothing it
 * wrote before. */
kiln_status kiln_tfevents_scalars(kiln_tfevents *w, int64_t step, const char *const *tags, const double *values, int n);
const char *kiln_tfevents_path(const kiln_tfevents *w);
void kiln_tfevents_close(kiln_tfevents *w);

/* CRC-32C (Castagnoli) of n bytes, and TFRecord's mask of a CRC. */
uint32_t kiln_crc32c(const void *p, size_t n);
static inline uint32_t kiln_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
#endif
