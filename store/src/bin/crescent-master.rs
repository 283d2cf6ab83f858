//! crescent-master: the store's metadata service.
//!
//! ```text
//! crescent-master                                   # gRPC on 0.0.0.0:50051, admin on 0.0.0.0:9003
//! crescent-master --rpc-address 127.0.0.1:50051 --allocation-strategy local_first
//! crescent-master --config master.json              # same names as the flags, in JSON
//! crescent-master --port=50051 --default_kv_lease_ttl=5s --eviction_high_watermark_ratio=0.95
//! ```
//!
//! The same program is built as `mooncake_master` too; the flags are parsed in
//! [`crescent_store::master::cli`].

// Every RPC allocates its request, reply and owners' news; with glibc's malloc that was about
// a quarter of the master's CPU (docs/src/benchmarks.md, "Master at scale"). The binary's
// choice only: the library leaves the allocator to the program that links it.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    crescent_store::master::cli::main()
}
