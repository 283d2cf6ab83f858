//! mooncake_client: `crescent-client` under Mooncake's name, so that scripts and manifests
//! written for Mooncake's standalone client (`mooncake_client --global_segment_size=4GB
//! --master_server_address=...`) run unchanged. Same program, same flags
//! ([`crescent_store::standalone::cli`]).

fn main() {
    crescent_store::standalone::cli::main()
}
