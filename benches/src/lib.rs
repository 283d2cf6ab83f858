//! Shared pieces of Crescent's benchmark binaries.

pub use crescent_store::pattern;
pub mod report;
pub mod ssd;

pub use crescent_store::init_logging;
