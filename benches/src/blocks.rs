//! The options that say what a copy benchmark moves, shared by `tebench initiator` and
//! memcpy-bench so that memcpy-bench copies exactly the blocks, batches and threads tebench
//! transfers.

use clap::{Args, ValueEnum};

/// Largest local window per thread (tebench's without `--verify`; memcpy-bench's).
pub const MAX_LOCAL_WINDOW: u64 = 256 << 20;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Operation {
    /// Into the local window, from the target's buffer (memcpy-bench: from the buffer that
    /// stands for it).
    Read,
    /// From the local window into the target's buffer (memcpy-bench: into the buffer that
    /// stands for it).
    Write,
}

impl Operation {
    /// The name of the command line and the reports.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

#[derive(Args)]
pub struct BlockArgs {
    #[arg(long, value_enum, default_value = "read")]
    pub operation: Operation,
    /// Bytes per request (memcpy-bench: per block copied).
    #[arg(long, visible_alias = "block_size", default_value = "64K", value_parser = crescent_engine::parse_size)]
    pub block_size: u64,
    /// Requests per batch (memcpy-bench: blocks per batch).
    #[arg(long, visible_alias = "batch_size", default_value_t = 128)]
    pub batch_size: usize,
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
}
