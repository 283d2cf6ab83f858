//! The few facts `status` and `top` read from the master's `/metrics` (Prometheus text).

use std::collections::HashMap;

/// Each series name's value, summed over its labels (`crescent_master_errors_total` is the
/// errors of every kind).
#[derive(Debug, Clone, Default)]
pub struct Samples(HashMap<String, f64>);

impl Samples {
    /// Reads the text format: `name{labels} value [timestamp]` lines; comments and lines it
    /// cannot read are skipped.
    pub fn parse(text: &str) -> Samples {
        let mut sums: HashMap<String, f64> = HashMap::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, rest) = match line.find(['{', ' ']) {
                Some(i) => line.split_at(i),
                None => continue,
            };
            // The value follows the labels (whose values may hold spaces).
            let rest = match rest.strip_prefix('{') {
                Some(labels) => match labels.rfind('}') {
                    Some(end) => &labels[end + 1..],
                    None => continue,
                },
                None => rest,
            };
            if let Some(v) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) {
                *sums.entry(name.to_string()).or_default() += v;
            }
        }
        Samples(sums)
    }

    /// The value of `name` (0 when the master does not export it).
    pub fn get(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or(0.0)
    }

    /// [`Self::get`] as a count.
    pub fn count(&self, name: &str) -> u64 {
        self.get(name).max(0.0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_summed_over_their_labels() {
        let s = Samples::parse(
            "# HELP crescent_master_errors_total Errors\n# TYPE crescent_master_errors_total counter\n\
             crescent_master_errors_total{kind=\"not found\"} 3\ncrescent_master_errors_total{kind=\"b}\"} 2\n\
             crescent_master_keys 12\nbroken line\ncrescent_master_term 4 1700000000\n",
        );
        assert_eq!(s.get("crescent_master_errors_total"), 5.0);
        assert_eq!(s.count("crescent_master_keys"), 12);
        assert_eq!(s.count("crescent_master_term"), 4);
        assert_eq!(s.get("absent"), 0.0);
    }
}
