//! Grafana dashboards and the metric names their queries use: the checks that a dashboard
//! names only series the code exports (`tests/tests/master_compat.rs` for the master's,
//! `tests/tests/dashboards.rs` for every dashboard under `monitoring/grafana/`).

/// A file of the repository, by its path from the root.
pub fn repo_file(path: &str) -> String {
    let p = repo_path(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The path of a file of the repository, by its path from the root.
pub fn repo_path(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// Whether the Prometheus text `metrics` has a sample of series `name`.
pub fn exports(metrics: &str, name: &str) -> bool {
    metrics.lines().any(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{')))
}

const AGGREGATIONS: &[&str] = &["sum", "avg", "min", "max", "count", "topk", "bottomk", "and", "or", "unless"];

/// Every metric name a PromQL expression uses: identifiers not followed by `(` (functions),
/// not in `{...}` or `[...]`, not `by`/`sum`-like keywords, not numbers.
pub fn promql_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let (mut depth_brace, mut depth_bracket) = (0, 0);
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '{' => depth_brace += 1,
            '}' => depth_brace -= 1,
            '[' => depth_bracket += 1,
            ']' => depth_bracket -= 1,
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += 1;
                }
            }
            c if (c.is_ascii_alphabetic() || c == '_') && depth_brace == 0 && depth_bracket == 0 => {
                let start = i;
                while i + 1 < chars.len() && (chars[i + 1].is_ascii_alphanumeric() || chars[i + 1] == '_') {
                    i += 1;
                }
                let word: String = chars[start..=i].iter().collect();
                let next = chars[i + 1..].iter().find(|c| !c.is_whitespace());
                if ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&word.as_str()) {
                    // A label list follows: skip it.
                    while i < chars.len() && chars[i] != ')' {
                        i += 1;
                    }
                } else if next != Some(&'(') && !AGGREGATIONS.contains(&word.as_str()) {
                    names.push(word);
                }
            }
            _ => {}
        }
        i += 1;
    }
    names
}

pub fn dashboard_exprs(dashboard: &serde_json::Value, out: &mut Vec<String>) {
    match dashboard {
        serde_json::Value::Object(o) => {
            for (k, v) in o {
                match v {
                    serde_json::Value::String(e) if k == "expr" => out.push(e.clone()),
                    other => dashboard_exprs(other, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}
