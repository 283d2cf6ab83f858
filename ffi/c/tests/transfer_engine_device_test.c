/*
 * Device (GPU) memory through transfer_engine_c.h, registered the way NIXL's Mooncake plugin
 * registers it: a child process registers `cuda:0` memory, this process moves its own device
 * memory (`cuda:0`, and `*` auto-detected) and host memory into it and back, and each
 * transfer is checked byte for byte through the driver (the CPU never touches device memory).
 *
 * The CUDA driver is the library CRESCENT_CUDA_DRIVER names (the fake one of tests/fake-cuda
 * in CI, whose device memory the CPU cannot touch without dying), else libcuda.so.1.
 *
 *   gcc -std=c11 -Wall -Wextra -Werror -I <target>/debug/include \
 *       ffi/c/tests/transfer_engine_device_test.c -L <target>/debug -ltransfer_engine -ldl
 *
 * Run as is (same host: shm, CUDA IPC between the processes) and with MC_FORCE_TCP=1 (tcp,
 * staged through pinned buffers).
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "transfer_engine_c.h"
#include "check.h"

/* More than a tcp slice, not a multiple of anything. */
#define ODD (2 * MiB + 4097)
#define REMOTE (8 * MiB)

/* ---- the driver, through dlopen (the engine loads the same library) ---- */

typedef int cu_result;
static struct {
    cu_result (*init)(unsigned);
    cu_result (*device_get)(int *, int);
    cu_result (*retain)(void **, int);
    cu_result (*set_current)(void *);
    cu_result (*alloc)(uint64_t *, size_t);
    cu_result (*stream_create)(void **, unsigned);
    cu_result (*memcpy_async)(uint64_t, uint64_t, size_t, void *);
    cu_result (*sync)(void *);
    void *stream;
} cu;

static int cuda_open(void) {
    const char *path = getenv("CRESCENT_CUDA_DRIVER");
    void *lib = dlopen(path ? path : "libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "no CUDA driver: %s\n", dlerror());
        return -1;
    }
#define SYM(field, name)                                    \
    if (!(*(void **)&cu.field = dlsym(lib, name))) {        \
        fprintf(stderr, "the driver lacks %s\n", name);     \
        return -1;                                          \
    }
    SYM(init, "cuInit");
    SYM(device_get, "cuDeviceGet");
    SYM(retain, "cuDevicePrimaryCtxRetain");
    SYM(set_current, "cuCtxSetCurrent");
    SYM(alloc, "cuMemAlloc_v2");
    SYM(stream_create, "cuStreamCreate");
    SYM(memcpy_async, "cuMemcpyAsync");
    SYM(sync, "cuStreamSynchronize");
#undef SYM
    int dev = 0;
    void *ctx = NULL;
    if (cu.init(0) || cu.device_get(&dev, 0) || cu.retain(&ctx, dev) || cu.set_current(ctx) ||
        cu.stream_create(&cu.stream, 1)) {
        fprintf(stderr, "the CUDA driver does not initialise\n");
        return -1;
    }
    return 0;
}

static uint64_t dev_alloc(size_t n) {
    uint64_t p = 0;
    return cu.alloc(&p, n) == 0 ? p : 0;
}

/* Copies n bytes (either side host or device) and waits: 0 on success. */
static int copy(uint64_t dst, uint64_t src, size_t n) {
    return cu.memcpy_async(dst, src, n, cu.stream) || cu.sync(cu.stream);
}

/* ---- patterns: byte i of pattern `seed` ---- */

static unsigned char at(size_t i, unsigned seed) {
    return (unsigned char)((i * 31 + seed * 7 + (i >> 11)) & 0xff);
}

static void fill(unsigned char *p, size_t n, unsigned seed, size_t from) {
    for (size_t i = 0; i < n; i++) p[i] = at(from + i, seed);
}

static int matches(const unsigned char *p, size_t n, unsigned seed, size_t from) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != at(from + i, seed)) return 0;
    return 1;
}

/* Device memory [dev, +n) holds pattern `seed` from index `from` (read back by the driver). */
static int device_matches(uint64_t dev, size_t n, unsigned seed, size_t from) {
    unsigned char *host = malloc(n);
    int ok = host && copy((uint64_t)(uintptr_t)host, dev, n) == 0 && matches(host, n, seed, from);
    free(host);
    return ok;
}

static int device_fill(uint64_t dev, size_t n, unsigned seed, size_t from) {
    unsigned char *host = malloc(n);
    if (!host) return -1;
    fill(host, n, seed, from);
    int rc = copy(dev, (uint64_t)(uintptr_t)host, n);
    free(host);
    return rc;
}

/* ---- the child: an engine with 8 MiB of cuda:0 memory, driven over two pipes ----
 *   "check OFF LEN SEED FROM" -> "ok" / "bad"   (its device memory at OFF)
 *   "fill OFF LEN SEED FROM"  -> "ok"
 */
static int child(FILE *in, FILE *out) {
    if (cuda_open() != 0) return 2;
    transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    uint64_t dev = dev_alloc(REMOTE);
    if (!e || !dev || device_fill(dev, REMOTE, 9, 0) != 0) return 3;
    if (registerLocalMemory(e, (void *)(uintptr_t)dev, REMOTE, "cuda:0", 1) != 0) return 4;
    char name[64];
    if (getLocalIpAndPort(e, name, sizeof name) != 0) return 5;
    fprintf(out, "%s %" PRIu64 "\n", name, dev);
    fflush(out);
    char op[16];
    size_t off, len, from;
    unsigned seed;
    while (fscanf(in, "%15s %zu %zu %u %zu", op, &off, &len, &seed, &from) == 5) {
        int ok = off + len <= REMOTE;
        if (ok && strcmp(op, "check") == 0) ok = device_matches(dev + off, len, seed, from);
        else if (ok && strcmp(op, "fill") == 0) ok = device_fill(dev + off, len, seed, from) == 0;
        else ok = 0;
        fprintf(out, "%s\n", ok ? "ok" : "bad");
        fflush(out);
    }
    CHECK(unregisterLocalMemory(e, (void *)(uintptr_t)dev) == 0);
    destroyTransferEngine(e);
    return failures ? 1 : 0;
}

static FILE *to_child, *from_child;

static int ask(const char *op, size_t off, size_t len, unsigned seed, size_t from) {
    char reply[16] = "";
    fprintf(to_child, "%s %zu %zu %u %zu\n", op, off, len, seed, from);
    fflush(to_child);
    return fscanf(from_child, "%15s", reply) == 1 && strcmp(reply, "ok") == 0;
}

/* Submits one request in a batch of its own and waits (30 s at most): its final status. */
static int move(transfer_engine_t e, int opcode, void *local, segment_id_t seg, uint64_t remote, size_t len) {
    batch_id_t batch = allocateBatchID(e, 1);
    if (batch == INVALID_BATCH) return -1;
    struct transfer_request r = {opcode, local, seg, remote, len};
    transfer_status_t st = {STATUS_WAITING, 0};
    if (submitTransfer(e, batch, &r, 1) == 0) {
        double end = now() + 30;
        while (now() < end && getTransferStatus(e, batch, 0, &st) == 0 &&
               (st.status == STATUS_WAITING || st.status == STATUS_PENDING)) {
            struct timespec t = {0, 1000 * 1000};
            nanosleep(&t, NULL);
        }
    } else {
        st.status = -1;
    }
    CHECK(freeBatchID(e, batch) == 0);
    return st.status;
}

int main(void) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) return 1;
    /* The child first: a process that initialised CUDA must not fork. */
    pid_t pid = fork();
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        _exit(child(fdopen(down[0], "r"), fdopen(up[1], "w")));
    }
    close(down[0]);
    close(up[1]);
    to_child = fdopen(down[1], "w");
    from_child = fdopen(up[0], "r");
    char name[64];
    uint64_t remote = 0;
    if (cuda_open() != 0 || fscanf(from_child, "%63s %" SCNu64, name, &remote) != 2) {
        fprintf(stderr, "no CUDA driver here or no peer\n");
        return 1;
    }

    transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    uint64_t a = dev_alloc(4 * MiB), b = dev_alloc(4 * MiB);
    CHECK(e && a && b && device_fill(a, 4 * MiB, 1, 0) == 0);
    unsigned char *host = aligned_alloc(4096, 4 * MiB);
    fill(host, 4 * MiB, 3, 0);
    CHECK(registerLocalMemory(e, (void *)(uintptr_t)a, 4 * MiB, "cuda:0", 1) == 0);
    buffer_entry_t auto_detected[2] = {{(void *)(uintptr_t)b, 4 * MiB}, {host, 4 * MiB}};
    CHECK(registerLocalMemoryBatch(e, auto_detected, 2, "*") == 0);
    /* Bad input: a device that does not exist, host memory called device memory. */
    unsigned char plain[64];
    CHECK(registerLocalMemory(e, (void *)(uintptr_t)(b + 4 * MiB - 64), 32, "cuda:7", 1) != 0);
    CHECK(registerLocalMemory(e, plain, sizeof plain, "cuda:0", 1) != 0);
    segment_id_t seg = openSegment(e, name);
    CHECK(seg > 0);

    /* Device to device, odd offsets: written, then read back into the other buffer. */
    CHECK(move(e, OPCODE_WRITE, (void *)(uintptr_t)(a + 3), seg, remote + 5, ODD) == STATUS_COMPLETED);
    CHECK(ask("check", 5, ODD, 1, 3));
    CHECK(ask("check", 0, 5, 9, 0)); /* nothing written before it */
    CHECK(ask("fill", MiB + 1, ODD, 2, 0));
    CHECK(move(e, OPCODE_READ, (void *)(uintptr_t)(b + 7), seg, remote + MiB + 1, ODD) == STATUS_COMPLETED);
    CHECK(device_matches(b + 7, ODD, 2, 0));
    /* Mixed: host memory here into the peer's device, and its device into host memory. */
    CHECK(move(e, OPCODE_WRITE, host, seg, remote + 4 * MiB, ODD) == STATUS_COMPLETED);
    CHECK(ask("check", 4 * MiB, ODD, 3, 0));
    memset(host, 0, 4 * MiB);
    CHECK(move(e, OPCODE_READ, host + 1, seg, remote + MiB + 1, ODD) == STATUS_COMPLETED);
    CHECK(matches(host + 1, ODD, 2, 0));
    /* Past the end of the peer's device memory: the request fails, nothing crashes. */
    CHECK(move(e, OPCODE_READ, (void *)(uintptr_t)a, seg, remote + REMOTE - 10, 100) == STATUS_FAILED);
    CHECK(device_matches(a, 4 * MiB, 1, 0));

    CHECK(unregisterLocalMemory(e, (void *)(uintptr_t)a) == 0);
    void *both[2] = {(void *)(uintptr_t)b, host};
    CHECK(unregisterLocalMemoryBatch(e, both, 2) == 0);
    destroyTransferEngine(e);
    fclose(to_child);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("transfer_engine_device_test: all checks passed (%s)\n",
           getenv("MC_FORCE_TCP") ? "tcp" : "same host");
    return 0;
}
