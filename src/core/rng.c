/* Counter-based RNG: value i of a stream is a hash of (seed, counter), so a
 * parallel fill gives the same numbers for any thread count. The mixer is
 * splitmix64's finaliser applied to a Weyl sequence keyed by the seed. */
#include <math.h>
#include <string.h>
#include "kiln/core.h"

uint64_t kiln_rng_u64(uint64_t seed, uint64_t counter) {
    uint64_t z = seed * 0xd1342543de82ef95ull + (counter + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    /* a second round decorrelates nearby seeds */
    z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdull;
    z ^= z >> 33;
    return z;
}

static inline double u01(uint64_t x) { return (double)(x >> 11) * (1.0 / 9007199254740992.0); }

void kiln_rng_normal(kiln_rng *rng, float *out, int64_t n, float mean, float std) {
    uint64_t base = rng->offset, seed = rng->seed;
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        /* Box-Muller on two draws derived from element i's counter */
        uint64_t c = (base + (uint64_t)i) * 2;
        double u1 = u01(kiln_rng_u64(seed, c)), u2 = u01(kiln_rng_u64(seed, c + 1));
        if (u1 < 1e-300) u1 = 1e-300;
        double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        out[i] = (float)(mean + std * z);
    }
    rng->offset += (uint64_t)n;
}

void kiln_rng_uniform(kiln_rng *rng, float *out, int64_t n, float lo, float hi) {
    uint64_t base = rng->offset, seed = rng->seed;
    for (int64_t i = 0; i < n; i++)
        out[i] = (float)(lo + (hi - lo) * u01(kiln_rng_u64(seed ^ 0x5851f42d4c957f2dull, base + (uint64_t)i)));
    rng->offset += (uint64_t)n;
}

double kiln_rng_next_double(kiln_rng *rng) { return u01(kiln_rng_next_u64(rng)); }

uint64_t kiln_rng_next_u64(kiln_rng *rng) {
    return kiln_rng_u64(rng->seed ^ 0x2545f4914f6cdd1dull, rng->offset++);
}

uint64_t kiln_hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ kiln_hash_mix64(w)) * 0x100000001b3ULL;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    return kiln_hash_mix64(h ^ w);
}
