//! redis backend: one connection, made again after an error, with timeouts on every call.
//! Entries with a TTL are `SET … PX <ms>`: each put renews them.

use std::time::Duration;

use ::redis::{Client, Connection, ConnectionInfo, IntoConnectionInfo, RedisError};
use parking_lot::Mutex;

use super::{unavailable, MAX_VALUE_LEN, SERVICE_TIMEOUT};
use crate::error::{EngineError, Result};

/// Checks a `redis://` URL without connecting; the message never repeats a password.
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    let info =
        url.into_connection_info().map_err(|_| "not a redis URL (redis://[user:pass@]host:port[/db])".to_string())?;
    match info.addr() {
        ::redis::ConnectionAddr::Tcp(host, port) if !host.is_empty() && *port != 0 => Ok(()),
        ::redis::ConnectionAddr::Tcp(..) => Err("a redis URL needs a host and a port".into()),
        _ => Err("only plain TCP redis URLs are supported".into()),
    }
}

/// `info` with what `url` leaves out taken from Mooncake's variables (`var`): the user and
/// password (`MC_REDIS_USERNAME`, `MC_REDIS_PASSWORD`) when the URL has no password, the
/// database (`MC_REDIS_DB_INDEX`, 0-255 as upstream) when its path names none.
fn with_env(info: ConnectionInfo, url: &str, var: &dyn Fn(&str) -> Option<String>) -> Result<ConnectionInfo> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    let mut redis = info.redis_settings().clone();
    if redis.password().is_none() {
        if let Some(user) = set("MC_REDIS_USERNAME") {
            redis = redis.set_username(user);
        }
        if let Some(password) = set("MC_REDIS_PASSWORD") {
            redis = redis.set_password(password);
        }
    }
    let path_names_db = ::redis::parse_redis_url(url).is_some_and(|u| !u.path().trim_matches('/').is_empty());
    if let Some(v) = set("MC_REDIS_DB_INDEX").filter(|_| !path_names_db) {
        let db = v.trim().parse::<u8>().map_err(|_| {
            EngineError::Config(format!("MC_REDIS_DB_INDEX={v:?} is not a database number from 0 to 255"))
        })?;
        redis = redis.set_db(i64::from(db));
    }
    Ok(info.set_redis_settings(redis))
}

pub(crate) struct RedisStore {
    address: String,
    client: Client,
    connection: Mutex<Option<Connection>>,
}

impl RedisStore {
    /// Connects to the server and checks that it answers (and accepts the credentials).
    /// Credentials and database the URL does not give come from Mooncake's `MC_REDIS_USERNAME`,
    /// `MC_REDIS_PASSWORD` and `MC_REDIS_DB_INDEX`.
    pub(crate) fn connect(url: &str, address: &str) -> Result<Self> {
        let invalid = |e: RedisError| {
            EngineError::Config(format!("metadata server {address}: invalid redis URL ({:?})", e.kind()))
        };
        let info = url.into_connection_info().map_err(invalid)?;
        let info = with_env(info, url, &|name| std::env::var(name).ok())?;
        let client = Client::open(info).map_err(invalid)?;
        let store = RedisStore { address: address.to_string(), client, connection: Mutex::new(None) };
        store.call(|c| ::redis::cmd("PING").query::<String>(c))?;
        tracing::info!("metadata: connected to {address}");
        Ok(store)
    }

    /// Runs `f` on the connection, connecting first if needed. After an error the connection
    /// is dropped so that the next call connects again; a call that failed on a connection
    /// made earlier (the server may have restarted since) is tried once more on a new one —
    /// every command used here can be repeated safely.
    fn call<T>(&self, mut f: impl FnMut(&mut Connection) -> Result<T, RedisError>) -> Result<T> {
        let mut slot = self.connection.lock();
        let mut reused = slot.is_some();
        loop {
            if slot.is_none() {
                let c = self
                    .client
                    .get_connection_with_timeout(SERVICE_TIMEOUT)
                    .and_then(|c| {
                        c.set_read_timeout(Some(SERVICE_TIMEOUT))?;
                        c.set_write_timeout(Some(SERVICE_TIMEOUT))?;
                        Ok(c)
                    })
                    .map_err(|e| unavailable(&self.address, e))?;
                *slot = Some(c);
            }
            let connection = slot.as_mut().expect("connected above");
            match f(connection) {
                Ok(v) => return Ok(v),
                Err(e) => {
                    *slot = None;
                    let stale = e.is_io_error() || e.is_connection_dropped();
                    if !(reused && stale) {
                        return Err(unavailable(&self.address, e));
                    }
                    tracing::debug!("metadata: {} connection lost ({e}); reconnecting", self.address);
                    reused = false;
                }
            }
        }
    }
}

impl super::MetadataStore for RedisStore {
    fn address(&self) -> &str {
        &self.address
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        // Refuse oversized values before reading them.
        let len: usize = self.call(|c| ::redis::cmd("STRLEN").arg(key).query(c))?;
        if len > MAX_VALUE_LEN {
            return Err(EngineError::BadMetadata {
                address: self.address.clone(),
                key: key.to_string(),
                reason: format!("{len} bytes (at most {MAX_VALUE_LEN} accepted)"),
            });
        }
        self.call(|c| ::redis::cmd("GET").arg(key).query(c))
    }

    fn put(&self, key: &str, value: &[u8], ttl: Option<Duration>) -> Result<()> {
        let mut cmd = ::redis::cmd("SET");
        cmd.arg(key).arg(value);
        if let Some(ttl) = ttl {
            cmd.arg("PX").arg(ttl.as_millis().clamp(1, i64::MAX as u128) as i64);
        }
        self.call(|c| cmd.query::<()>(c))
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.call(|c| ::redis::cmd("DEL").arg(key).query::<i64>(c)).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(url: &str, vars: &[(&str, &str)]) -> Result<ConnectionInfo> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let var = move |n: &str| vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        with_env(url.into_connection_info().unwrap(), url, &var)
    }

    #[test]
    fn mooncake_variables_fill_in_what_the_url_leaves_out() {
        let env = [("MC_REDIS_USERNAME", "alice"), ("MC_REDIS_PASSWORD", "s3cret"), ("MC_REDIS_DB_INDEX", "7")];
        let r = info("redis://10.0.0.1:6379", &env).unwrap();
        let r = r.redis_settings();
        assert_eq!((r.username(), r.password(), r.db()), (Some("alice"), Some("s3cret"), 7));
        // The URL's own credentials and database win.
        let r = info("redis://bob:pw@10.0.0.1:6379/2", &env).unwrap();
        let r = r.redis_settings();
        assert_eq!((r.username(), r.password(), r.db()), (Some("bob"), Some("pw"), 2));
        // Unset: nothing added.
        let r = info("redis://10.0.0.1:6379", &[]).unwrap();
        let r = r.redis_settings();
        assert_eq!((r.username(), r.password(), r.db()), (None, None, 0));
    }

    #[test]
    fn a_bad_database_index_is_an_error_naming_it() {
        for bad in ["256", "-1", "one"] {
            let e = info("redis://h:6379", &[("MC_REDIS_DB_INDEX", bad)]).unwrap_err();
            assert!(e.to_string().contains("MC_REDIS_DB_INDEX") && e.to_string().contains(bad), "{e}");
            assert!(e.is_caller_error(), "{e}");
        }
    }
}
