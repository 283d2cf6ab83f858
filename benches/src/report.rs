//! Formatting of benchmark figures.

/// Bytes per second as decimal gigabytes per second (what `GB/s` means in every report).
pub fn gb_per_s(bytes: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        return 0.0;
    }
    bytes as f64 / secs / 1e9
}

/// A latency in microseconds, human-readable.
pub fn fmt_us(us: u64) -> String {
    if us >= 10_000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else if us >= 1000 {
        format!("{:.2} ms", us as f64 / 1000.0)
    } else {
        format!("{us} us")
    }
}

pub fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// The 1-, 5- and 15-minute load averages of the machine (`/proc/loadavg`).
pub fn loadavg() -> Option<[f64; 3]> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = s.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// Above this 1-minute load at the start, other programs are running and the figures are
/// likely to be disturbed.
pub const BUSY_LOAD: f64 = 0.5;

fn fmt_load(l: Option<[f64; 3]>) -> String {
    l.map_or("unknown".into(), |[a, b, c]| format!("{a:.2} {b:.2} {c:.2}"))
}

/// The load printed at a benchmark's start (with a warning on a busy machine) and end.
pub struct Load;

impl Load {
    pub fn start() -> Load {
        let l = loadavg();
        println!("load average at start: {} (1, 5, 15 min)", fmt_load(l));
        if let Some([one, ..]) = l.filter(|l| l[0] > BUSY_LOAD) {
            println!(
                "warning: 1-minute load {one:.2} > {BUSY_LOAD} at start: other programs are running; the figures \
                 measure a shared machine"
            );
        }
        Load
    }
    pub fn finish(&self) {
        println!("load average at end: {} (1, 5, 15 min)", fmt_load(loadavg()));
    }
}

/// The current time, `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> String {
    fmt_utc(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

/// Seconds since the Unix epoch as `YYYY-MM-DD HH:MM UTC`.
pub fn fmt_utc(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02} UTC", rem / 3600, rem % 3600 / 60)
}

/// The median of `v` (the mean of the two middle ones of an even count, as Python's
/// `statistics.median` in benches/pairs.py); 0 for none.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// What a ratio to its limit should be.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// At least this share of the limit (throughput).
    AtLeast(f64),
    /// At most this multiple of the limit (a cost, e.g. time).
    AtMost(f64),
}

impl Target {
    pub fn met(self, ratio: f64) -> bool {
        match self {
            Target::AtLeast(t) => ratio >= t,
            Target::AtMost(t) => ratio <= t,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::AtLeast(t) => write!(f, ">= {t:.2}"),
            Target::AtMost(t) => write!(f, "<= {t:.2}"),
        }
    }
}

/// A measurement and its limit, run alternately in pairs: each pair's ratio is taken within
/// the pair, so that a limit that drifts between pairs moves both sides of a ratio alike.
#[derive(Clone, Debug, Default)]
pub struct Pairs {
    pub ours: Vec<f64>,
    pub limit: Vec<f64>,
}

impl Pairs {
    pub fn push(&mut self, ours: f64, limit: f64) {
        self.ours.push(ours);
        self.limit.push(limit);
    }
    pub fn len(&self) -> usize {
        self.ours.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ours.is_empty()
    }
    pub fn ratios(&self) -> Vec<f64> {
        self.ours.iter().zip(&self.limit).map(|(o, l)| o / l.max(f64::MIN_POSITIVE)).collect()
    }
    /// Median of our figures, of the limit's, of the per-pair ratios, and the ratios' range.
    pub fn summary(&self) -> PairSummary {
        let r = self.ratios();
        PairSummary {
            ours: median(&self.ours),
            limit: median(&self.limit),
            ratio: median(&r),
            lo: r.iter().copied().fold(f64::INFINITY, f64::min),
            hi: r.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            pairs: r.len(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct PairSummary {
    pub ours: f64,
    pub limit: f64,
    pub ratio: f64,
    pub lo: f64,
    pub hi: f64,
    pub pairs: usize,
}

impl PairSummary {
    /// `ratio | range | target | met` cells of a markdown row.
    pub fn ratio_cells(&self, target: Target) -> String {
        format!(
            "{:.2} | {:.2}-{:.2} | {target} | {} |",
            self.ratio,
            self.lo,
            self.hi,
            if target.met(self.ratio) { "met" } else { "NOT met" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn formats() {
        assert_eq!(format!("{:.2}", gb_per_s(2_000_000_000, 1.0)), "2.00");
        assert_eq!(fmt_us(1500), "1.50 ms");
        assert_eq!(fmt_bytes(64 << 10), "64.00 KiB");
    }

    #[test]
    fn pairs_take_each_ratio_within_its_pair() {
        let mut p = Pairs::default();
        // The limit doubles between pairs; each pair's ratio is 0.9, 0.5 or 1.0.
        p.push(0.9, 1.0);
        p.push(1.0, 2.0);
        p.push(4.0, 4.0);
        let s = p.summary();
        assert_eq!((s.ours, s.limit, s.ratio, s.lo, s.hi, s.pairs), (1.0, 2.0, 0.9, 0.5, 1.0, 3));
        assert_eq!(s.ratio_cells(Target::AtLeast(0.9)), "0.90 | 0.50-1.00 | >= 0.90 | met |");
        assert_eq!(s.ratio_cells(Target::AtMost(0.85)), "0.90 | 0.50-1.00 | <= 0.85 | NOT met |");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(fmt_utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(fmt_utc(951_782_400 + 3600 + 120), "2000-02-29 01:02 UTC");
        assert_eq!(fmt_utc(1_798_761_599), "2026-12-31 23:59 UTC");
    }
}
