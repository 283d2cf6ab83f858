//! crescent-client: the standalone store client. It owns a segment, the engine, the disk tier
//! and the hot cache; worker processes on this host attach to it as dummy clients
//! (`setup_dummy(mem_pool_size, local_buffer_size, "host:50052")` in Python,
//! `DummyClient::connect` in Rust) and use the whole store API.
//!
//! ```text
//! crescent-client --master_server_address=10.0.0.1:50051 --global_segment_size=4GB --port=50052
//! crescent-client --master 10.0.0.1:50051 --socket /run/crescent/client.sock
//! ```
//!
//! Also built as `mooncake_client`; the flags are parsed in [`crescent_store::standalone::cli`].

fn main() {
    crescent_store::standalone::cli::main()
}
