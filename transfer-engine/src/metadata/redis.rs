//! redis backend: one connection, made again after an error, with timeouts on every call.
//! Entries with a TTL are `SET … PX <ms>`: each put renews them.

use std::time::Duration;

use ::redis::{Client, Connection, IntoConnectionInfo, RedisError};
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

pub(crate) struct RedisStore {
    address: String,
    client: Client,
    connection: Mutex<Option<Connection>>,
}

impl RedisStore {
    /// Connects to the server and checks that it answers (and accepts the credentials).
    pub(crate) fn connect(url: &str, address: &str) -> Result<Self> {
        let client = Client::open(url).map_err(|e| {
            EngineError::Config(format!("metadata server {address}: invalid redis URL ({:?})", e.kind()))
        })?;
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
