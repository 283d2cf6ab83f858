//! What the soak's coordinator learns from its workers' lines: calls, errors by code and
//! latencies per phase, the torn / stale reads the workers saw, and what every key is known to
//! hold (the model the final read-back checks); then the report, the RSS table and its plot.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde_json::Value;

use crate::report::fmt_us;

/// What a key is known to hold: a generation, absent, or in doubt (a call on it failed or
/// never ended, e.g. its process was killed).
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Known {
    Absent,
    Present(u32),
    Doubt,
}

impl Known {
    fn from_wire(v: i64) -> Known {
        match v {
            0 => Known::Absent,
            g if g > 0 && g <= u32::MAX as i64 => Known::Present(g as u32),
            _ => Known::Doubt,
        }
    }
}

pub struct PhaseStats {
    pub calls: u64,
    /// Failed calls, and failed keys of batch calls, by code.
    pub errors: BTreeMap<String, u64>,
    pub hist: Histogram<u64>,
    /// Calls by operation.
    pub ops: BTreeMap<String, u64>,
}

impl PhaseStats {
    fn new() -> PhaseStats {
        PhaseStats {
            calls: 0,
            errors: BTreeMap::new(),
            hist: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds"),
            ops: BTreeMap::new(),
        }
    }

    fn add(&mut self, other: &PhaseStats) {
        self.calls += other.calls;
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.ops {
            *self.ops.entry(k.clone()).or_default() += v;
        }
        let _ = self.hist.add(&other.hist);
    }

    fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

pub struct Tally {
    pub phase_names: Vec<&'static str>,
    /// The phase calls are counted under now.
    pub phase: usize,
    pub phases: Vec<PhaseStats>,
    pub model: HashMap<u64, Known>,
    pub torn: u64,
    pub stale: u64,
    pub missing: u64,
    /// Workers that answered `stop`.
    pub stopped: Vec<u64>,
    /// Lines that did not parse.
    pub garbled: u64,
}

impl Tally {
    pub fn new(phase_names: Vec<&'static str>) -> Tally {
        let phases = phase_names.iter().map(|_| PhaseStats::new()).collect();
        Tally {
            phase_names,
            phase: 0,
            phases,
            model: HashMap::new(),
            torn: 0,
            stale: 0,
            missing: 0,
            stopped: Vec::new(),
            garbled: 0,
        }
    }

    /// One line of worker `worker`.
    pub fn line(&mut self, worker: u64, line: &str) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            self.garbled += 1;
            return;
        };
        if let Some(gids) = v.get("b").and_then(Value::as_array) {
            for g in gids.iter().filter_map(Value::as_u64) {
                self.model.insert(g, Known::Doubt);
            }
            return;
        }
        if v.get("stopped").is_some() {
            self.stopped.push(worker);
            return;
        }
        let Some(op) = v.get("op").and_then(Value::as_str) else { return };
        let p = &mut self.phases[self.phase];
        p.calls += 1;
        *p.ops.entry(op.to_string()).or_default() += 1;
        let _ = p.hist.record(v["us"].as_u64().unwrap_or(0).max(1));
        for e in v["errs"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            *p.errors.entry(e.to_string()).or_default() += 1;
        }
        for s in v["set"].as_array().into_iter().flatten() {
            if let (Some(g), Some(state)) = (s[0].as_u64(), s[1].as_i64()) {
                self.model.insert(g, Known::from_wire(state));
            }
        }
        self.torn += v["torn"].as_u64().unwrap_or(0);
        self.stale += v["stale"].as_u64().unwrap_or(0);
        self.missing += v["missing"].as_u64().unwrap_or(0);
    }

    /// The per-phase table (markdown), totals last.
    pub fn table(&self) -> String {
        let mut s = String::from(
            "| phase | calls | errors | errors by code | p50 | p99 | max |\n|---|---:|---:|---|---:|---:|---:|\n",
        );
        let mut total = PhaseStats::new();
        let row = |s: &mut String, name: &str, p: &PhaseStats| {
            let codes: Vec<String> = p.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let q = |q: f64| if p.calls == 0 { "-".into() } else { fmt_us(p.hist.value_at_quantile(q)) };
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {} | {} | {} | {} |",
                p.calls,
                p.error_count(),
                if codes.is_empty() { "-".into() } else { codes.join(", ") },
                q(0.5),
                q(0.99),
                q(1.0)
            );
        };
        for (name, p) in self.phase_names.iter().zip(&self.phases) {
            row(&mut s, name, p);
            total.add(p);
        }
        row(&mut s, "**all**", &total);
        let ops: Vec<String> = total.ops.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(s, "\ncalls by operation: {}", ops.join(", "));
        s
    }
}

/// One RSS sample of one process.
#[derive(Clone)]
pub struct Sample {
    pub t: f64,
    pub name: String,
    pub pid: u32,
    pub rss_kib: u64,
}

/// `VmRSS` and `RssShmem` of `pid` in KiB (`None`: it is gone).
pub fn rss_of(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("RssShmem:").unwrap_or(0)))
}

/// The RSS of each process that lived through the whole measured window: mean of the samples
/// in `[base, base + window]` and in the last `window` seconds; growth between them.
pub struct Growth {
    pub name: String,
    pub pid: u32,
    pub base_mib: f64,
    pub end_mib: f64,
    pub peak_mib: f64,
    pub pct: f64,
}

pub fn growth(samples: &[Sample], base: f64, end: f64, window: f64) -> Vec<Growth> {
    let mut by: BTreeMap<(String, u32), Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        by.entry((s.name.clone(), s.pid)).or_default().push(s);
    }
    let mean = |v: &[&Sample], from: f64, to: f64| {
        let w: Vec<f64> = v.iter().filter(|s| s.t >= from && s.t <= to).map(|s| s.rss_kib as f64 / 1024.0).collect();
        (!w.is_empty()).then(|| w.iter().sum::<f64>() / w.len() as f64)
    };
    let mut out = Vec::new();
    for ((name, pid), v) in by {
        let (first, last) = (v[0].t, v[v.len() - 1].t);
        if first > base || last < end - window {
            continue; // restarted during the run: not a whole-run process
        }
        let (Some(b), Some(e)) = (mean(&v, base, base + window), mean(&v, end - window, end)) else { continue };
        let peak = v.iter().map(|s| s.rss_kib as f64 / 1024.0).fold(0.0, f64::max);
        out.push(Growth { name, pid, base_mib: b, end_mib: e, peak_mib: peak, pct: (e / b - 1.0) * 100.0 });
    }
    out
}

/// An SVG line plot of every process's RSS over time (one colour per process name; a restarted
/// process is a new line of the same colour).
pub fn svg(samples: &[Sample], title: &str) -> String {
    let (w, h, left, right, top, bottom) = (900.0, 480.0, 60.0, 190.0, 40.0, 40.0);
    let t_max = samples.iter().map(|s| s.t).fold(1.0, f64::max) / 60.0;
    let y_max = samples.iter().map(|s| s.rss_kib as f64 / 1024.0).fold(1.0, f64::max) * 1.1;
    let x = |t: f64| left + (t / 60.0) / t_max * (w - left - right);
    let y = |mib: f64| top + (1.0 - mib / y_max) * (h - top - bottom);
    let palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"];
    let mut names: Vec<&str> = samples.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let mut lines: BTreeMap<(&str, u32), Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        lines.entry((s.name.as_str(), s.pid)).or_default().push(s);
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(o, r#"<text x="{left}" y="22" font-size="14">{title}</text>"#);
    for k in 0..=5 {
        let mib = y_max * k as f64 / 5.0;
        let _ = writeln!(
            o,
            r##"<line x1="{left}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{mib:.0}</text>"##,
            w - right,
            y(mib),
            y(mib),
            left - 6.0,
            y(mib) + 4.0
        );
    }
    for k in 0..=6 {
        let t = t_max * k as f64 / 6.0;
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{t:.0}</text>"#,
            x(t * 60.0),
            h - bottom + 16.0
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">minutes</text><text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle">RSS MiB</text>"#,
        (left + w - right) / 2.0,
        h - 6.0,
        h / 2.0,
        h / 2.0
    );
    for ((name, _), v) in &lines {
        let colour = palette[names.iter().position(|n| n == name).unwrap_or(0) % palette.len()];
        let points: Vec<String> =
            v.iter().map(|s| format!("{:.1},{:.1}", x(s.t), y(s.rss_kib as f64 / 1024.0))).collect();
        let _ = writeln!(
            o,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
            points.join(" ")
        );
    }
    for (k, name) in names.iter().enumerate() {
        let colour = palette[k % palette.len()];
        let ly = top + 16.0 * k as f64;
        let _ = writeln!(
            o,
            r#"<rect x="{:.1}" y="{:.1}" width="12" height="3" fill="{colour}"/><text x="{:.1}" y="{:.1}">{name}</text>"#,
            w - right + 12.0,
            ly - 4.0,
            w - right + 30.0,
            ly
        );
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_update_the_model_and_the_phase() {
        let mut t = Tally::new(vec!["steady", "blip"]);
        t.line(0, r#"{"b":[3]}"#);
        assert_eq!(t.model[&3], Known::Doubt);
        t.phase = 1;
        t.line(0, r#"{"op":"put","us":120,"errs":[],"set":[[3,7]],"torn":0,"stale":0,"missing":0}"#);
        t.line(0, r#"{"op":"get","us":80,"errs":["OBJECT_NOT_FOUND"],"set":[],"torn":1,"stale":0,"missing":0}"#);
        assert_eq!(t.model[&3], Known::Present(7));
        assert_eq!((t.phases[0].calls, t.phases[1].calls, t.torn), (0, 2, 1));
        assert_eq!(t.phases[1].errors["OBJECT_NOT_FOUND"], 1);
        t.line(0, r#"{"op":"remove_force","us":80,"errs":[],"set":[[3,0]]}"#);
        assert_eq!(t.model[&3], Known::Absent);
        t.line(0, "not json");
        assert_eq!(t.garbled, 1);
        assert!(t.table().contains("| blip | 3 | 1 |"));
    }

    #[test]
    fn growth_skips_restarted_processes() {
        let s = |t: f64, name: &str, pid: u32, mib: u64| Sample { t, name: name.into(), pid, rss_kib: mib * 1024 };
        let samples = vec![
            s(0.0, "a", 1, 100),
            s(10.0, "a", 1, 100),
            s(20.0, "a", 1, 110),
            s(15.0, "b", 2, 50),
            s(20.0, "b", 2, 50),
        ];
        let g = growth(&samples, 10.0, 20.0, 0.0);
        assert_eq!(g.len(), 1);
        assert!((g[0].pct - 10.0).abs() < 1e-9);
        assert!(svg(&samples, "t").contains("polyline"));
    }
}
