//! A client of the master's admin port (HTTP/1.1, JSON and text): the answers the operator's
//! subcommands read, the leader check, and the admin token when a secret is set.

use std::time::Duration;

use crescent_store::master::{SegmentView, Totals};
use serde::Deserialize;
use serde_json::Value;
use ureq::Agent;

use super::prom::Samples;
use super::CliError;

/// How long one request may take, connection included.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read (a key list of millions of keys fits).
const MAX_BODY: u64 = 1 << 30;

/// The master's `/health`: its role and what it holds.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct Health {
    /// `single`, `leader`, `standby` or `deposed`.
    pub crescent_role: String,
    pub term: u64,
    pub leader: Option<String>,
    pub cluster_id: String,
    pub totals: Totals,
}

/// One client (`/nodes`).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct Node {
    pub client_id: String,
    pub host: String,
    pub segments: Vec<String>,
    pub capacity: u64,
    pub used: u64,
    pub objects: u64,
    pub get_rate: f64,
    pub put_rate: f64,
    pub ms_since_ping: u64,
}

/// The admin port of one master.
pub struct Admin {
    url: String,
    agent: Agent,
    authorization: Option<String>,
}

impl Admin {
    /// A client of the admin port at `url` (`http://HOST:PORT`), sending `token` when given.
    pub fn new(url: String, token: Option<String>) -> Admin {
        let agent = Agent::config_builder()
            .timeout_global(Some(TIMEOUT))
            .http_status_as_error(false)
            .max_redirects(0)
            .build()
            .into();
        Admin { url, agent, authorization: token.map(|t| format!("Bearer {t}")) }
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn answer(&self, path: &str, mut response: ureq::http::Response<ureq::Body>) -> Result<String, CliError> {
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_string()
            .map_err(|e| self.bad(path, format!("an unreadable body: {e}")))?;
        match status {
            200..=299 => Ok(body),
            401 => Err(CliError::Refused {
                url: self.url.clone(),
                why: match &self.authorization {
                    None => "no cluster secret is set here (CRESCENT_CLUSTER_SECRET_FILE or --secret-file)".into(),
                    Some(_) => "it is not the cluster secret's admin token".into(),
                },
            }),
            s => Err(self.bad(path, format!("{s}: {}", body.chars().take(200).collect::<String>().trim()))),
        }
    }

    fn bad(&self, path: &str, what: String) -> CliError {
        CliError::BadAnswer { url: self.url.clone(), path: path.to_string(), what }
    }

    fn unreachable(&self, e: ureq::Error) -> CliError {
        CliError::Unreachable { url: self.url.clone(), cause: e.to_string() }
    }

    /// `GET path` (with its query already in `path`, encoded): status and body.
    pub fn get_raw(&self, path: &str, query: &[(&str, &str)]) -> Result<(u16, String), CliError> {
        let mut request = self.agent.get(format!("{}{path}", self.url));
        for (k, v) in query {
            request = request.query(*k, *v);
        }
        if let Some(a) = &self.authorization {
            request = request.header("authorization", a);
        }
        let response = request.call().map_err(|e| self.unreachable(e))?;
        let status = response.status().as_u16();
        if status == 404 {
            let mut response = response;
            let body = response.body_mut().with_config().limit(MAX_BODY).read_to_string().unwrap_or_default();
            return Ok((404, body));
        }
        Ok((status, self.answer(path, response)?))
    }

    /// `GET path`: the body of a 2xx answer.
    pub fn get_text(&self, path: &str) -> Result<String, CliError> {
        match self.get_raw(path, &[])? {
            (404, body) => Err(self.bad(path, format!("404: {}", body.trim()))),
            (_, body) => Ok(body),
        }
    }

    /// `GET path` as JSON.
    pub fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        let body = self.get_text(path)?;
        serde_json::from_str(&body).map_err(|e| self.bad(path, format!("JSON this tool cannot read: {e}")))
    }

    /// `POST path` with a JSON body, answered with JSON.
    pub fn post_json(&self, path: &str, body: &Value) -> Result<Value, CliError> {
        let mut request = self.agent.post(format!("{}{path}", self.url)).header("content-type", "application/json");
        if let Some(a) = &self.authorization {
            request = request.header("authorization", a);
        }
        let response = request.send(body.to_string()).map_err(|e| self.unreachable(e))?;
        let text = self.answer(path, response)?;
        serde_json::from_str(&text).map_err(|e| self.bad(path, format!("JSON this tool cannot read: {e}")))
    }

    /// `/health`, refused unless the master serves (a single master or the HA leader): a
    /// standby's or a deposed leader's view is not the cluster's.
    pub fn leader_health(&self) -> Result<Health, CliError> {
        let h: Health = self.get_json("/health")?;
        match h.crescent_role.as_str() {
            "single" | "leader" => Ok(h),
            role => Err(CliError::NotLeader {
                url: self.url.clone(),
                role: format!("a {role}"),
                leader: h.leader.filter(|l| !l.is_empty()),
            }),
        }
    }

    /// `/metrics`, summed per series name.
    pub fn metrics(&self) -> Result<Samples, CliError> {
        Ok(Samples::parse(&self.get_text("/metrics")?))
    }

    /// `/segments`, memory and disks, in the master's order.
    pub fn segments(&self) -> Result<Vec<SegmentView>, CliError> {
        #[derive(Deserialize)]
        struct Answer {
            segments: Vec<SegmentView>,
        }
        Ok(self.get_json::<Answer>("/segments")?.segments)
    }

    /// `/nodes`: one entry per client.
    pub fn nodes(&self) -> Result<Vec<Node>, CliError> {
        #[derive(Deserialize)]
        struct Answer {
            nodes: Vec<Node>,
        }
        Ok(self.get_json::<Answer>("/nodes")?.nodes)
    }
}
