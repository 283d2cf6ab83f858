//! Shared pieces of Crescent's benchmark binaries.

pub use crescent_store::pattern;
pub mod hotbench;
pub mod report;

pub use crescent_store::init_logging;
