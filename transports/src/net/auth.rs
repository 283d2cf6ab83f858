//! Mutual authentication of a connection by a cluster secret (issue 26): once per
//! connection, before the first frame, on every port of Crescent (the tcp transport, the shm
//! and rdma control sockets, the engine's handshake port, the store's disk service, the rpc
//! port of `mooncake.engine.RpcInterface`).
//!
//! # The exchange
//!
//! Both sides hold a [`Keyring`]: one secret, or two during a rotation. A secret is known by
//! its id, the first 8 bytes of `HMAC(secret, "crescent-auth-v1 key id")`.
//!
//! ```text
//! dialer                                              listener
//!   Hello     { service, ids of its secrets, nonce_c } ->
//!             <- Challenge { status, id, nonce_s, mac_s = HMAC(K, "S" | service | id | nonce_c | nonce_s) }
//!   (checks mac_s: the listener knows K; else it sends nothing more)
//!   Proof     { mac_c = HMAC(K, "C" | service | id | nonce_c | nonce_s) } ->
//!             <- Verdict { ok | refused }
//! ```
//!
//! `K` is the first secret of the dialer's list that the listener also holds, so a pair of
//! peers that share any one secret authenticates: a rotation (old; old + new; new + old; new)
//! never leaves two peers without a common secret. Each MAC is bound to its direction (no
//! reflection of one side's proof as the other's), to both fresh nonces (no replay), to the
//! secret's id and to the kind of listener ([`Service`]: a proof for the handshake port is no
//! proof for the tcp data port). MACs are compared in constant time (`hmac`'s
//! `verify_slice`).
//!
//! Messages have fixed sizes and a prefix (`CRAU`, version, type) checked as soon as it
//! arrives, so a peer that speaks something else (an old client, a client without the secret,
//! a port scanner) is refused at once; the whole exchange has one deadline on either side.
//! Each message is sent in one `send`, so the exchange works unchanged on the shm transport's
//! `SOCK_SEQPACKET` socket.
//!
//! The listener counts what it admits and refuses ([`AuthStats`]); a dialer never sends a
//! request to a listener that did not prove it knows the secret.

use std::io::{self, IoSlice};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

use super::wire::{send_all_by, Wire};

type HmacSha256 = Hmac<Sha256>;

/// The cluster secret itself (one line; with [`SECRET_NEXT_ENV`], the pair of a rotation).
pub const SECRET_ENV: &str = "CRESCENT_CLUSTER_SECRET";
/// The second secret accepted during a rotation.
pub const SECRET_NEXT_ENV: &str = "CRESCENT_CLUSTER_SECRET_NEXT";
/// A file holding the secret (one line), or two (two lines) during a rotation.
pub const SECRET_FILE_ENV: &str = "CRESCENT_CLUSTER_SECRET_FILE";
/// Shortest secret accepted, in bytes: a MAC over known nonces lets an eavesdropper try
/// guesses offline, so a secret must not be guessable (`openssl rand -hex 32`).
pub const MIN_SECRET_LEN: usize = 16;
/// Longest secret accepted, in bytes.
pub const MAX_SECRET_LEN: usize = 1024;
/// Secrets one keyring holds at most: the current one and the next.
pub const MAX_SECRETS: usize = 2;
/// Default time for the whole exchange, on either side.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

const MAGIC: &[u8; 4] = b"CRAU";
const VERSION: u8 = 1;
const PREFIX_LEN: usize = 6;
const NONCE_LEN: usize = 32;
const MAC_LEN: usize = 32;
const ID_LEN: usize = 8;
const DOMAIN: &[u8] = b"crescent-auth-v1";

const HELLO: u8 = 1;
const CHALLENGE: u8 = 2;
const PROOF: u8 = 3;
const VERDICT: u8 = 4;

const HELLO_LEN: usize = 8 + MAX_SECRETS * ID_LEN + NONCE_LEN;
const CHALLENGE_LEN: usize = 8 + ID_LEN + NONCE_LEN + MAC_LEN;
const PROOF_LEN: usize = 8 + MAC_LEN;
const VERDICT_LEN: usize = 8;

/// The kind of listener a connection is to: part of what a proof is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Service {
    /// The tcp transport's data port.
    Tcp = 1,
    /// The shm transport's control socket.
    Shm = 2,
    /// The rdma transport's queue-pair exchange.
    RdmaControl = 3,
    /// The engine's handshake port (descriptors, notifications).
    Handshake = 4,
    /// The store client's disk service.
    Disk = 5,
    /// Mooncake's `RpcInterface` server (`mooncake.engine`).
    Rpc = 6,
}

impl Service {
    /// Every kind of listener, in wire-code order (1..=6): what the counters are indexed by.
    pub const ALL: [Service; 6] =
        [Service::Tcp, Service::Shm, Service::RdmaControl, Service::Handshake, Service::Disk, Service::Rpc];

    /// Its name in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Service::Tcp => "tcp",
            Service::Shm => "shm",
            Service::RdmaControl => "rdma_control",
            Service::Handshake => "handshake",
            Service::Disk => "disk",
            Service::Rpc => "rpc",
        }
    }

    fn from_u8(b: u8) -> Option<Service> {
        Service::ALL.into_iter().find(|s| *s as u8 == b)
    }

    fn index(self) -> usize {
        self as usize - 1
    }
}

impl std::fmt::Display for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a connection was not authenticated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// A secret that cannot be used (the caller's configuration).
    #[error("cluster secret: {0}")]
    Config(String),
    /// The peer sent something that is not this exchange: it has no secret configured (or is
    /// no Crescent peer at all).
    #[error("the peer did not authenticate (no cluster secret configured there?): {0}")]
    NotAuthenticating(String),
    /// The peer holds none of this side's secrets.
    #[error("the peer shares none of our cluster secrets")]
    NoSharedSecret,
    /// The peer's proof is wrong: it does not know the secret it named.
    #[error("the peer's proof of the cluster secret is wrong")]
    BadProof,
    /// The listener is another kind of port than the dialer meant.
    #[error("the peer is a {found} port, not a {expected} port")]
    WrongService {
        /// The kind of port the dialer meant.
        expected: Service,
        /// The kind the listener said it is.
        found: String,
    },
    /// The listener refused this side's proof.
    #[error("the peer refused our proof of the cluster secret")]
    Refused,
    /// A message out of order or malformed.
    #[error("malformed authentication message: {0}")]
    Malformed(String),
    /// The peer closed the connection during the exchange. A dialer sees this when the
    /// listener has no secret configured (it reads the hello as a bad frame) or refused it.
    #[error("the peer closed the connection during authentication (does it have the cluster secret configured?)")]
    Closed,
    /// The exchange did not end within its time.
    #[error("authentication did not complete within {0:?}")]
    TimedOut(Duration),
    /// The connection failed during the exchange (reset, broken pipe).
    #[error("authentication: {0}")]
    Io(#[source] io::Error),
}

impl AuthError {
    /// True when the cause is this side's configuration, not the peer.
    pub fn is_caller_error(&self) -> bool {
        matches!(self, AuthError::Config(_))
    }

    /// The metric label of a refusal.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Config(_) => "config",
            AuthError::NotAuthenticating(_) | AuthError::Malformed(_) => "no_auth",
            AuthError::NoSharedSecret => "no_shared_secret",
            AuthError::BadProof | AuthError::Refused => "bad_proof",
            AuthError::WrongService { .. } => "wrong_service",
            AuthError::Closed | AuthError::Io(_) => "closed",
            AuthError::TimedOut(_) => "timed_out",
        }
    }
}

/// One secret and its id.
#[derive(Clone)]
struct Secret {
    id: [u8; ID_LEN],
    key: Vec<u8>,
}

impl Secret {
    fn new(key: &[u8]) -> Result<Secret, AuthError> {
        if key.len() < MIN_SECRET_LEN {
            return Err(AuthError::Config(format!(
                "a secret of {} bytes is too short ({MIN_SECRET_LEN} at least; e.g. `openssl rand -hex 32`)",
                key.len()
            )));
        }
        if key.len() > MAX_SECRET_LEN {
            return Err(AuthError::Config(format!(
                "a secret of {} bytes is too long ({MAX_SECRET_LEN} at most)",
                key.len()
            )));
        }
        let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
        mac.update(DOMAIN);
        mac.update(b" key id");
        let digest = mac.finalize().into_bytes();
        let mut id = [0u8; ID_LEN];
        id.copy_from_slice(&digest[..ID_LEN]);
        Ok(Secret { id, key: key.to_vec() })
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length")
    }
}

/// The cluster's secrets this process holds: the current one first, and during a rotation
/// the other one. Its `Debug` shows the secrets' ids, never the secrets.
#[derive(Clone)]
pub struct Keyring {
    secrets: Vec<Secret>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.secrets.iter().map(|s| hex(&s.id)).collect();
        f.debug_struct("Keyring").field("ids", &ids).finish()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Keyring {
    /// A keyring of one or two secrets (the first is the current one).
    pub fn new<S: AsRef<[u8]>>(secrets: &[S]) -> Result<Keyring, AuthError> {
        if secrets.is_empty() || secrets.len() > MAX_SECRETS {
            return Err(AuthError::Config(format!("{} secrets given; one, or two during a rotation", secrets.len())));
        }
        let secrets = secrets.iter().map(|s| Secret::new(s.as_ref())).collect::<Result<Vec<_>, _>>()?;
        if secrets.len() == 2 && secrets[0].key == secrets[1].key {
            return Err(AuthError::Config("the two secrets of a rotation are the same".into()));
        }
        Ok(Keyring { secrets })
    }

    /// Secrets from a file's text: each non-empty line that does not start with `#` is one
    /// (surrounding white space removed).
    pub fn parse(text: &str) -> Result<Keyring, AuthError> {
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
        if lines.is_empty() {
            return Err(AuthError::Config("no secret in the text".into()));
        }
        Keyring::new(&lines)
    }

    /// Secrets from the file at `path` (see [`Keyring::parse`]).
    pub fn load(path: &Path) -> Result<Keyring, AuthError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| AuthError::Config(format!("cannot read the secret file {}: {e}", path.display())))?;
        Keyring::parse(&text).map_err(|e| AuthError::Config(format!("{}: {e}", path.display())))
    }

    /// The secrets of the environment ([`SECRET_FILE_ENV`], else [`SECRET_ENV`] with
    /// [`SECRET_NEXT_ENV`]), `var` reading it; `None` when none is set.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Keyring>, AuthError> {
        let get = |name: &str| var(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        if let Some(path) = get(SECRET_FILE_ENV) {
            return Keyring::load(Path::new(&path))
                .map(Some)
                .map_err(|e| AuthError::Config(format!("{SECRET_FILE_ENV}: {e}")));
        }
        let secrets: Vec<String> = [get(SECRET_ENV), get(SECRET_NEXT_ENV)].into_iter().flatten().collect();
        if secrets.is_empty() {
            return Ok(None);
        }
        if get(SECRET_ENV).is_none() {
            return Err(AuthError::Config(format!("{SECRET_NEXT_ENV} is set without {SECRET_ENV}")));
        }
        Keyring::new(&secrets).map(Some)
    }

    /// [`Keyring::from_vars`] of this process's environment.
    pub fn from_env() -> Result<Option<Keyring>, AuthError> {
        Keyring::from_vars(|name| std::env::var(name).ok())
    }

    /// The ids of the secrets (hex), for logs.
    pub fn ids(&self) -> Vec<String> {
        self.secrets.iter().map(|s| hex(&s.id)).collect()
    }

    fn find(&self, id: &[u8]) -> Option<&Secret> {
        self.secrets.iter().find(|s| s.id == id)
    }

    /// A bearer token for `context` (say, the master and a tenant) derived from the current
    /// secret: `HMAC(secret, "crescent-auth-v1 token" | context)`, hex. The secret itself
    /// never goes on the wire.
    pub fn token(&self, context: &str) -> String {
        token_of(&self.secrets[0], context)
    }

    /// True when `token` is the token for `context` under any secret of this keyring
    /// (compared in constant time).
    pub fn verify_token(&self, context: &str, token: &str) -> bool {
        let Some(bytes) = unhex(token.trim()) else { return false };
        self.secrets.iter().any(|s| {
            let mut mac = s.mac();
            mac.update(DOMAIN);
            mac.update(b" token");
            mac.update(context.as_bytes());
            mac.verify_slice(&bytes).is_ok()
        })
    }
}

fn token_of(secret: &Secret, context: &str) -> String {
    let mut mac = secret.mac();
    mac.update(DOMAIN);
    mac.update(b" token");
    mac.update(context.as_bytes());
    hex(&mac.finalize().into_bytes())
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() != 2 * MAC_LEN || !s.is_ascii() {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

/// The MAC of one direction of the exchange.
fn proof(secret: &Secret, role: u8, service: Service, nonce_c: &[u8], nonce_s: &[u8]) -> HmacSha256 {
    let mut mac = secret.mac();
    mac.update(DOMAIN);
    mac.update(&[role, service as u8]);
    mac.update(&secret.id);
    mac.update(nonce_c);
    mac.update(nonce_s);
    mac
}

const SERVER_ROLE: u8 = b'S';
const CLIENT_ROLE: u8 = b'C';

/// Status of a challenge or verdict.
const OK: u8 = 0;
const NO_SHARED_SECRET: u8 = 1;
const WRONG_SERVICE: u8 = 2;
const BAD_PROOF: u8 = 3;

fn prefix(kind: u8, len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len];
    m[..4].copy_from_slice(MAGIC);
    m[4] = VERSION;
    m[5] = kind;
    m
}

fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut n);
    n
}

/// What a listener counts, per [`Service`].
#[derive(Debug, Default)]
pub struct AuthStats {
    accepted: [AtomicU64; 6],
    refused: [AtomicU64; 6],
    dial_failed: [AtomicU64; 6],
}

impl AuthStats {
    /// Connections to `service` that authenticated.
    pub fn accepted(&self, service: Service) -> u64 {
        self.accepted[service.index()].load(Ordering::Relaxed)
    }

    /// Connections to `service` refused because the peer did not authenticate.
    pub fn refused(&self, service: Service) -> u64 {
        self.refused[service.index()].load(Ordering::Relaxed)
    }

    /// Connections from this process to a `service` that failed to authenticate.
    pub fn dial_failed(&self, service: Service) -> u64 {
        self.dial_failed[service.index()].load(Ordering::Relaxed)
    }

    /// Connections refused, every service together.
    pub fn refused_total(&self) -> u64 {
        Service::ALL.iter().map(|s| self.refused(*s)).sum()
    }
}

/// A process's authentication: its secrets (none: every port is open, as before issue 26),
/// the time the exchange may take, and its counters. Cheap to clone (the clones share the
/// counters).
#[derive(Clone, Debug)]
pub struct Auth {
    keyring: Option<Arc<Keyring>>,
    timeout: Duration,
    stats: Arc<AuthStats>,
}

impl Default for Auth {
    fn default() -> Self {
        Auth::open()
    }
}

impl Auth {
    /// No secret: connections are not authenticated.
    pub fn open() -> Auth {
        Auth { keyring: None, timeout: DEFAULT_TIMEOUT, stats: Arc::default() }
    }

    /// Connections must prove knowledge of a secret of `keyring` (`None`: [`Auth::open`]).
    pub fn new(keyring: Option<Keyring>) -> Auth {
        Auth { keyring: keyring.map(Arc::new), ..Auth::open() }
    }

    /// The same, with `timeout` for the whole exchange.
    pub fn with_timeout(mut self, timeout: Duration) -> Auth {
        self.timeout = timeout;
        self
    }

    /// True when a secret is set.
    pub fn is_required(&self) -> bool {
        self.keyring.is_some()
    }

    /// The secrets connections must prove knowledge of; `None` when no secret is set.
    pub fn keyring(&self) -> Option<&Keyring> {
        self.keyring.as_deref()
    }

    /// The time the whole exchange may take, on either side ([`DEFAULT_TIMEOUT`] unless set
    /// with [`Auth::with_timeout`]).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The admitted / refused / failed-dial counters, shared by every clone of this `Auth`
    /// and by the guards made from it.
    pub fn stats(&self) -> &Arc<AuthStats> {
        &self.stats
    }

    /// The listener's side: authenticates the peer on `w` for `service` within the timeout.
    /// Without a secret, accepts at once. A refusal is counted.
    pub fn accept(&self, service: Service, w: &mut (impl Wire + ?Sized)) -> Result<(), AuthError> {
        let Some(keyring) = &self.keyring else { return Ok(()) };
        let deadline = Instant::now() + self.timeout;
        let result = accept(keyring, service, w, deadline, self.timeout);
        let counter = match &result {
            Ok(()) => &self.stats.accepted,
            Err(_) => &self.stats.refused,
        };
        counter[service.index()].fetch_add(1, Ordering::Relaxed);
        result
    }

    /// The dialer's side: proves knowledge of the secret to the `service` listener on `w` and
    /// checks its proof, within the timeout (or by `deadline` if it is sooner). Without a
    /// secret, returns at once.
    pub fn dial(
        &self,
        service: Service,
        w: &mut (impl Wire + ?Sized),
        deadline: Option<Instant>,
    ) -> Result<(), AuthError> {
        let Some(keyring) = &self.keyring else { return Ok(()) };
        let own = Instant::now() + self.timeout;
        let deadline = deadline.map_or(own, |d| d.min(own));
        let result = dial(keyring, service, w, deadline, self.timeout);
        if result.is_err() {
            self.stats.dial_failed[service.index()].fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}

/// A listener's authentication: whose secrets, and which kind of port it is.
#[derive(Clone, Debug, Default)]
pub struct Guard {
    auth: Auth,
    service: Option<Service>,
}

impl Guard {
    /// Admits every connection (a listener no secret guards).
    pub fn open() -> Guard {
        Guard::default()
    }

    /// The kind of port this guard protects; `None` for an open guard, which admits every
    /// connection without an exchange.
    pub fn service(&self) -> Option<Service> {
        self.service
    }

    /// Connections this kind of port refused so far (0 for an open one).
    pub fn refused(&self) -> u64 {
        self.service.map_or(0, |s| self.auth.stats.refused(s))
    }

    /// Authenticates the peer on `w` (see [`Auth::accept`]).
    pub fn accept(&self, w: &mut (impl Wire + ?Sized)) -> Result<(), AuthError> {
        match self.service {
            Some(service) => self.auth.accept(service, w),
            None => Ok(()),
        }
    }
}

impl Auth {
    /// The guard of a `service` listener under these secrets.
    pub fn guard(&self, service: Service) -> Guard {
        Guard { auth: self.clone(), service: Some(service) }
    }
}

/// Receives one message of `len` bytes and type `kind`, its prefix checked as soon as it is in.
fn recv_message(
    w: &mut (impl Wire + ?Sized),
    kind: u8,
    len: usize,
    deadline: Instant,
    limit: Duration,
    not_ours: impl Fn(String) -> AuthError,
) -> Result<Vec<u8>, AuthError> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match w.recv_by(&mut buf[got..], Some(deadline)) {
            Ok(0) => return Err(AuthError::Closed),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => return Err(AuthError::TimedOut(limit)),
            Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe) => {
                return Err(AuthError::Closed)
            }
            Err(e) => return Err(AuthError::Io(e)),
        }
        let seen = got.min(PREFIX_LEN);
        if buf[..seen.min(4)] != MAGIC[..seen.min(4)] {
            return Err(not_ours(format!("it sent {:02x?}", &buf[..seen])));
        }
        if got >= PREFIX_LEN {
            if buf[4] != VERSION {
                return Err(AuthError::Malformed(format!("version {} (this side speaks {VERSION})", buf[4])));
            }
            if buf[5] != kind {
                return Err(AuthError::Malformed(format!("message type {} where {kind} was due", buf[5])));
            }
        }
    }
    Ok(buf)
}

fn send_message(w: &mut (impl Wire + ?Sized), m: &[u8], deadline: Instant, limit: Duration) -> Result<(), AuthError> {
    send_all_by(w, &mut [IoSlice::new(m)], Some(deadline)).map_err(|e| match e.kind() {
        io::ErrorKind::TimedOut => AuthError::TimedOut(limit),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe | io::ErrorKind::WriteZero => AuthError::Closed,
        _ => AuthError::Io(e),
    })
}

fn accept(
    keyring: &Keyring,
    service: Service,
    w: &mut (impl Wire + ?Sized),
    deadline: Instant,
    limit: Duration,
) -> Result<(), AuthError> {
    let hello = recv_message(w, HELLO, HELLO_LEN, deadline, limit, AuthError::NotAuthenticating)?;
    let mut challenge = prefix(CHALLENGE, CHALLENGE_LEN);
    let asked = hello[6];
    if asked != service as u8 {
        challenge[6] = WRONG_SERVICE;
        challenge[7] = service as u8;
        let _ = send_message(w, &challenge, deadline, limit);
        return Err(AuthError::WrongService { expected: service, found: describe_service(asked) });
    }
    let n_ids = usize::from(hello[7]);
    if n_ids == 0 || n_ids > MAX_SECRETS {
        return Err(AuthError::Malformed(format!("a hello with {n_ids} secret ids")));
    }
    let ids = &hello[8..8 + n_ids * ID_LEN];
    let nonce_c = &hello[8 + MAX_SECRETS * ID_LEN..];
    let Some(secret) = ids.chunks(ID_LEN).find_map(|id| keyring.find(id)) else {
        challenge[6] = NO_SHARED_SECRET;
        let _ = send_message(w, &challenge, deadline, limit);
        return Err(AuthError::NoSharedSecret);
    };
    let nonce_s = nonce();
    challenge[8..16].copy_from_slice(&secret.id);
    challenge[16..48].copy_from_slice(&nonce_s);
    let mac_s = proof(secret, SERVER_ROLE, service, nonce_c, &nonce_s).finalize().into_bytes();
    challenge[48..80].copy_from_slice(&mac_s);
    send_message(w, &challenge, deadline, limit)?;
    let answer = recv_message(w, PROOF, PROOF_LEN, deadline, limit, AuthError::Malformed)?;
    let mut verdict = prefix(VERDICT, VERDICT_LEN);
    if proof(secret, CLIENT_ROLE, service, nonce_c, &nonce_s).verify_slice(&answer[8..]).is_err() {
        verdict[6] = BAD_PROOF;
        let _ = send_message(w, &verdict, deadline, limit);
        return Err(AuthError::BadProof);
    }
    send_message(w, &verdict, deadline, limit)
}

fn describe_service(b: u8) -> String {
    Service::from_u8(b).map_or_else(|| format!("unknown (kind {b})"), |s| s.to_string())
}

fn dial(
    keyring: &Keyring,
    service: Service,
    w: &mut (impl Wire + ?Sized),
    deadline: Instant,
    limit: Duration,
) -> Result<(), AuthError> {
    let mut hello = prefix(HELLO, HELLO_LEN);
    hello[6] = service as u8;
    hello[7] = keyring.secrets.len() as u8;
    for (i, s) in keyring.secrets.iter().enumerate() {
        hello[8 + i * ID_LEN..8 + (i + 1) * ID_LEN].copy_from_slice(&s.id);
    }
    let nonce_c = nonce();
    hello[8 + MAX_SECRETS * ID_LEN..].copy_from_slice(&nonce_c);
    send_message(w, &hello, deadline, limit)?;
    let challenge = recv_message(w, CHALLENGE, CHALLENGE_LEN, deadline, limit, AuthError::NotAuthenticating)?;
    match challenge[6] {
        OK => {}
        NO_SHARED_SECRET => return Err(AuthError::NoSharedSecret),
        WRONG_SERVICE => {
            return Err(AuthError::WrongService { expected: service, found: describe_service(challenge[7]) })
        }
        s => return Err(AuthError::Malformed(format!("challenge status {s}"))),
    }
    let secret = keyring
        .find(&challenge[8..16])
        .ok_or_else(|| AuthError::Malformed("the challenge names a secret we did not offer".into()))?;
    let nonce_s = &challenge[16..48];
    if proof(secret, SERVER_ROLE, service, &nonce_c, nonce_s).verify_slice(&challenge[48..80]).is_err() {
        return Err(AuthError::BadProof);
    }
    let mut answer = prefix(PROOF, PROOF_LEN);
    answer[8..].copy_from_slice(&proof(secret, CLIENT_ROLE, service, &nonce_c, nonce_s).finalize().into_bytes());
    send_message(w, &answer, deadline, limit)?;
    let verdict = recv_message(w, VERDICT, VERDICT_LEN, deadline, limit, AuthError::Malformed)?;
    match verdict[6] {
        OK => Ok(()),
        BAD_PROOF => Err(AuthError::Refused),
        s => Err(AuthError::Malformed(format!("verdict status {s}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    const A: &str = "an old secret of the cluster, 32+";
    const B: &str = "the new secret of the cluster 32+";
    const C: &str = "someone else's secret, long enough";

    fn auth(secrets: &[&str]) -> Auth {
        Auth::new(Some(Keyring::new(secrets).unwrap())).with_timeout(Duration::from_secs(5))
    }

    /// Runs the exchange between a dialer and a listener over a socket pair.
    fn exchange(
        dialer: &Auth,
        listener: &Auth,
        dialed: Service,
        served: Service,
    ) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let l = listener.clone();
        let server = std::thread::spawn(move || {
            let r = l.accept(served, &mut b);
            drop(b);
            r
        });
        let d = dialer.dial(dialed, &mut a, None);
        drop(a);
        (d, server.join().unwrap())
    }

    #[test]
    fn peers_that_share_a_secret_authenticate_each_other() {
        let (d, l) = exchange(&auth(&[A]), &auth(&[A]), Service::Tcp, Service::Tcp);
        assert!(d.is_ok() && l.is_ok(), "{d:?} {l:?}");
    }

    #[test]
    fn a_wrong_secret_is_refused_and_counted_on_both_sides() {
        let listener = auth(&[A]);
        let dialer = auth(&[C]);
        let (d, l) = exchange(&dialer, &listener, Service::Tcp, Service::Tcp);
        assert!(matches!(d, Err(AuthError::NoSharedSecret)), "{d:?}");
        assert!(matches!(l, Err(AuthError::NoSharedSecret)), "{l:?}");
        assert_eq!((listener.stats().refused(Service::Tcp), listener.stats().accepted(Service::Tcp)), (1, 0));
        assert_eq!(dialer.stats().dial_failed(Service::Tcp), 1);
    }

    #[test]
    fn a_proof_for_one_port_is_no_proof_for_another() {
        let (d, l) = exchange(&auth(&[A]), &auth(&[A]), Service::Handshake, Service::Tcp);
        assert!(matches!(d, Err(AuthError::WrongService { expected: Service::Handshake, .. })), "{d:?}");
        assert!(matches!(l, Err(AuthError::WrongService { .. })), "{l:?}");
    }

    #[test]
    fn during_a_rotation_every_pair_of_adjacent_steps_shares_a_secret() {
        // old; old+new; new+old; new — each step with itself and its neighbours.
        let steps = [auth(&[A]), auth(&[A, B]), auth(&[B, A]), auth(&[B])];
        for i in 0..steps.len() {
            for j in i.saturating_sub(1)..(i + 2).min(steps.len()) {
                let (d, l) = exchange(&steps[i], &steps[j], Service::Shm, Service::Shm);
                assert!(d.is_ok() && l.is_ok(), "step {i} to step {j}: {d:?} {l:?}");
            }
        }
        let (d, _) = exchange(&steps[0], &steps[3], Service::Shm, Service::Shm);
        assert!(d.is_err(), "the old secret alone meets the new one alone");
    }

    #[test]
    fn a_listener_without_a_secret_is_not_trusted_by_a_dialer_with_one() {
        // A listener that speaks its own protocol reads the hello as garbage and closes.
        let (mut a, b) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let mut buf = [0u8; 8];
            let _ = std::io::Read::read(&mut &b, &mut buf);
            drop(b);
        });
        let err = auth(&[A]).dial(Service::Tcp, &mut a, None).unwrap_err();
        assert!(matches!(err, AuthError::Closed), "{err}");
        server.join().unwrap();
    }

    #[test]
    fn a_peer_that_speaks_another_protocol_is_refused_at_once() {
        let listener = auth(&[A]);
        let (a, mut b) = UnixStream::pair().unwrap();
        std::io::Write::write_all(&mut &a, b"CT\x01\x01 a tcp transport request....").unwrap();
        let started = Instant::now();
        let err = listener.accept(Service::Tcp, &mut b).unwrap_err();
        assert!(matches!(err, AuthError::NotAuthenticating(_)), "{err}");
        assert!(started.elapsed() < Duration::from_secs(4), "refused without waiting for the deadline");
        assert_eq!(listener.stats().refused(Service::Tcp), 1);
    }

    #[test]
    fn a_silent_or_trickling_peer_ends_at_the_deadline() {
        let listener = auth(&[A]).with_timeout(Duration::from_millis(300));
        let (a, mut b) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || {
            for byte in prefix(HELLO, HELLO_LEN) {
                if std::io::Write::write_all(&mut &a, &[byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let err = listener.accept(Service::Tcp, &mut b).unwrap_err();
        assert!(matches!(err, AuthError::TimedOut(_)), "{err}");
        drop(b);
        writer.join().unwrap();
    }

    /// A listener that knows the secret's id but not the secret (a man in the middle who saw
    /// a hello) cannot make a dialer send anything past its hello.
    #[test]
    fn a_listener_that_does_not_know_the_secret_gets_no_proof() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let id = Secret::new(A.as_bytes()).unwrap().id;
        let fake = std::thread::spawn(move || {
            let hello = recv_message(
                &mut b,
                HELLO,
                HELLO_LEN,
                Instant::now() + Duration::from_secs(5),
                Duration::ZERO,
                AuthError::NotAuthenticating,
            )
            .unwrap();
            let mut c = prefix(CHALLENGE, CHALLENGE_LEN);
            c[8..16].copy_from_slice(&id);
            // A reflection: the dialer's own nonce back, and a MAC under a guessed key.
            c[16..48].copy_from_slice(&hello[24..56]);
            let guessed = Secret::new(C.as_bytes()).unwrap();
            let mac =
                proof(&guessed, SERVER_ROLE, Service::Tcp, &hello[24..56], &hello[24..56]).finalize().into_bytes();
            c[48..80].copy_from_slice(&mac);
            std::io::Write::write_all(&mut &b, &c).unwrap();
            let mut rest = Vec::new();
            let _ = std::io::Read::read_to_end(&mut &b, &mut rest);
            rest
        });
        let err = auth(&[A]).dial(Service::Tcp, &mut a, None).unwrap_err();
        assert!(matches!(err, AuthError::BadProof), "{err}");
        drop(a);
        assert!(fake.join().unwrap().is_empty(), "the dialer sent nothing after its hello");
    }

    #[test]
    fn secrets_are_checked_and_read_from_files_and_variables() {
        assert!(Keyring::new(&["short"]).unwrap_err().is_caller_error());
        assert!(Keyring::new(&[A, A]).is_err());
        assert!(Keyring::new(&[A, B, C]).is_err());
        let k = Keyring::parse(&format!("# rotation\n{A}\n\n  {B}  \n")).unwrap();
        assert_eq!(k.ids().len(), 2);
        assert!(!format!("{k:?}").contains("secret"), "Debug shows ids only: {k:?}");
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        assert!(Keyring::from_vars(vars(&[])).unwrap().is_none());
        assert_eq!(Keyring::from_vars(vars(&[(SECRET_ENV, A), (SECRET_NEXT_ENV, B)])).unwrap().unwrap().ids().len(), 2);
        assert!(Keyring::from_vars(vars(&[(SECRET_NEXT_ENV, B)])).is_err());
        let err = Keyring::from_vars(vars(&[(SECRET_FILE_ENV, "/nonexistent/secret")])).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/secret"), "{err}");
    }

    #[test]
    fn tokens_verify_under_either_secret_of_a_rotation_and_name_their_context() {
        let old = Keyring::new(&[A]).unwrap();
        let both = Keyring::new(&[B, A]).unwrap();
        let t = old.token("master/tenant-a");
        assert!(both.verify_token("master/tenant-a", &t));
        assert!(!both.verify_token("master/tenant-b", &t), "a token names its tenant");
        assert!(!Keyring::new(&[C]).unwrap().verify_token("master/tenant-a", &t));
        assert!(!both.verify_token("master/tenant-a", "not hex"));
        assert!(!t.contains(A));
    }
}
