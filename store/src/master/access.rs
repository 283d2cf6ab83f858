//! Who may use the master (issue 26): with a cluster secret, every gRPC call carries a bearer
//! token derived from it, and so does every admin request but the ones left open.
//!
//! * **Tokens, not the secret.** A token is `HMAC(secret, context)` (see
//!   [`Keyring::token`]); the secret itself never travels. A client's token names its tenant:
//!   `authorization: Bearer <tenant>.<hex>` with the context `crescent-master tenant <tenant>`,
//!   so a client cannot claim a tenant whose token it cannot make. The admin port's token is
//!   `Bearer <hex>` with the context `crescent-master admin`; `crescent token --admin` prints it.
//! * **Rotation.** A token made with either secret of the master's keyring is accepted.
//! * **Verified once.** A token's HMAC is checked the first time it comes; the verified token
//!   and its tenant are then kept (at most [`TOKEN_CACHE_CAP`] of them), so the calls after
//!   cost a lookup, not an HMAC: authentication per client, not per request. Only tokens
//!   that verified enter, so a flood of wrong tokens cannot grow the map (each still costs its
//!   HMAC, as before); a map that is full is emptied and refills with the tokens in use. The
//!   map belongs to the [`Access`] of one keyring, which does not change while the master
//!   runs (a rotation restarts the master with both secrets; see docs: security), so a token
//!   kept is never one its keyring would refuse.
//! * **The admin port.** With a secret, every route but `/health` (liveness probes) needs the
//!   admin token, because `/query_key`, `/get_all_*`, `/keys`, `/segments` and the scheduler's
//!   queries name keys, segments and memory addresses — what an outsider needs to aim at a
//!   client's memory. `admin_open_reads` (`--admin-open-reads`) leaves these read-only routes
//!   open (for a dashboard on a trusted network); no admin route changes state today.
//! * **Refusals are counted** in `crescent_master_auth_refused_total{port}` and answered with
//!   `UNAUTHENTICATED` (gRPC) or 401 (admin).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use crescent_transports::net::Keyring;
use parking_lot::RwLock;
use prometheus::IntCounterVec;
use tonic::metadata::MetadataMap;

pub use crate::protocol::{admin_token, check_tenant, client_token, DEFAULT_TENANT, TENANT_HEADER};
use crate::protocol::{tenant_context, ADMIN_CONTEXT};

/// The tenant a request is served for (in the request's extensions).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant(pub String);

impl Default for Tenant {
    fn default() -> Self {
        Tenant(DEFAULT_TENANT.into())
    }
}

/// Verified client tokens an [`Access`] keeps at most.
pub const TOKEN_CACHE_CAP: usize = 4096;

/// The master's access control.
#[derive(Clone)]
pub struct Access {
    keyring: Option<Arc<Keyring>>,
    admin_open_reads: bool,
    refused: IntCounterVec,
    /// Client tokens that verified under `keyring` (the whole `Bearer` value's token), and
    /// their tenants.
    verified: Arc<RwLock<HashMap<String, Tenant>>>,
    /// HMAC verifications of client tokens made (cache misses), for tests and profiles.
    verifications: Arc<AtomicU64>,
}

impl Access {
    /// Access under `keyring`'s secrets (`None`: everything open, every tenant by name), the
    /// admin port's read-only routes left open when `admin_open_reads`; refusals are counted in
    /// `refused` by its `port` label (`grpc`, `admin`).
    pub fn new(keyring: Option<Keyring>, admin_open_reads: bool, refused: IntCounterVec) -> Access {
        Access {
            keyring: keyring.map(Arc::new),
            admin_open_reads,
            refused,
            verified: Arc::default(),
            verifications: Arc::default(),
        }
    }

    /// How many client tokens were checked by their HMAC (calls whose token was not kept).
    pub fn token_verifications(&self) -> u64 {
        self.verifications.load(Ordering::Relaxed)
    }

    /// True when a secret is set: calls and admin requests need tokens.
    pub fn is_required(&self) -> bool {
        self.keyring.is_some()
    }

    fn bearer(value: Option<&str>) -> Option<&str> {
        let v = value?.trim();
        v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")).map(str::trim)
    }

    /// The tenant of a gRPC call with `metadata`, or why it is refused.
    #[allow(clippy::result_large_err)] // tonic's Status
    pub fn check_call(&self, metadata: &MetadataMap) -> Result<Tenant, tonic::Status> {
        let header = |name: &str| metadata.get(name).and_then(|v| v.to_str().ok());
        let Some(keyring) = &self.keyring else {
            let tenant = header(TENANT_HEADER).map(str::trim).filter(|t| !t.is_empty()).unwrap_or(DEFAULT_TENANT);
            check_tenant(tenant).map_err(tonic::Status::invalid_argument)?;
            return Ok(Tenant(tenant.to_string()));
        };
        let refuse = |why: &str| {
            self.refused.with_label_values(&["grpc"]).inc();
            tonic::Status::unauthenticated(format!("{why} (the master requires the cluster secret's token)"))
        };
        let token = Self::bearer(header("authorization")).ok_or_else(|| refuse("no bearer token"))?;
        if let Some(tenant) = self.verified.read().get(token) {
            return Ok(tenant.clone());
        }
        let (tenant, _) = token.split_once('.').ok_or_else(|| refuse("a malformed token"))?;
        if check_tenant(tenant).is_err() {
            return Err(refuse("a wrong token"));
        }
        self.verifications.fetch_add(1, Ordering::Relaxed);
        if !keyring.verify_token(&tenant_context(tenant), &token[tenant.len() + 1..]) {
            return Err(refuse("a wrong token"));
        }
        let tenant = Tenant(tenant.to_string());
        let mut verified = self.verified.write();
        if verified.len() >= TOKEN_CACHE_CAP {
            verified.clear();
        }
        verified.insert(token.to_string(), tenant.clone());
        Ok(tenant)
    }

    /// How many verified client tokens are kept now.
    pub fn tokens_kept(&self) -> usize {
        self.verified.read().len()
    }

    /// True when an admin request for `path` with `authorization` may be served.
    pub fn admits_admin(&self, path: &str, authorization: Option<&str>) -> bool {
        let Some(keyring) = &self.keyring else { return true };
        if path == "/health" || self.admin_open_reads {
            return true;
        }
        let ok = Self::bearer(authorization).is_some_and(|t| keyring.verify_token(ADMIN_CONTEXT, t));
        if !ok {
            self.refused.with_label_values(&["admin"]).inc();
        }
        ok
    }
}

/// The admin router's middleware: [`Access::admits_admin`], else 401.
pub async fn admin_gate(access: Access, req: Request, next: Next) -> Response {
    let auth = req.headers().get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if access.admits_admin(req.uri().path(), auth) {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
            "the admin port requires the cluster secret's admin token (crescent token --admin)\n",
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Opts;

    const A: &str = "0123456789abcdef0123456789abcdef";
    const B: &str = "fedcba9876543210fedcba9876543210";

    fn access(secrets: Option<&[&str]>, open_reads: bool) -> Access {
        let refused = IntCounterVec::new(Opts::new("r", "r"), &["port"]).unwrap();
        Access::new(secrets.map(|s| Keyring::new(s).unwrap()), open_reads, refused)
    }

    fn call(token: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(t) = token {
            m.insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        m
    }

    #[test]
    fn a_call_needs_a_token_that_names_its_tenant() {
        let a = access(Some(&[A]), false);
        let k = Keyring::new(&[A]).unwrap();
        assert_eq!(a.check_call(&call(Some(&client_token(&k, "team-a")))).unwrap(), Tenant("team-a".into()));
        for bad in [None, Some("nonsense"), Some("team-a.00")] {
            let e = a.check_call(&call(bad)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
        // Another tenant's name on team-a's MAC, and a token of another secret.
        let forged = client_token(&k, "team-a").replacen("team-a", "team-b", 1);
        assert!(a.check_call(&call(Some(&forged))).is_err());
        assert!(a.check_call(&call(Some(&client_token(&Keyring::new(&[B]).unwrap(), "team-a")))).is_err());
        assert_eq!(a.refused.with_label_values(&["grpc"]).get(), 5);
        // Rotation: a master holding both accepts tokens of either.
        let both = access(Some(&[B, A]), false);
        assert!(both.check_call(&call(Some(&client_token(&k, "team-a")))).is_ok());
    }

    #[test]
    fn a_token_is_verified_once_and_wrong_ones_are_still_refused() {
        let a = access(Some(&[A]), false);
        let k = Keyring::new(&[A]).unwrap();
        let good = client_token(&k, "team-a");
        for _ in 0..5 {
            assert_eq!(a.check_call(&call(Some(&good))).unwrap(), Tenant("team-a".into()));
        }
        assert_eq!(a.token_verifications(), 1, "one HMAC for five calls");
        assert_eq!(a.tokens_kept(), 1);
        // A wrong token after the right one was kept: refused, checked, not kept. The kept
        // token with its MAC changed, another secret's, another tenant on its MAC.
        let mut changed = good.clone().into_bytes();
        let last = changed.len() - 1;
        changed[last] = if changed[last] == b'0' { b'1' } else { b'0' };
        let changed = String::from_utf8(changed).unwrap();
        let other_secret = client_token(&Keyring::new(&[B]).unwrap(), "team-a");
        let forged = good.replacen("team-a", "team-b", 1);
        for bad in [&changed, &other_secret, &forged] {
            for _ in 0..2 {
                assert!(a.check_call(&call(Some(bad))).is_err(), "{bad}");
            }
        }
        assert_eq!(a.token_verifications(), 7, "a refused token is checked every time");
        assert_eq!(a.tokens_kept(), 1, "refused tokens are not kept");
        assert_eq!(a.refused.with_label_values(&["grpc"]).get(), 6);
        // Clones (the gRPC gate's and the admin router's) share what is kept.
        assert!(a.clone().check_call(&call(Some(&good))).is_ok());
        assert_eq!(a.token_verifications(), 7);
    }

    #[test]
    fn the_kept_tokens_stay_under_their_cap() {
        let a = access(Some(&[A]), false);
        let k = Keyring::new(&[A]).unwrap();
        let first = client_token(&k, "t0");
        for i in 0..TOKEN_CACHE_CAP + 10 {
            assert!(a.check_call(&call(Some(&client_token(&k, &format!("t{i}"))))).is_ok());
            assert!(a.tokens_kept() <= TOKEN_CACHE_CAP);
        }
        assert_eq!(a.token_verifications(), (TOKEN_CACHE_CAP + 10) as u64);
        // The first token was dropped with the full map; it is verified again, then kept.
        assert!(a.check_call(&call(Some(&first))).is_ok());
        assert!(a.check_call(&call(Some(&first))).is_ok());
        assert_eq!(a.token_verifications(), (TOKEN_CACHE_CAP + 11) as u64);
    }

    #[test]
    fn without_a_secret_the_tenant_is_the_clients_word() {
        let a = access(None, false);
        assert_eq!(a.check_call(&call(None)).unwrap(), Tenant::default());
        let mut m = MetadataMap::new();
        m.insert(TENANT_HEADER, "team-b".parse().unwrap());
        assert_eq!(a.check_call(&m).unwrap(), Tenant("team-b".into()));
    }

    #[test]
    fn the_admin_port_needs_the_admin_token_but_for_health_or_open_reads() {
        let k = Keyring::new(&[A]).unwrap();
        let a = access(Some(&[A]), false);
        assert!(a.admits_admin("/health", None));
        assert!(!a.admits_admin("/query_key", None));
        assert!(!a.admits_admin("/get_all_keys", Some(&format!("Bearer {}", client_token(&k, "x")))));
        assert!(a.admits_admin("/query_key", Some(&format!("Bearer {}", admin_token(&k)))));
        assert!(access(Some(&[A]), true).admits_admin("/get_all_keys", None));
        assert!(access(None, false).admits_admin("/get_all_keys", None));
    }
}
