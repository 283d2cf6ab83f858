/*
 * Crescent's C ABI end to end: two store clients and two transfer engines in one process,
 * against a running crescent-master.
 *
 *   cargo build -p crescent-ffi-c          # target/debug/libcrescent.so + include/crescent.h
 *   gcc -std=c11 -Wall -Wextra -Werror -I target/debug/include examples/store_example.c \
 *       -L target/debug -lcrescent -Wl,-rpath,$PWD/target/debug -o store_example
 *   ./store_example 127.0.0.1:50051
 *
 * Prints what it checks and "store_example: all checks passed"; exits 1 at the first failure.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crescent.h"

static int failures = 0;

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "FAILED %s:%d: %s -- ", __FILE__, __LINE__, #cond);          \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fprintf(stderr, " (last error: %s)\n", crescent_last_error());                \
            failures++;                                                                   \
            return;                                                                       \
        }                                                                                 \
    } while (0)

#define MiB (1024u * 1024u)

static void fill(uint8_t *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 131u + seed * 7u) >> 3);
}

static void store_calls(const char *master) {
    CrescentStore *a = NULL, *b = NULL;
    int32_t rc = crescent_store_setup("127.0.0.1", "P2PHANDSHAKE", 64 * MiB, 16 * MiB, "tcp", "", master, &a);
    CHECK(rc == CRESCENT_OK, "setup a: %d", rc);
    /* NULLs and zeros take Mooncake's defaults (P2PHANDSHAKE, 16 MiB, tcp). */
    rc = crescent_store_setup("127.0.0.1", NULL, 0, 0, NULL, NULL, master, &b);
    CHECK(rc == CRESCENT_OK, "setup b: %d", rc);

    /* Bytes through the staging buffer: put on a, get on b. */
    const char *hello = "hello from C";
    CHECK(crescent_store_put(a, "c/hello", hello, strlen(hello)) == CRESCENT_OK, "put");
    char small[4], out[64];
    CHECK(crescent_store_get(b, "c/hello", small, sizeof small) == CRESCENT_ERR_BUFFER_OVERFLOW, "short buffer");
    int64_t n = crescent_store_get(b, "c/hello", out, sizeof out);
    CHECK(n == (int64_t)strlen(hello) && memcmp(out, hello, (size_t)n) == 0, "get: %lld", (long long)n);
    CHECK(crescent_store_get(b, "c/hello", NULL, 64) == CRESCENT_ERR_INVALID_PARAMS, "null buffer");
    CHECK(crescent_store_get_size(b, "c/hello") == (int64_t)strlen(hello), "get_size");
    CHECK(crescent_store_get(b, "c/missing", out, sizeof out) == CRESCENT_ERR_OBJECT_NOT_FOUND, "missing");
    CHECK(strstr(crescent_last_error(), "c/missing") != NULL, "the message names the key");
    printf("store: put/get of bytes between two clients ok\n");

    /* Zero copy: 4 values of 1 MiB + 3 from registered memory on a into registered memory on b. */
    enum { N = 4 };
    const size_t size = MiB + 3;
    uint8_t *src = malloc(N * size), *dst = calloc(N, size);
    CHECK(src && dst, "malloc");
    fill(src, N * size, 1);
    CHECK(crescent_store_register_buffer(a, src, N * size) == CRESCENT_OK, "register src");
    CHECK(crescent_store_register_buffer(b, dst, N * size) == CRESCENT_OK, "register dst");
    const char *keys[N] = {"c/zc/0", "c/zc/1", "c/zc/2", "c/zc/3"};
    const void *srcs[N];
    void *dsts[N];
    size_t sizes[N];
    for (int i = 0; i < N; i++) {
        srcs[i] = src + i * size;
        dsts[i] = dst + i * size;
        sizes[i] = size;
    }
    int32_t put_results[N];
    int64_t get_results[N];
    CHECK(crescent_store_batch_put_from(a, keys, srcs, sizes, N, put_results) == CRESCENT_OK, "batch_put_from");
    for (int i = 0; i < N; i++) CHECK(put_results[i] == CRESCENT_OK, "put %d: %d", i, put_results[i]);
    CHECK(crescent_store_batch_get_into(b, keys, dsts, sizes, N, get_results) == CRESCENT_OK, "batch_get_into");
    for (int i = 0; i < N; i++) CHECK(get_results[i] == (int64_t)size, "get %d: %lld", i, (long long)get_results[i]);
    CHECK(memcmp(src, dst, N * size) == 0, "zero-copy bytes differ");
    CHECK(crescent_store_put_from(a, "c/zc/one", src, 100) == CRESCENT_OK, "put_from");
    CHECK(crescent_store_get_into(b, "c/zc/one", dst, 99) == CRESCENT_ERR_BUFFER_OVERFLOW, "short get_into");
    CHECK(crescent_store_get_into(b, "c/zc/one", dst, 100) == 100, "get_into");
    uint8_t unregistered[16];
    CHECK(crescent_store_get_into(b, "c/zc/one", unregistered, sizeof unregistered) == CRESCENT_ERR_INVALID_PARAMS,
          "unregistered memory is refused");
    printf("store: zero-copy batch of %d x %zu bytes ok\n", N, size);

    /* Existence, removal. */
    int32_t exists[3];
    const char *probe[3] = {"c/zc/0", "c/nope", "c/hello"};
    CHECK(crescent_store_exists(b, "c/hello") == 1 && crescent_store_exists(b, "c/nope") == 0, "exists");
    CHECK(crescent_store_batch_exists(b, probe, 3, exists) == CRESCENT_OK, "batch_exists");
    CHECK(exists[0] == 1 && exists[1] == 0 && exists[2] == 1, "batch_exists: %d %d %d", exists[0], exists[1],
          exists[2]);
    /* Read objects are leased (10 s by default): removal is refused meanwhile. */
    CHECK(crescent_store_remove(a, "c/hello") == CRESCENT_ERR_OBJECT_HAS_LEASE, "leased");
    const char *rm[3] = {"c/rm/0", "c/rm/1", "c/rm/2"};
    for (int i = 0; i < 3; i++) CHECK(crescent_store_put(a, rm[i], "x", 1) == CRESCENT_OK, "put %s", rm[i]);
    CHECK(crescent_store_remove(a, "c/rm/0") == CRESCENT_OK, "remove");
    CHECK(crescent_store_remove(a, "c/rm/0") == CRESCENT_ERR_OBJECT_NOT_FOUND, "remove twice");
    CHECK(crescent_store_remove_by_regex(a, "^c/rm/[0-9]$") == 2, "remove_by_regex");
    CHECK(crescent_store_batch_exists(b, rm, 3, exists) == CRESCENT_OK, "batch_exists");
    CHECK(exists[0] == 0 && exists[1] == 0 && exists[2] == 0, "removed");
    CHECK(crescent_store_remove_all(a) >= 0, "remove_all");
    printf("store: exists / remove / remove_by_regex / remove_all ok\n");

    /* Placement per put (Mooncake's ReplicateConfig): a third client's segment preferred. */
    CrescentStore *c = NULL;
    CHECK(crescent_store_setup("127.0.0.1", NULL, 0, 0, NULL, NULL, master, &c) == CRESCENT_OK, "setup c");
    char on_c[256];
    CHECK(crescent_store_segment_name(c, on_c, sizeof on_c) > 0, "segment name of c");
    CrescentReplicateConfig config = crescent_replicate_config_default();
    CHECK(config.replica_num == 1 && !config.with_soft_pin && !config.with_hard_pin, "defaults");
    config.preferred_segment = on_c;
    CHECK(crescent_store_put_with(a, "c/on-c/bytes", "x", 1, &config) == CRESCENT_OK, "put_with");
    CHECK(crescent_store_put_from_with(a, "c/on-c/zc", src, 100, &config) == CRESCENT_OK, "put_from_with");
    const char *placed[2] = {"c/on-c/batch", "c/on-c-and-a"};
    CHECK(crescent_store_batch_put_from_with(a, placed, srcs, sizes, 1, put_results, &config) == CRESCENT_OK &&
              put_results[0] == CRESCENT_OK,
          "batch_put_from_with");
    config.replica_num = 2; /* on c, then on a (the master's local-first choice) */
    CHECK(crescent_store_put_with(a, placed[1], "y", 1, &config) == CRESCENT_OK, "two replicas");
    config.replica_num = 0;
    CHECK(crescent_store_put_with(a, "c/none", "z", 1, &config) == CRESCENT_ERR_INVALID_PARAMS, "replica_num 0");
    CHECK(crescent_store_close(c) == CRESCENT_OK, "close c");
    /* c left with its segment: what was only there is gone, the second replica stays. */
    CHECK(crescent_store_exists(a, "c/on-c/bytes") == 0 && crescent_store_exists(a, "c/on-c/zc") == 0 &&
              crescent_store_exists(a, placed[0]) == 0,
          "objects placed on c went with it");
    CHECK(crescent_store_get(b, placed[1], out, sizeof out) == 1 && out[0] == 'y', "a replica outlives c");
    printf("store: put_with / put_from_with / batch_put_from_with place on the preferred segment ok\n");

    /* Bad arguments and handles: errors, never crashes. */
    CHECK(crescent_store_put(NULL, "k", "v", 1) == CRESCENT_ERR_INVALID_HANDLE, "null handle");
    CHECK(crescent_store_put((CrescentStore *)(uintptr_t)0x1234, "k", "v", 1) == CRESCENT_ERR_INVALID_HANDLE,
          "forged handle");
    CHECK(crescent_store_put(a, NULL, "v", 1) == CRESCENT_ERR_INVALID_PARAMS, "null key");
    CHECK(crescent_store_put(a, "k", NULL, 1) == CRESCENT_ERR_INVALID_PARAMS, "null value");
    CHECK(crescent_store_batch_exists(a, NULL, 2, exists) == CRESCENT_ERR_INVALID_PARAMS, "null keys");
    CHECK(crescent_store_batch_exists(a, probe, 3, NULL) == CRESCENT_ERR_INVALID_PARAMS, "null results");
    CHECK(crescent_store_unregister_buffer(a, src) == CRESCENT_OK, "unregister src");
    CHECK(crescent_store_unregister_buffer(b, dst) == CRESCENT_OK, "unregister dst");
    CHECK(crescent_store_close(a) == CRESCENT_OK, "close a");
    CHECK(crescent_store_close(a) == CRESCENT_ERR_INVALID_HANDLE, "closed handle");
    CHECK(crescent_store_exists(a, "k") == CRESCENT_ERR_INVALID_HANDLE, "use after close");
    CHECK(crescent_store_close(b) == CRESCENT_OK, "close b");
    free(src);
    free(dst);
    printf("store: null / forged / closed handles and null arguments are errors\n");
}

static void engine_calls(void) {
    CrescentEngine *e1 = NULL, *e2 = NULL;
    CHECK(crescent_engine_new("127.0.0.1", NULL, "tcp", &e1) == CRESCENT_OK, "engine 1");
    CHECK(crescent_engine_new("127.0.0.1", "P2PHANDSHAKE", NULL, &e2) == CRESCENT_OK, "engine 2");
    CHECK(crescent_engine_rpc_port(e1) > 0, "rpc port");

    /* e1 serves 2 MiB of its own memory; e2 reads and writes it. */
    void *target = NULL, *local = NULL;
    CHECK(crescent_engine_alloc(e1, 2 * MiB, &target) == CRESCENT_OK && target, "alloc target");
    fill(target, 2 * MiB, 5);
    CHECK(crescent_engine_alloc(e2, 2 * MiB, &local) == CRESCENT_OK && local, "alloc local");
    char name[8];
    CHECK(crescent_engine_segment_name(e1, name, sizeof name) == CRESCENT_ERR_BUFFER_OVERFLOW, "short name buffer");
    char segment_name[256];
    CHECK(crescent_engine_segment_name(e1, segment_name, sizeof segment_name) > 0, "segment name");
    uint64_t seg = 0, base = 0, len = 0;
    CHECK(crescent_engine_open_segment(e2, segment_name, &seg) == CRESCENT_OK, "open %s", segment_name);
    CHECK(crescent_engine_segment_buffer(e2, seg, 0, &base, &len) >= 1, "segment buffer");
    CHECK(base == (uint64_t)(uintptr_t)target && len >= 2 * MiB, "the target's buffer");

    /* A batch of two reads, polled, then waited. */
    CrescentTransferRequest reqs[2] = {
        {CRESCENT_OPCODE_READ, local, seg, base, MiB},
        {CRESCENT_OPCODE_READ, (uint8_t *)local + MiB, seg, base + MiB, MiB},
    };
    uint64_t batch = 0;
    CHECK(crescent_engine_allocate_batch(e2, 4, &batch) == CRESCENT_OK, "allocate batch");
    CHECK(crescent_engine_submit(e2, batch, reqs, 2) == CRESCENT_OK, "submit");
    int32_t st[4];
    CHECK(crescent_engine_batch_status(e2, batch, st, 1) == CRESCENT_ERR_BUFFER_OVERFLOW, "short status array");
    CHECK(crescent_engine_batch_status(e2, batch, st, 4) == 2, "poll");
    CHECK(crescent_engine_wait_batch(e2, batch, -1, st, 4) == 2, "wait");
    CHECK(st[0] == CRESCENT_TRANSFER_COMPLETED && st[1] == CRESCENT_TRANSFER_COMPLETED, "statuses %d %d", st[0],
          st[1]);
    CHECK(memcmp(local, target, 2 * MiB) == 0, "read bytes differ");
    /* Out of the target's memory: that request fails, the batch is still usable. */
    CrescentTransferRequest outside = {CRESCENT_OPCODE_READ, local, seg, base + len - 1, 2};
    CHECK(crescent_engine_submit(e2, batch, &outside, 1) == CRESCENT_OK, "submit outside");
    CHECK(crescent_engine_wait_batch(e2, batch, -1, st, 4) == 3 && st[2] == CRESCENT_TRANSFER_FAILED,
          "out of range: %d", st[2]);
    CHECK(crescent_engine_free_batch(e2, batch) == CRESCENT_OK, "free batch");
    CHECK(crescent_engine_free_batch(e2, batch) == CRESCENT_ERR_INVALID_HANDLE, "free batch twice");

    /* A blocking write back. */
    memset(local, 0xAB, 4096);
    CrescentTransferRequest write = {CRESCENT_OPCODE_WRITE, local, seg, base + 4096, 4096};
    CHECK(crescent_engine_transfer_sync(e2, &write, 1) == CRESCENT_OK, "transfer_sync");
    CHECK(((uint8_t *)target)[4096] == 0xAB && ((uint8_t *)target)[8191] == 0xAB, "written bytes");
    CrescentTransferRequest bad = {7, local, seg, base, 1};
    CHECK(crescent_engine_transfer_sync(e2, &bad, 1) == CRESCENT_ERR_INVALID_PARAMS, "bad opcode");
    CHECK(crescent_engine_transfer_sync(e2, NULL, 1) == CRESCENT_ERR_INVALID_PARAMS, "null requests");
    CHECK(crescent_engine_open_segment(e2, "127.0.0.1:1", &seg) < 0, "unreachable segment");

    /* Handles of the wrong kind, freed handles. */
    CHECK(crescent_store_exists((CrescentStore *)(void *)e1, "k") == CRESCENT_ERR_INVALID_HANDLE, "wrong kind");
    CHECK(crescent_engine_free_buffer(e1, target) == CRESCENT_OK, "free buffer");
    CHECK(crescent_engine_free_buffer(e1, target) == CRESCENT_ERR_INVALID_PARAMS, "free buffer twice");
    CHECK(crescent_engine_free(e1) == CRESCENT_OK && crescent_engine_free(e2) == CRESCENT_OK, "free engines");
    CHECK(crescent_engine_free(e1) == CRESCENT_ERR_INVALID_HANDLE, "free twice");
    CHECK(strcmp(crescent_status_name(CRESCENT_ERR_INVALID_HANDLE), "INVALID_HANDLE") == 0, "status name");
    printf("engine: batch submit/poll/wait, transfer_sync, bounds and handle checks ok\n");
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MASTER_HOST:PORT\n", argv[0]);
        return 2;
    }
    store_calls(argv[1]);
    if (!failures) engine_calls();
    if (failures) {
        fprintf(stderr, "store_example: FAILED\n");
        return 1;
    }
    printf("store_example: all checks passed\n");
    return 0;
}
