//! Tenants (issue 26, upstream's `tenant_id`): clients of one tenant neither see, read,
//! overwrite nor remove another's keys, nor get replicas in its segments.
//!
//! The master keeps one namespace: the gRPC layer ([`super::service`]) scopes every key and client
//! id a client of tenant `T` names to `"\0T\0name"` on the way in, and strips it on
//! the way out (a name of another tenant is never handed out). The default tenant's names are
//! kept as they are — a master with one tenant stores what it always did — but for names that
//! start with `'\0'`, which get a scope of their own (so they cannot reach another tenant's).
//! Tenant names have no `'\0'` ([`super::access::check_tenant`]), so a scoped name has one
//! reading. The core ([`super::Master`]) needs one rule: a key's replicas go only to segments of
//! a client of the key's tenant ([`tenant_of`]), and a put's eviction takes only that tenant's
//! objects.
//!
//! Which tenant a request is for comes from [`super::access`]: with a cluster secret, the
//! token names it (a client cannot claim a tenant whose token it cannot make).

use crate::master::access::DEFAULT_TENANT;

const MARK: char = '\0';

/// The master's name for `name` of a client of `tenant`. The default tenant's names that start
/// with `'\0'` get one more `'\0'` ahead: they land in a scope of their own (the tenant `""`,
/// which no token names), never in another tenant's.
pub fn scope(tenant: &str, name: &str) -> String {
    if tenant != DEFAULT_TENANT {
        format!("{MARK}{tenant}{MARK}{name}")
    } else if name.starts_with(MARK) {
        format!("{MARK}{MARK}{name}")
    } else {
        name.to_string()
    }
}

/// [`scope`] of a name the caller owns, in place: no copy for the default tenant's names,
/// which most calls carry and which stay as they are.
pub fn scope_in_place(tenant: &str, name: &mut String) {
    if tenant != DEFAULT_TENANT || name.starts_with(MARK) {
        *name = scope(tenant, name);
    }
}

/// The tenant's name for the master's `scoped`, or None when it belongs to another tenant.
pub fn unscope<'a>(tenant: &str, scoped: &'a str) -> Option<&'a str> {
    match scoped.strip_prefix(MARK) {
        None => (tenant == DEFAULT_TENANT).then_some(scoped),
        Some(rest) if tenant == DEFAULT_TENANT => rest.strip_prefix(MARK),
        Some(rest) => rest.strip_prefix(tenant)?.strip_prefix(MARK),
    }
}

/// [`unscope`] of a name the caller owns: its scope (a prefix) cut in place, none for most of
/// the default tenant's names, without a copy; false (the name left as it was) when it belongs
/// to another tenant.
pub fn unscope_in_place(tenant: &str, scoped: &mut String) -> bool {
    let Some(len) = unscope(tenant, scoped).map(str::len) else { return false };
    scoped.drain(..scoped.len() - len);
    true
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
    fn names_unscoped_in_place_read_as_unscope_says() {
        for t in [DEFAULT_TENANT, "a", "ab"] {
            for name in ["k/1", "\0k", "", "é/ключ"] {
                let scoped = scope(t, name);
                let mut in_place = name.to_string();
                scope_in_place(t, &mut in_place);
                assert_eq!(in_place, scoped, "{t}/{name:?} scoped in place");
                for reader in [DEFAULT_TENANT, "a", "ab"] {
                    let mut s = scoped.clone();
                    let kept = unscope_in_place(reader, &mut s);
                    match unscope(reader, &scoped) {
                        Some(n) => assert!(kept && s == n, "{t}/{name:?} read by {reader}: {s:?}"),
                        None => assert!(!kept && s == scoped, "{t}/{name:?} read by {reader}: {s:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn scoped_names_round_trip_and_never_cross_tenants() {
        for t in [DEFAULT_TENANT, "a", "ab"] {
            let s = scope(t, "k/1");
            assert_eq!(unscope(t, &s), Some("k/1"));
            assert_eq!(tenant_of(&s), t);
        }
        assert_eq!(scope(DEFAULT_TENANT, "k"), "k");
        let a = scope("a", "k");
        let ab = scope("ab", "k");
        assert_eq!(unscope("ab", &a), None);
        assert_eq!(unscope("a", &ab), None);
        assert_eq!(unscope(DEFAULT_TENANT, &a), None);
        assert_eq!(unscope("a", "k"), None);
        // Spelling another tenant's scoped name reaches a scope of one's own.
        for t in [DEFAULT_TENANT, "b"] {
            let s = scope(t, &a);
            assert_ne!(tenant_of(&s), "a");
            assert_eq!(unscope("a", &s), None);
            assert_eq!(unscope(t, &s), Some(a.as_str()));
        }
    }
}
