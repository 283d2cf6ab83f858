//! http backend: `GET`/`PUT`/`DELETE <url>?key=<key>` as Mooncake's http metadata server
//! answers them (404 for a missing key). A TTL travels as `&ttl_ms=<ms>`, which the project's
//! own server ([`super::server`]) honours; a server that ignores it keeps entries until they
//! are deleted.

use std::time::Duration;

use ureq::Agent;

use super::{unavailable, MetadataStore, MAX_VALUE_LEN, SERVICE_TIMEOUT};
use crate::error::{EngineError, Result};

pub(crate) struct HttpStore {
    url: String,
    agent: Agent,
}

impl HttpStore {
    /// Connects to the service and checks that it answers an http request.
    pub(crate) fn connect(url: &str) -> Result<Self> {
        let config = Agent::config_builder()
            .timeout_global(Some(SERVICE_TIMEOUT))
            .http_status_as_error(false)
            .max_redirects(0)
            .build();
        let store = HttpStore { url: url.to_string(), agent: config.into() };
        // Any http answer will do (a missing key is 404): it shows that the service is up.
        store.get("mooncake/crescent-probe")?;
        tracing::info!("metadata: connected to {url}");
        Ok(store)
    }

    fn status_error(&self, method: &str, key: &str, status: u16, body: &str) -> EngineError {
        let body: String = body.chars().take(200).collect();
        unavailable(&self.url, format!("{method} of {key} answered {status}: {}", body.trim()))
    }
}

fn read_body(response: &mut ureq::http::Response<ureq::Body>) -> Result<Vec<u8>, ureq::Error> {
    response.body_mut().with_config().limit(MAX_VALUE_LEN as u64).read_to_vec()
}

impl MetadataStore for HttpStore {
    fn address(&self) -> &str {
        &self.url
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let mut response = self.agent.get(&self.url).query("key", key).call().map_err(|e| unavailable(&self.url, e))?;
        let status = response.status().as_u16();
        let body = read_body(&mut response);
        match status {
            200 => body.map(Some).map_err(|e| match e {
                ureq::Error::BodyExceedsLimit(_) => EngineError::BadMetadata {
                    address: self.url.clone(),
                    key: key.to_string(),
                    reason: format!("more than {MAX_VALUE_LEN} bytes"),
                },
                e => unavailable(&self.url, e),
            }),
            404 => Ok(None),
            s => Err(self.status_error("GET", key, s, &String::from_utf8_lossy(&body.unwrap_or_default()))),
        }
    }

    fn put(&self, key: &str, value: &[u8], ttl: Option<Duration>) -> Result<()> {
        let mut request = self.agent.put(&self.url).query("key", key);
        if let Some(ttl) = ttl {
            request = request.query("ttl_ms", ttl.as_millis().max(1).to_string());
        }
        let mut response =
            request.header("content-type", "application/json").send(value).map_err(|e| unavailable(&self.url, e))?;
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            Ok(())
        } else {
            let body = read_body(&mut response).unwrap_or_default();
            Err(self.status_error("PUT", key, status, &String::from_utf8_lossy(&body)))
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        let mut response =
            self.agent.delete(&self.url).query("key", key).call().map_err(|e| unavailable(&self.url, e))?;
        let status = response.status().as_u16();
        if (200..300).contains(&status) || status == 404 {
            Ok(())
        } else {
            let body = read_body(&mut response).unwrap_or_default();
            Err(self.status_error("DELETE", key, status, &String::from_utf8_lossy(&body)))
        }
    }
}
