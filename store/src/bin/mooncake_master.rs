//! mooncake_master: `crescent-master` under Mooncake's name, so that scripts and manifests
//! written for Mooncake (`mooncake_master --port=50051 --enable_http_metadata_server=true ...`)
//! run unchanged. Same program, same flags ([`crescent_store::master::cli`]), same allocator.

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    crescent_store::master::cli::main()
}
