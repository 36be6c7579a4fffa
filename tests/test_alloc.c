/* The caching allocator's counters (what `kiln bench` reports as the
 * allocator's peak): live, cached and peak bytes and cache hits follow a
 * sequence of allocations whose sizes the test knows; reset_peak and trim. */
#include "test.h"

int main(void) {
    kiln_alloc_trim();
    kiln_alloc_reset_peak();
    kiln_alloc_stats s0 = kiln_alloc_get_stats();
    CHECK(s0.cached_bytes == 0 && s0.peak_bytes == s0.live_bytes, "after trim and reset: %zu cached, peak %zu, live %zu",
          s0.cached_bytes, s0.peak_bytes, s0.live_bytes);
    const size_t n = 3 << 20;
    void *a = kiln_alloc(n), *b = kiln_alloc(n);
    CHECK(a && b && ((uintptr_t)a & 63) == 0 && ((uintptr_t)b & 63) == 0, "two 64-byte aligned blocks");
    memset(a, 1, n), memset(b, 2, n);
    kiln_alloc_stats s1 = kiln_alloc_get_stats();
    size_t grew = s1.live_bytes - s0.live_bytes;
    CHECK(grew >= 2 * n && grew < 2 * n + (2 << 20), "live bytes grew by %zu for two %zu-byte blocks", grew, n);
    CHECK(s1.peak_bytes >= s1.live_bytes + s1.cached_bytes, "peak %zu covers live + cached", s1.peak_bytes);
    CHECK(s1.n_alloc == s0.n_alloc + 2, "two allocations counted (%llu)", (unsigned long long)(s1.n_alloc - s0.n_alloc));
    kiln_dealloc(a);
    kiln_alloc_stats s2 = kiln_alloc_get_stats();
    CHECK(s2.live_bytes == s1.live_bytes - grew / 2 && s2.cached_bytes == s1.cached_bytes + grew / 2,
          "a freed block moves from live to cached (%zu, %zu)", s2.live_bytes, s2.cached_bytes);
    void *c = kiln_alloc(n);
    kiln_alloc_stats s3 = kiln_alloc_get_stats();
    CHECK(c == a && s3.n_hits == s2.n_hits + 1 && s3.cached_bytes == s2.cached_bytes - grew / 2,
          "the same size is served from the cache (hit %d)", c == a);
    CHECK(s3.peak_bytes == s1.peak_bytes, "reuse does not raise the peak (%zu vs %zu)", s3.peak_bytes, s1.peak_bytes);
    kiln_dealloc(b);
    kiln_dealloc(c);
    kiln_alloc_stats s4 = kiln_alloc_get_stats();
    CHECK(s4.live_bytes == s0.live_bytes && s4.cached_bytes >= grew, "both blocks cached (%zu)", s4.cached_bytes);
    kiln_alloc_trim();
    kiln_alloc_stats s5 = kiln_alloc_get_stats();
    CHECK(s5.cached_bytes == 0 && s5.live_bytes == s0.live_bytes && s5.peak_bytes == s1.peak_bytes,
          "trim returns the cache and keeps the peak (%zu cached, %zu live)", s5.cached_bytes, s5.live_bytes);
    kiln_alloc_reset_peak();
    kiln_alloc_stats s6 = kiln_alloc_get_stats();
    CHECK(s6.peak_bytes == s6.live_bytes && s6.peak_bytes < s1.peak_bytes, "reset_peak lowers the peak to what is held (%zu)",
          s6.peak_bytes);
    TEST_END();
}
