//! `crescent status` (one screen on the cluster) and `crescent top` (its rates, live).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use serde_json::json;

use crescent_store::master::SegmentView;

use super::admin::{Admin, Health, Node};
use super::prom::Samples;
use super::{bytes, percent, print_json, CliError, ClusterArgs};

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Samples to print before exiting [default: until interrupted].
    #[arg(long, short = 'n')]
    pub count: Option<u64>,
    /// Time between samples: seconds, or a number with ms or s (500ms, 2s).
    #[arg(long, short = 'i', default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, scale) = match (s.strip_suffix("ms"), s.strip_suffix('s')) {
        (Some(ms), _) => (ms, 1e-3),
        (None, Some(secs)) => (secs, 1.0),
        (None, None) => (s, 1.0),
    };
    match number.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v * scale >= 0.05 && v * scale <= 3600.0 => Ok(Duration::from_secs_f64(v * scale)),
        _ => Err(format!("{s:?}: give a time from 50ms to 3600s (e.g. 1s, 500ms)")),
    }
}

/// Everything one screen shows, read from the admin port.
struct Snapshot {
    at: Instant,
    health: Health,
    metrics: Samples,
    segments: Vec<SegmentView>,
    nodes: Vec<Node>,
}

impl Snapshot {
    fn take(admin: &Admin) -> Result<Snapshot, CliError> {
        let health = admin.leader_health()?;
        Ok(Snapshot {
            at: Instant::now(),
            health,
            metrics: admin.metrics()?,
            segments: admin.segments()?,
            nodes: admin.nodes()?,
        })
    }

    fn m(&self, name: &str) -> u64 {
        self.metrics.count(&format!("crescent_master_{name}"))
    }

    fn role(&self) -> String {
        match self.health.crescent_role.as_str() {
            "single" => "leader (single master)".into(),
            role => format!("{role} (HA)"),
        }
    }

    fn json(&self, admin: &Admin) -> serde_json::Value {
        let t = self.health.totals;
        json!({
            "admin": admin.url(),
            "cluster_id": self.health.cluster_id,
            "role": self.health.crescent_role,
            "term": self.health.term,
            "leader": self.health.leader,
            "clients": t.clients,
            "keys": t.keys,
            "memory": {"segments": self.memory_segments(), "capacity": t.capacity, "used": t.used},
            "disk": {
                "segments": self.m("disk_segments"), "capacity": self.m("disk_capacity_bytes"),
                "used": self.m("disk_used_bytes"), "replicas": self.m("disk_replicas"),
                "disk_only_keys": self.m("disk_only_keys"),
            },
            "evictions": self.m("evictions_total"),
            "evicted_bytes": self.m("evicted_bytes_total"),
            "segments": self.segments,
            "nodes": self.nodes,
        })
    }

    fn memory_segments(&self) -> usize {
        self.segments.iter().filter(|s| s.tier != "SSD").count()
    }

    /// The summary lines (master, keys, memory, disk).
    fn summary(&self, out: &mut String, admin: &Admin) {
        let h = &self.health;
        let t = h.totals;
        out.push_str(&format!(
            "master     {}  {}, term {}, cluster {:?}\n",
            admin.url(),
            self.role(),
            h.term,
            h.cluster_id
        ));
        out.push_str(&format!(
            "keys       {}    evictions {} ({})\n",
            t.keys,
            self.m("evictions_total"),
            bytes(self.m("evicted_bytes_total"))
        ));
        out.push_str(&format!(
            "memory     {} used of {} ({:.1} %) in {} segment(s)\n",
            bytes(t.used),
            bytes(t.capacity),
            percent(t.used, t.capacity),
            self.memory_segments()
        ));
        let disks = self.m("disk_segments");
        if disks == 0 {
            out.push_str("disk       no disk tier\n");
        } else {
            let (used, capacity) = (self.m("disk_used_bytes"), self.m("disk_capacity_bytes"));
            out.push_str(&format!(
                "disk       {} used of {} ({:.1} %) on {disks} disk(s), {} copies, {} key(s) on disk only\n",
                bytes(used),
                bytes(capacity),
                percent(used, capacity),
                self.m("disk_replicas"),
                self.m("disk_only_keys")
            ));
        }
    }

    fn clients(&self, out: &mut String) {
        out.push_str(&format!("clients    {}\n", self.health.totals.clients));
        if self.nodes.is_empty() {
            return;
        }
        out.push_str(&format!(
            "  {:<36}  {:<15}  {:>8}  {:>7}  {:>9}\n",
            "CLIENT", "HOST", "SEGMENTS", "OBJECTS", "LAST PING"
        ));
        for n in &self.nodes {
            out.push_str(&format!(
                "  {:<36}  {:<15}  {:>8}  {:>7}  {:>6} ms\n",
                n.client_id,
                n.host,
                n.segments.len(),
                n.objects,
                n.ms_since_ping
            ));
        }
    }

    fn segment_table(&self, out: &mut String) {
        out.push_str(&format!("segments   {}\n", self.segments.len()));
        if self.segments.is_empty() {
            return;
        }
        let width = self.segments.iter().map(|s| s.name.len()).max().unwrap_or(0).max(7);
        out.push_str(&format!(
            "  {:<width$}  {:<4}  {:>10}  {:>10}  {:>6}  CLIENT\n",
            "SEGMENT", "TIER", "CAPACITY", "USED", "FILL"
        ));
        for s in &self.segments {
            out.push_str(&format!(
                "  {:<width$}  {:<4}  {:>10}  {:>10}  {:>5.1}%  {}\n",
                s.name,
                s.tier,
                bytes(s.capacity),
                bytes(s.used),
                percent(s.used, s.capacity),
                s.client_id
            ));
        }
    }
}

/// `crescent status`.
pub fn status(a: StatusArgs) -> Result<()> {
    let target = a.cluster.target()?;
    let admin = target.admin()?;
    let snap = Snapshot::take(&admin)?;
    if a.cluster.json {
        print_json(&snap.json(&admin));
        return Ok(());
    }
    let mut out = String::new();
    snap.summary(&mut out, &admin);
    snap.clients(&mut out);
    snap.segment_table(&mut out);
    print!("{out}");
    Ok(())
}

/// What changed between two snapshots, per second.
struct Rates {
    puts: f64,
    gets: f64,
    errors: f64,
    evictions: f64,
    evicted_bytes: f64,
}

impl Rates {
    fn between(before: &Snapshot, now: &Snapshot) -> Rates {
        let secs = now.at.duration_since(before.at).as_secs_f64().max(1e-3);
        let rate = |name: &str| (now.m(name).saturating_sub(before.m(name))) as f64 / secs;
        Rates {
            puts: rate("puts_total"),
            gets: rate("gets_total"),
            errors: rate("errors_total"),
            evictions: rate("evictions_total"),
            evicted_bytes: rate("evicted_bytes_total"),
        }
    }
}

/// `crescent top`.
pub fn top(a: TopArgs) -> Result<()> {
    let target = a.cluster.target()?;
    let admin = target.admin()?;
    let screen = std::io::stdout().is_terminal() && !a.cluster.json;
    let mut before = Snapshot::take(&admin)?;
    let mut printed = 0u64;
    let mut stdout = std::io::stdout().lock();
    while a.count.is_none_or(|n| printed < n) {
        std::thread::sleep(a.interval.saturating_sub(before.at.elapsed()));
        let now = Snapshot::take(&admin)?;
        let r = Rates::between(&before, &now);
        let t = now.health.totals;
        let (disk_used, disk_capacity) = (now.m("disk_used_bytes"), now.m("disk_capacity_bytes"));
        if a.cluster.json {
            let line = json!({
                "unix_ms": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
                "keys": t.keys, "clients": t.clients, "segments": t.segments,
                "used": t.used, "capacity": t.capacity, "disk_used": disk_used, "disk_capacity": disk_capacity,
                "puts_per_s": r.puts, "gets_per_s": r.gets, "errors_per_s": r.errors,
                "evictions_per_s": r.evictions, "evicted_bytes_per_s": r.evicted_bytes,
            });
            writeln!(stdout, "{line}")?;
        } else if screen {
            let mut out = String::from("\x1b[H\x1b[2J");
            now.summary(&mut out, &admin);
            out.push_str(&format!(
                "rates      {:.0} put/s  {:.0} get/s  {:.0} err/s  {:.0} evict/s ({}/s)\n",
                r.puts,
                r.gets,
                r.errors,
                r.evictions,
                bytes(r.evicted_bytes as u64)
            ));
            now.clients(&mut out);
            now.segment_table(&mut out);
            out.push_str(&format!("\nevery {:?}; Ctrl-C quits\n", a.interval));
            write!(stdout, "{out}")?;
        } else {
            writeln!(
                stdout,
                "{} keys={} clients={} used={} capacity={} fill={:.1}% disk_used={} put/s={:.1} get/s={:.1} err/s={:.1} evict/s={:.1}",
                clock(),
                t.keys,
                t.clients,
                t.used,
                t.capacity,
                percent(t.used, t.capacity),
                disk_used,
                r.puts,
                r.gets,
                r.errors,
                r.evictions
            )?;
        }
        stdout.flush()?;
        printed += 1;
        before = now;
    }
    Ok(())
}

/// The time of day (UTC), `HH:MM:SS`.
fn clock() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{:02}:{:02}:{:02}", secs / 3600 % 24, secs / 60 % 60, secs % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_in_seconds_or_milliseconds() {
        assert_eq!(parse_interval("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_interval("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_interval("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("soon").is_err());
    }
}
