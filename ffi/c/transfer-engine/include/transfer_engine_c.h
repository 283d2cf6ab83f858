/*
 * transfer_engine_c.h — Mooncake Transfer Engine's C interface (kvcache-ai/Mooncake at
 * 3b5a5941, mooncake-transfer-engine/include/transfer_engine_c.h), implemented by Crescent's
 * libtransfer_engine.so: the same names, types, struct layouts, constants and return codes, so
 * that a program written against Mooncake's header (NIXL's Mooncake backend, for one) builds
 * and runs against Crescent unchanged.
 *
 * Return conventions, as Mooncake's:
 *   - functions returning int from the engine's registration and segment calls give 0 or a
 *     negative ERR_* code (-1 invalid argument, -3 address not registered, -7 overlapping, ...);
 *   - submitTransfer, submitTransferWithNotify, getTransferStatus and freeBatchID give
 *     Mooncake's Status code: 0, or a positive number (1 invalid argument, 2 too many requests
 *     for the batch, 3 address not registered, 4 batch busy);
 *   - openSegment gives a segment id >= 0 or -1; allocateBatchID gives INVALID_BATCH on failure;
 *     createTransferEngine and getNotifsFromEngine give NULL.
 * Strings passed in are copied; the caller may free them once a call returns. An engine handle
 * that is NULL, destroyed or not an engine is refused with the error value above, never
 * dereferenced. Where Crescent's behaviour differs from Mooncake's, the compatibility page of
 * Crescent's documentation says so.
 *
 * Checked at build time: every function declared here is exported by the library and nothing
 * else (ffi/c/transfer-engine/build.rs); the struct layouts by the library's tests and by
 * ffi/c/tests/transfer_engine_test.c.
 */

#ifndef TRANSFER_ENGINE_C
#define TRANSFER_ENGINE_C

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif /* __cplusplus */

#define segment_handle_t int32_t
#define segment_id_t int32_t
#define batch_id_t uint64_t
/* The engine's own segment as a target. */
#define LOCAL_SEGMENT (0)
#define INVALID_BATCH UINT64_MAX

#define OPCODE_READ (0)
#define OPCODE_WRITE (1)

/* One transfer: length bytes between local registered memory at source and the target
 * segment's registered memory at address target_offset. */
struct transfer_request {
    int opcode;
    void *source;
    segment_id_t target_id;
    uint64_t target_offset;
    uint64_t length;
};

typedef struct transfer_request transfer_request_t;

/* A notification: who sends it and what it says (NUL-terminated strings). */
struct notify_msg {
    char *name;
    char *msg;
};

typedef struct notify_msg notify_msg_t;

/* transfer_status.status */
#define STATUS_WAITING (0)
#define STATUS_PENDING (1)
#define STATUS_INVALID (2)
#define STATUS_CANCELED (3)
#define STATUS_COMPLETED (4)
#define STATUS_TIMEOUT (5)
#define STATUS_FAILED (6)

struct transfer_status {
    int status;
    uint64_t transferred_bytes;
};

/* Declared for compatibility; no function takes it. */
struct segment_desc {
    int type; /* RDMA / NVMeoF */
    union {
        struct {
            void *addr;
            uint64_t size;
            const char *location;
        } rdma;
        struct {
            const char *file_path;
            const char *subsystem_name;
            const char *proto;
            const char *ip;
            uint64_t port;
        } nvmeof;
    } desc_;
};

typedef struct transfer_status transfer_status_t;

struct buffer_entry {
    void *addr;
    size_t length;
};
typedef struct buffer_entry buffer_entry_t;

typedef struct segment_desc segment_desc_t;
typedef void *transfer_engine_t;
typedef void *transport_t;

/* Starts an engine. metadata_conn_string: "P2PHANDSHAKE" or an etcd / redis / http connection
 * string; local_server_name: the host (or host:port) peers reach it at — with P2PHANDSHAKE the
 * port is picked free, as Mooncake does. NULL on failure. */
transfer_engine_t createTransferEngine(const char *metadata_conn_string,
                                       const char *local_server_name,
                                       const char *ip_or_host_name,
                                       uint64_t rpc_port, int auto_discover);

int discoverTopology(transfer_engine_t engine);

/* "ip:port" of the engine's handshake listener (its segment name with P2PHANDSHAKE), truncated
 * to buf_len bytes with the NUL as snprintf does. */
int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len);

/* Non-NULL when the engine runs the transport proto ("tcp", "rdma", "shm"). */
transport_t installTransport(transfer_engine_t engine, const char *proto,
                             void **args);

int uninstallTransport(transfer_engine_t engine, const char *proto);

segment_id_t openSegment(transfer_engine_t engine, const char *segment_name);

segment_id_t openSegmentNoCache(transfer_engine_t engine,
                                const char *segment_name);

int closeSegment(transfer_engine_t engine, segment_id_t segment_id);

/* 0: there is no EFA transport. */
int warmupEfaSegment(transfer_engine_t engine, const char *segment_name);

int removeLocalSegment(transfer_engine_t engine, const char *segment_name);

void destroyTransferEngine(transfer_engine_t engine);

int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length,
                        const char *location, int remote_accessible);

int unregisterLocalMemory(transfer_engine_t engine, void *addr);

int registerLocalMemoryBatch(transfer_engine_t engine,
                             buffer_entry_t *buffer_list, size_t buffer_len,
                             const char *location);

int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list,
                               size_t addr_len);

batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size);

int submitTransfer(transfer_engine_t engine, batch_id_t batch_id,
                   struct transfer_request *entries, size_t count);

/* As submitTransfer; once every request of the batch submitted so far completed, notify_msg
 * is delivered to the engine of entries[0]'s segment (dropped if one failed). */
int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id,
                             struct transfer_request *entries, size_t count,
                             notify_msg_t notify_msg);

/* The notifications received and not yet taken (*size of them), NULL when none; free with
 * freeNotifsMsgBuf. */
notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size);

int freeNotifsMsgBuf(notify_msg_t *msg, int size);

/* Sends notify_msg now to the engine of segment target_id. */
int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id,
                      notify_msg_t notify_msg);

int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id,
                      size_t task_id, struct transfer_status *status);

int freeBatchID(transfer_engine_t engine, batch_id_t batch_id);

int syncSegmentCache(transfer_engine_t engine);

struct nic_load_stat {
    char device_name[64];
    uint64_t inflight_bytes;
    double ewma_bandwidth_bps;
};

typedef struct nic_load_stat nic_load_stat_t;

int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats,
                    size_t *count);

void enableGracefulShutdown(transfer_engine_t engine);
int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len,
              int json);

#ifdef __cplusplus
}
#endif /* __cplusplus */

#endif /* TRANSFER_ENGINE_C */
