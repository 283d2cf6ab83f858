//! The benchmark's tables: each phase's rates and latencies, and the sizes per object.

use super::*;

pub(super) fn print_tables(phases: &[PhaseRow], sizes: &[SizeRow]) {
    let p = |h: &Histogram<u64>, q: f64| if h.is_empty() { "-".into() } else { report::fmt_us(h.value_at_quantile(q)) };
    println!();
    println!(
        "| objects | phase | seconds | metadata ops/s | RPCs/s | p50 | p99 | p999 | max | misses | evicted | failed | target |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in phases {
        let rpcs = r.tally.all.len();
        println!(
            "| {} | {} | {:.1} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.objects,
            r.phase,
            r.secs,
            r.tally.ops as f64 / r.secs.max(1e-9),
            rpcs as f64 / r.secs.max(1e-9),
            p(&r.tally.all, 0.5),
            p(&r.tally.all, 0.99),
            p(&r.tally.all, 0.999),
            if r.tally.all.is_empty() { "-".into() } else { report::fmt_us(r.tally.all.max()) },
            r.tally.misses,
            r.evicted.map_or("-".into(), |e| e.to_string()),
            r.tally.failed,
            r.target,
        );
    }
    println!();
    println!("| objects | phase | RPC | calls | p50 | p99 | p999 | max |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in phases {
        for (rpc, h) in RPCS.iter().zip(&r.tally.hist) {
            if h.is_empty() {
                continue;
            }
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.objects,
                r.phase,
                rpc.name(),
                h.len(),
                p(h, 0.5),
                p(h, 0.99),
                p(h, 0.999),
                report::fmt_us(h.max())
            );
        }
    }
    println!();
    println!(
        "| objects | master RSS mounted | RSS at the watermark | bytes per object | eviction round (crossing put to \
         last drop of used bytes) median | range | objects per round | per object evicted (round's wall time) | \
         evictor CPU per evicted object | PutStart that crossed the watermark median | ordinary PutStart median |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let med = |v: &[u64]| -> Option<u64> {
        let mut v = v.to_vec();
        v.sort_unstable();
        v.get(v.len() / 2).copied()
    };
    // What one evicted object costs: a round frees a share of the capacity, so its objects (and
    // its time) grow with the store even when each one costs the same.
    let per_evicted = |s: &SizeRow| -> Option<f64> {
        let (us, n) = (med(&s.rounds_us)?, med(&s.evicted_per_round)?);
        Some(us as f64 / n.max(1) as f64)
    };
    // The evictor's CPU time over all the rounds, per object they evicted.
    let cpu_per_evicted = |s: &SizeRow| -> Option<f64> {
        let evicted: u64 = s.evicted_per_round.iter().sum();
        (evicted > 0).then_some(s.evictor_cpu?.as_secs_f64() * 1e6 / evicted as f64)
    };
    for s in sizes {
        let per_object = match (s.rss_mounted, s.rss_filled) {
            (Some(a), Some(b)) => {
                format!("{:.0} B (target <= 256)", b.saturating_sub(a) as f64 / s.filled.max(1) as f64)
            }
            _ => "- (no pid)".into(),
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.objects,
            s.rss_mounted.map_or("-".into(), report::fmt_bytes),
            s.rss_filled.map_or("-".into(), report::fmt_bytes),
            per_object,
            med(&s.rounds_us).map_or("-".into(), report::fmt_us),
            match (s.rounds_us.iter().min(), s.rounds_us.iter().max()) {
                (Some(a), Some(b)) => format!("{}-{}", report::fmt_us(*a), report::fmt_us(*b)),
                _ => "-".into(),
            },
            med(&s.evicted_per_round).map_or("-".into(), |v| v.to_string()),
            per_evicted(s).map_or("-".into(), |us| format!("{us:.2} us")),
            cpu_per_evicted(s).map_or("-".into(), |us| format!("{us:.2} us")),
            med(&s.crossing_put_us).map_or("-".into(), report::fmt_us),
            med(&s.plain_put_us).map_or("-".into(), report::fmt_us),
        );
    }
    if let (Some(first), Some(last)) = (sizes.first(), sizes.last()) {
        if sizes.len() > 1 {
            if let (Some(a), Some(b)) = (med(&first.rounds_us), med(&last.rounds_us)) {
                println!();
                println!(
                    "eviction round at {} objects: {:.1}x the one at {} objects (a round takes {:.0} % of the \
                     objects: their number grows with the store)",
                    last.objects,
                    b as f64 / a.max(1) as f64,
                    first.objects,
                    100.0 * med(&last.evicted_per_round).unwrap_or(0) as f64 / last.filled.max(1) as f64
                );
            }
            // The evictor's CPU where it was read (a paced round's wall time is mostly pauses).
            let (cost, what) = match (cpu_per_evicted(first), cpu_per_evicted(last)) {
                (Some(a), Some(b)) => (Some((a, b)), "the evictor's CPU"),
                _ => (per_evicted(first).zip(per_evicted(last)), "the round's wall time"),
            };
            if let Some((a, b)) = cost {
                println!(
                    "per object evicted at {} objects: {:.1}x the cost at {} objects, by {what} (target: independent \
                     of the store's size, about 1x)",
                    last.objects,
                    b / a.max(f64::MIN_POSITIVE),
                    first.objects
                );
            }
        }
    }
    println!();
}
