//! What the master and its clients agree on besides the messages of [`crate::proto`]: the
//! longest key, the largest object and gRPC message, how a disk's segment is named, and the
//! default cluster id, and the tokens of the cluster secret (see [`crate::master::access`]).
//! Both sides import it from here; neither imports the other.

use crescent_transports::net::Keyring;

/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 4096;

/// Largest object accepted.
pub const MAX_OBJECT_SIZE: u64 = 1 << 40;

/// Most keys in one batch call to the master (BatchPutStart/End/Revoke, BatchGetReplicaList,
/// BatchExists): the master refuses a larger batch whole with `INVALID_ARGUMENT`; the client
/// splits a caller's larger batch into calls of at most this many keys.
pub const MAX_BATCH_KEYS: usize = 16_384;

/// Largest reply the master encodes, and the client decodes: a batch's replica lists
/// ([`MAX_BATCH_KEYS`] × up to 16 replicas) or a scheduler query's locations fit.
pub const MAX_MESSAGE: usize = 256 << 20;

/// A disk segment's name for a disk id.
pub fn disk_segment_name(disk_id: &str) -> String {
    format!("ssd:{disk_id}")
}

/// What separates a client's extra memory segment's name from its engine's segment name:
/// `host:port#<uuid>` (see `StoreApi::allocate_and_mount_segment`). Every segment of a
/// client is memory of its one engine segment, so a reader opens `host:port`.
pub const EXTRA_SEGMENT_MARK: char = '#';

/// The transfer engine's segment that holds a memory segment named `name` at the master: the
/// name itself, or the part before [`EXTRA_SEGMENT_MARK`] for a client's extra segment.
pub fn engine_segment(name: &str) -> &str {
    name.split_once(EXTRA_SEGMENT_MARK).map_or(name, |(engine, _)| engine)
}

/// Mooncake's default `--cluster_id`: the masters' election and the clients' leader lookup
/// both use it when none is given.
pub const DEFAULT_CLUSTER_ID: &str = "mooncake_cluster";

/// The tenant of a client that names none.
pub const DEFAULT_TENANT: &str = "default";
/// The gRPC metadata a client without a secret names its tenant in (with a secret, the token
/// names it).
pub const TENANT_HEADER: &str = "x-crescent-tenant";

pub(crate) fn tenant_context(tenant: &str) -> String {
    format!("crescent-master tenant {tenant}")
}

pub(crate) const ADMIN_CONTEXT: &str = "crescent-master admin";

/// The bearer token a client of `tenant` sends to the master.
pub fn client_token(keyring: &Keyring, tenant: &str) -> String {
    format!("{tenant}.{}", keyring.token(&tenant_context(tenant)))
}

/// The bearer token of the master's admin port.
pub fn admin_token(keyring: &Keyring) -> String {
    keyring.token(ADMIN_CONTEXT)
}

/// Checks a tenant name: 1 to 128 bytes of letters, digits, `-`, `_`, `.`, not starting
/// with `_` (upstream's rule for tenant names, and what a token may carry).
pub fn check_tenant(t: &str) -> Result<(), String> {
    let ok = !t.is_empty()
        && t.len() <= 128
        && !t.starts_with('_')
        && t.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!("tenant {t:?} is not 1-128 letters, digits, '-', '_' or '.', not starting with '_'"))
    }
}
