/*
 * Every function of transfer_engine_c.h (Mooncake's C interface, Crescent's
 * libtransfer_engine) between two engines of this process: data moved and compared byte for
 * byte, notifications, and bad input getting Mooncake's codes.
 *
 *   gcc -std=c11 -Wall -Wextra -Werror -I <target>/debug/include \
 *       ffi/c/tests/transfer_engine_test.c -L <target>/debug -ltransfer_engine -o te_test
 *
 * Run as is (same host: the shm transport) and with MC_FORCE_TCP=1 (tcp).
 */

#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transfer_engine_c.h"
#include "check.h"

/* The layouts of upstream's structs (LP64), as the library's Rust tests assert them. */
_Static_assert(sizeof(struct transfer_request) == 40, "transfer_request size");
_Static_assert(offsetof(struct transfer_request, source) == 8, "transfer_request.source");
_Static_assert(offsetof(struct transfer_request, target_id) == 16, "transfer_request.target_id");
_Static_assert(offsetof(struct transfer_request, target_offset) == 24, "transfer_request.target_offset");
_Static_assert(offsetof(struct transfer_request, length) == 32, "transfer_request.length");
_Static_assert(sizeof(notify_msg_t) == 16 && offsetof(notify_msg_t, msg) == 8, "notify_msg");
_Static_assert(sizeof(transfer_status_t) == 16 && offsetof(transfer_status_t, transferred_bytes) == 8,
               "transfer_status");
_Static_assert(sizeof(buffer_entry_t) == 16 && offsetof(buffer_entry_t, length) == 8, "buffer_entry");
_Static_assert(sizeof(nic_load_stat_t) == 80 && offsetof(nic_load_stat_t, ewma_bandwidth_bps) == 72,
               "nic_load_stat");

/* Each function with upstream's exact prototype: a header that drifted fails to compile. */
static transfer_engine_t (*const p_create)(const char *, const char *, const char *, uint64_t, int) =
    createTransferEngine;
static int (*const p_discover)(transfer_engine_t) = discoverTopology;
static int (*const p_ip_port)(transfer_engine_t, char *, size_t) = getLocalIpAndPort;
static transport_t (*const p_install)(transfer_engine_t, const char *, void **) = installTransport;
static int (*const p_uninstall)(transfer_engine_t, const char *) = uninstallTransport;
static segment_id_t (*const p_open)(transfer_engine_t, const char *) = openSegment;
static segment_id_t (*const p_open_nocache)(transfer_engine_t, const char *) = openSegmentNoCache;
static int (*const p_close)(transfer_engine_t, segment_id_t) = closeSegment;
static int (*const p_warmup)(transfer_engine_t, const char *) = warmupEfaSegment;
static int (*const p_remove)(transfer_engine_t, const char *) = removeLocalSegment;
static void (*const p_destroy)(transfer_engine_t) = destroyTransferEngine;
static int (*const p_reg)(transfer_engine_t, void *, size_t, const char *, int) = registerLocalMemory;
static int (*const p_unreg)(transfer_engine_t, void *) = unregisterLocalMemory;
static int (*const p_reg_batch)(transfer_engine_t, buffer_entry_t *, size_t, const char *) = registerLocalMemoryBatch;
static int (*const p_unreg_batch)(transfer_engine_t, void **, size_t) = unregisterLocalMemoryBatch;
static batch_id_t (*const p_alloc)(transfer_engine_t, size_t) = allocateBatchID;
static int (*const p_submit)(transfer_engine_t, batch_id_t, struct transfer_request *, size_t) = submitTransfer;
static int (*const p_submit_notify)(transfer_engine_t, batch_id_t, struct transfer_request *, size_t, notify_msg_t) =
    submitTransferWithNotify;
static notify_msg_t *(*const p_notifs)(transfer_engine_t, int *) = getNotifsFromEngine;
static int (*const p_free_notifs)(notify_msg_t *, int) = freeNotifsMsgBuf;
static int (*const p_gen_notify)(transfer_engine_t, uint64_t, notify_msg_t) = genNotifyInEngine;
static int (*const p_status)(transfer_engine_t, batch_id_t, size_t, struct transfer_status *) = getTransferStatus;
static int (*const p_free_batch)(transfer_engine_t, batch_id_t) = freeBatchID;
static int (*const p_sync)(transfer_engine_t) = syncSegmentCache;
static int (*const p_nic_stats)(transfer_engine_t, nic_load_stat_t *, size_t *) = getNicLoadStats;
static void (*const p_graceful)(transfer_engine_t) = enableGracefulShutdown;
static int (*const p_links)(transfer_engine_t, char *, size_t, int) = showLinks;

static void nap(void) {
    struct timespec t = {0, 2 * 1000 * 1000};
    nanosleep(&t, NULL);
}

/* Polls task `task` of `batch` until it ends (30 s at most); its final status. */
static transfer_status_t wait_task(transfer_engine_t e, batch_id_t batch, size_t task) {
    transfer_status_t st = {STATUS_WAITING, 0};
    double end = now() + 30;
    while (now() < end) {
        if (p_status(e, batch, task, &st) != 0) break;
        if (st.status != STATUS_WAITING && st.status != STATUS_PENDING) break;
        nap();
    }
    return st;
}

/* The notifications `e` receives within 10 s until `want` came (all taken), copied out. */
static int take_notifs(transfer_engine_t e, int want, char names[][32], char msgs[][64], int max) {
    int got = 0;
    double end = now() + 10;
    do {
        int size = -1;
        notify_msg_t *list = p_notifs(e, &size);
        CHECK(size >= 0);
        CHECK((size == 0) == (list == NULL));
        for (int i = 0; i < size && got < max; i++, got++) {
            snprintf(names[got], 32, "%s", list[i].name);
            snprintf(msgs[got], 64, "%s", list[i].msg);
        }
        CHECK(p_free_notifs(list, size) == 0);
        if (got < want) nap();
    } while (got < want && now() < end);
    return got;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 31 + seed * 7 + (i >> 11)) & 0xff);
}

int main(void) {
    /* Engines: a bad connection string, then two on loopback (a port asked for is ignored with
     * P2PHANDSHAKE, as Mooncake does). */
    CHECK(p_create(NULL, "127.0.0.1", "", 0, 1) == NULL);
    CHECK(p_create("carrier-pigeon://x", "127.0.0.1", "", 0, 1) == NULL);
    transfer_engine_t a = p_create("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    transfer_engine_t b = p_create("P2PHANDSHAKE", "127.0.0.1:1", NULL, 0, 0);
    if (!a || !b) {
        fprintf(stderr, "createTransferEngine failed\n");
        return 1;
    }
    CHECK(p_discover(a) == 0);
    char name_a[64], name_b[64], tiny[5];
    CHECK(p_ip_port(a, name_a, sizeof name_a) == 0 && strncmp(name_a, "127.0.0.1:", 10) == 0);
    CHECK(p_ip_port(b, name_b, sizeof name_b) == 0 && strcmp(name_b, "127.0.0.1:1") != 0);
    CHECK(p_ip_port(a, tiny, sizeof tiny) == 0 && strcmp(tiny, "127.") == 0);
    CHECK(p_ip_port(a, NULL, 8) == -1);
    CHECK(p_install(a, "tcp", NULL) != NULL);
    CHECK(p_install(a, "nvlink", NULL) == NULL);
    CHECK(p_install(a, NULL, NULL) == NULL);
    CHECK(p_uninstall(a, "tcp") == 0);

    /* Memory: a's 4 MiB in one region, b's in two (a batch). */
    unsigned char *abuf = aligned_alloc(4096, 4 * MiB), *bbuf = aligned_alloc(4096, 4 * MiB);
    unsigned char *unregistered = malloc(4096);
    fill(abuf, 4 * MiB, 1);
    memset(bbuf, 0, 4 * MiB);
    CHECK(p_reg(a, abuf, 4 * MiB, "cpu:0", 1) == 0);
    CHECK(p_reg(a, abuf + 4096, 100, "*", 1) == -7);         /* ERR_ADDRESS_OVERLAPPED */
    CHECK(p_reg(a, NULL, 10, "*", 1) == -1);                 /* ERR_INVALID_ARGUMENT */
    CHECK(p_reg(a, unregistered, 0, NULL, 1) == -1);         /* zero length */
    buffer_entry_t regions[2] = {{bbuf, 2 * MiB}, {bbuf + 2 * MiB, 2 * MiB}};
    CHECK(p_reg_batch(b, regions, 2, "cpu:0") == 0);
    CHECK(p_reg_batch(b, NULL, 1, "*") == -1);
    buffer_entry_t overlapping[1] = {{bbuf + 100, 10}};
    CHECK(p_reg_batch(b, overlapping, 1, NULL) == -7);

    /* Segments. */
    segment_id_t seg = p_open(a, name_b);
    CHECK(seg > 0);
    CHECK(p_open(a, name_b) == seg);
    CHECK(p_open_nocache(a, name_b) == seg);
    CHECK(p_open(a, name_a) == LOCAL_SEGMENT);
    CHECK(p_open(a, "127.0.0.1:1") == -1);
    CHECK(p_open(a, "") == -1);
    CHECK(p_open(a, NULL) == -1);
    CHECK(p_open_nocache(a, "127.0.0.1:1") == -1);

    /* A write and a read in one batch (task ids count across submissions). */
    batch_id_t batch = p_alloc(a, 8);
    CHECK(batch != INVALID_BATCH);
    struct transfer_request w = {OPCODE_WRITE, abuf, seg, (uint64_t)(uintptr_t)(bbuf + 100), MiB};
    CHECK(p_submit(a, batch, &w, 1) == 0);
    transfer_status_t st = wait_task(a, batch, 0);
    CHECK(st.status == STATUS_COMPLETED && st.transferred_bytes == MiB);
    CHECK(memcmp(bbuf + 100, abuf, MiB) == 0);
    fill(bbuf + 3 * MiB, 512 * 1024, 2);
    struct transfer_request r = {OPCODE_READ, abuf + 2 * MiB, seg, (uint64_t)(uintptr_t)(bbuf + 3 * MiB), 512 * 1024};
    CHECK(p_submit(a, batch, &r, 1) == 0);
    st = wait_task(a, batch, 1);
    CHECK(st.status == STATUS_COMPLETED && st.transferred_bytes == 512 * 1024);
    CHECK(memcmp(abuf + 2 * MiB, bbuf + 3 * MiB, 512 * 1024) == 0);
    CHECK(p_status(a, batch, 2, &st) == 1); /* task id out of range: kInvalidArgument */
    CHECK(p_status(a, batch, 0, NULL) == 1);
    /* Across the boundary of b's two regions, and to a's own segment. */
    struct transfer_request span = {OPCODE_WRITE, abuf, seg, (uint64_t)(uintptr_t)(bbuf + 2 * MiB - 1000), 3000};
    struct transfer_request self = {OPCODE_WRITE, abuf, LOCAL_SEGMENT, (uint64_t)(uintptr_t)(abuf + 3 * MiB), 4096};
    struct transfer_request two[2] = {span, self};
    CHECK(p_submit(a, batch, two, 2) == 0);
    CHECK(wait_task(a, batch, 2).status == STATUS_COMPLETED && wait_task(a, batch, 3).status == STATUS_COMPLETED);
    CHECK(memcmp(bbuf + 2 * MiB - 1000, abuf, 3000) == 0 && memcmp(abuf + 3 * MiB, abuf, 4096) == 0);

    /* Bad requests: Mooncake's Status codes, nothing moved. */
    struct transfer_request bad = w;
    bad.target_id = 999;
    CHECK(p_submit(a, batch, &bad, 1) == 1); /* unknown segment: kInvalidArgument */
    bad = w;
    bad.source = unregistered;
    CHECK(p_submit(a, batch, &bad, 1) == 3); /* kAddressNotRegistered */
    bad = w;
    bad.opcode = 7;
    CHECK(p_submit(a, batch, &bad, 1) == 1);
    CHECK(p_submit(a, batch, NULL, 1) == 1);
    CHECK(p_submit(a, batch, &w, 0) == 0);
    /* Out of b's registered memory: submitted, then the task fails. */
    struct transfer_request oor = {OPCODE_READ, abuf, seg, (uint64_t)(uintptr_t)(bbuf + 4 * MiB - 8), 64};
    CHECK(p_submit(a, batch, &oor, 1) == 0);
    CHECK(wait_task(a, batch, 4).status == STATUS_FAILED);
    CHECK(p_free_batch(a, batch) == 0);
    CHECK(p_free_batch(a, batch) == 1);
    CHECK(p_submit(a, batch, &w, 1) == 1); /* a freed batch */
    batch_id_t small = p_alloc(a, 1);
    CHECK(p_submit(a, small, two, 2) == 2); /* kTooManyRequests */
    CHECK(p_free_batch(a, small) == 0);
    CHECK(p_alloc(a, 0) == INVALID_BATCH);

    /* Notifications: after the batch completed, exactly once; none for a failed one. */
    char names[8][32], msgs[8][64];
    batch = p_alloc(a, 4);
    notify_msg_t kv_ready = {"agent-a", "kv ready"};
    CHECK(p_submit_notify(a, batch, &w, 1, kv_ready) == 0);
    CHECK(wait_task(a, batch, 0).status == STATUS_COMPLETED);
    CHECK(take_notifs(b, 1, names, msgs, 8) == 1);
    CHECK(strcmp(names[0], "agent-a") == 0 && strcmp(msgs[0], "kv ready") == 0);
    notify_msg_t never = {"agent-a", "never"};
    CHECK(p_submit_notify(a, batch, &oor, 1, never) == 0);
    CHECK(wait_task(a, batch, 1).status == STATUS_FAILED);
    notify_msg_t null_name = {NULL, "x"};
    CHECK(p_submit_notify(a, batch, &w, 1, null_name) == 1);
    CHECK(p_submit_notify(a, batch, &w, 0, kv_ready) == 1);
    CHECK(p_free_batch(a, batch) == 0);
    notify_msg_t direct = {"agent-a", "direct"};
    CHECK(p_gen_notify(a, (uint64_t)seg, direct) == 0);
    CHECK(p_gen_notify(a, 999, direct) == -200); /* ERR_METADATA: unknown segment id */
    CHECK(p_gen_notify(a, (uint64_t)seg, null_name) == -1);
    CHECK(take_notifs(b, 1, names, msgs, 8) == 1 && strcmp(msgs[0], "direct") == 0);
    struct timespec quiet = {0, 200 * 1000 * 1000};
    nanosleep(&quiet, NULL);
    int size = -1;
    CHECK(p_notifs(b, &size) == NULL && size == 0); /* "kv ready" once, "never" not at all */
    CHECK(p_notifs(b, NULL) == NULL);
    CHECK(p_free_notifs(NULL, 0) == 0);

    /* Introspection and maintenance. */
    nic_load_stat_t stats[4];
    size_t count = 4;
    CHECK(p_nic_stats(a, stats, &count) == 0 && count == 0);
    CHECK(p_nic_stats(a, NULL, &count) == -1);
    char links[1024];
    CHECK(p_links(a, links, sizeof links, 0) == 0 && strstr(links, name_b) != NULL);
    CHECK(p_links(a, links, sizeof links, 1) == 0 && strstr(links, "\"links\"") != NULL);
    CHECK(p_links(a, NULL, 0, 0) == -1);
    CHECK(p_sync(a) == 0);
    CHECK(p_warmup(a, name_b) == 0);
    CHECK(p_close(a, seg) == 0);
    CHECK(p_remove(a, name_b) == 0);
    CHECK(p_remove(a, "") == -1);
    segment_id_t again = p_open(a, name_b);
    CHECK(again > 0 && again != seg); /* fetched anew */
    p_graceful(a);

    /* Unregistration. */
    CHECK(p_unreg(a, abuf) == 0);
    CHECK(p_unreg(a, abuf) == -3); /* ERR_ADDRESS_NOT_REGISTERED */
    void *addrs[2] = {bbuf, bbuf + 2 * MiB};
    CHECK(p_unreg_batch(b, addrs, 2) == 0);
    CHECK(p_unreg_batch(b, addrs, 2) == -3);
    CHECK(p_unreg_batch(b, NULL, 1) == -1);

    /* Destroyed (and forged) handles are refused, never dereferenced. */
    p_destroy(a);
    p_destroy(b);
    CHECK(p_alloc(a, 1) == INVALID_BATCH);
    CHECK(p_open(b, name_a) == -1);
    CHECK(p_discover((transfer_engine_t)0x1234) == -1);
    CHECK(p_status(NULL, 1, 0, &st) == 1);
    p_destroy(NULL);

    free(abuf);
    free(bbuf);
    free(unregistered);
    if (failures) {
        fprintf(stderr, "transfer_engine_test: %d check(s) failed\n", failures);
        return 1;
    }
    printf("transfer_engine_test: all checks passed\n");
    return 0;
}
