/*
 * What the C tests of ffi/c/tests share: CHECK, which counts a failed check in `failures` and
 * goes on (main reports the count), and a monotonic clock. Included after the system headers.
 */

#ifndef CRESCENT_C_TESTS_CHECK_H
#define CRESCENT_C_TESTS_CHECK_H

#include <stdio.h>
#include <time.h>

#define MiB (1024u * 1024u)

static int failures = 0;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                             \
        }                                                                           \
    } while (0)

/* Seconds on the monotonic clock. */
static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

#endif
