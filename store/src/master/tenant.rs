//! Tenants (issue 26, upstream's `tenant_id`): clients of one tenant neither see, read,
//! overwrite nor remove another's keys, nor get replicas in its segments.
//!
//! The master keeps one namespace: the gRPC layer ([`super::service`]) scopes every key, client
//! id and disk id a client of tenant `T` names to `"\0T\0name"` on the way in, and strips it on
//! the way out (a name of another tenant is never handed out). The default tenant's names are
//! kept as they are — a master with one tenant stores what it always did — and a name of the
//! default tenant may not start with `'\0'`, so it cannot reach into another tenant's scope.
//! Tenant names have no `'\0'` ([`super::access::check_tenant`]), so a scoped name has one
//! reading. The core ([`super::Master`]) needs one rule: a key's replicas go only to segments of
//! a client of the key's tenant ([`tenant_of`]), and a put's eviction takes only that tenant's
//! objects.
//!
//! Which tenant a request is for comes from [`super::access`]: with a cluster secret, the
//! token names it (a client cannot claim a tenant whose token it cannot make).

use crate::error::{Result, StoreError};
use crate::master::access::DEFAULT_TENANT;

const MARK: char = '\0';

/// The master's name for `name` of a client of `tenant`.
pub fn scope(tenant: &str, name: &str) -> Result<String> {
    if name.starts_with(MARK) {
        return Err(StoreError::InvalidArgument("a key or id may not start with a NUL byte".into()));
    }
    Ok(if tenant == DEFAULT_TENANT { name.to_string() } else { format!("{MARK}{tenant}{MARK}{name}") })
}

/// The tenant's name for the master's `scoped`, or None when it belongs to another tenant.
pub fn unscope<'a>(tenant: &str, scoped: &'a str) -> Option<&'a str> {
    match scoped.strip_prefix(MARK) {
        None => (tenant == DEFAULT_TENANT).then_some(scoped),
        Some(rest) => rest.strip_prefix(tenant)?.strip_prefix(MARK),
    }
}

/// The tenant a scoped key or client id belongs to.
pub fn tenant_of(scoped: &str) -> &str {
    match scoped.strip_prefix(MARK) {
        None => DEFAULT_TENANT,
        Some(rest) => rest.split(MARK).next().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_names_round_trip_and_never_cross_tenants() {
        for t in [DEFAULT_TENANT, "a", "ab"] {
            let s = scope(t, "k/1").unwrap();
            assert_eq!(unscope(t, &s), Some("k/1"));
            assert_eq!(tenant_of(&s), t);
        }
        assert_eq!(scope(DEFAULT_TENANT, "k").unwrap(), "k");
        let a = scope("a", "k").unwrap();
        let ab = scope("ab", "k").unwrap();
        assert_eq!(unscope("ab", &a), None);
        assert_eq!(unscope("a", &ab), None);
        assert_eq!(unscope(DEFAULT_TENANT, &a), None);
        assert_eq!(unscope("a", "k"), None);
        // The default tenant cannot name a scoped key.
        assert!(scope(DEFAULT_TENANT, &a).is_err());
        assert!(scope("b", &a).is_err());
    }
}
