//! `crescent ls`, `crescent stat` (the admin port's answers) and `crescent rm` (a call of the
//! master's gRPC port, through a client that contributes no memory).

use anyhow::Result;
use clap::{ArgGroup, Args};
use crescent_store::StoreApi;
use serde::Deserialize;
use serde_json::json;

use super::{bytes, print_json, CliError, ClusterArgs};

#[derive(Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Only the keys that start with PREFIX (with --regex: that match it).
    pub pattern: Option<String>,
    /// PATTERN is a regular expression (Rust's regex syntax, searched anywhere in the key).
    #[arg(long, requires = "pattern")]
    pub regex: bool,
    /// Each key's size and where its replicas are.
    #[arg(long, short = 'l')]
    pub long: bool,
}

#[derive(Args)]
pub struct StatArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    pub key: String,
}

#[derive(Args)]
#[command(group(ArgGroup::new("what").required(true).args(["key", "regex"])))]
pub struct RmArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The key to remove.
    pub key: Option<String>,
    /// Remove every key matching PATTERN instead (those under a read lease stay).
    #[arg(long, value_name = "PATTERN")]
    pub regex: Option<String>,
    /// Remove the key even while a read lease protects it (a get in flight fails).
    #[arg(long)]
    pub force: bool,
}

/// `crescent ls`.
pub fn ls(a: LsArgs) -> Result<()> {
    let target = a.cluster.target()?;
    let matches: Box<dyn Fn(&str) -> bool> = match (&a.pattern, a.regex) {
        (None, _) => Box::new(|_| true),
        (Some(p), false) => {
            let p = p.clone();
            Box::new(move |k| k.starts_with(&p))
        }
        (Some(p), true) => {
            let re = regex::Regex::new(p).map_err(|e| CliError::Usage(format!("--regex {p:?}: {e}")))?;
            Box::new(move |k| re.is_match(k))
        }
    };
    let admin = target.admin()?;
    admin.leader_health()?;
    let all = admin.get_text("/get_all_keys")?;
    let mut keys: Vec<(&str, &str)> =
        all.lines().filter_map(|scoped| Some((scoped, target.unscoped(scoped)?))).filter(|(_, k)| matches(k)).collect();
    keys.sort_by(|a, b| a.1.cmp(b.1));
    if !a.long {
        if a.cluster.json {
            print_json(&json!(keys.iter().map(|k| k.1).collect::<Vec<_>>()));
        } else {
            for (_, k) in &keys {
                println!("{k}");
            }
        }
        return Ok(());
    }
    #[derive(Deserialize)]
    struct Location {
        segment: String,
        tier: String,
    }
    #[derive(Deserialize)]
    struct Item {
        exists: bool,
        size: u64,
        locations: Vec<Location>,
    }
    #[derive(Deserialize)]
    struct Answer {
        items: Vec<Item>,
    }
    let answer = admin.post_json("/query", &json!({"keys": keys.iter().map(|k| k.0).collect::<Vec<_>>()}))?;
    let answer: Answer = serde_json::from_value(answer).map_err(|e| CliError::BadAnswer {
        url: admin.url().to_string(),
        path: "/query".into(),
        what: format!("JSON this tool cannot read: {e}"),
    })?;
    let rows: Vec<_> = keys.iter().zip(&answer.items).filter(|(_, item)| item.exists).collect();
    if a.cluster.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|((_, key), item)| {
                json!({"key": key, "size": item.size,
                    "replicas": item.locations.iter().map(|l| json!({"segment": l.segment, "tier": l.tier})).collect::<Vec<_>>()})
            })
            .collect();
        print_json(&json!(rows));
        return Ok(());
    }
    for ((_, key), item) in rows {
        let tiers: Vec<&str> = item.locations.iter().map(|l| l.tier.as_str()).collect();
        println!("{:>12}  {:<12}  {key}", item.size, tiers.join(","));
    }
    Ok(())
}

#[derive(Deserialize)]
struct Replica {
    segment: String,
    host: String,
    tier: String,
    status: String,
    size: u64,
}

#[derive(Deserialize)]
struct QueryKey {
    exists: bool,
    size: u64,
    version: u64,
    lease_remaining_ms: u64,
    hard_pinned: bool,
    replicas: Vec<Replica>,
}

/// `crescent stat KEY`.
pub fn stat(a: StatArgs) -> Result<()> {
    let target = a.cluster.target()?;
    let admin = target.admin()?;
    admin.leader_health()?;
    let (status, body) = admin.get_raw("/query_key", &[("key", &target.scoped(&a.key))])?;
    let bad = |what: String| CliError::BadAnswer { url: admin.url().to_string(), path: "/query_key".into(), what };
    let q: QueryKey = serde_json::from_str(&body).map_err(|e| bad(format!("JSON this tool cannot read: {e}")))?;
    if status == 404 || !q.exists {
        return Err(CliError::NotFound { key: a.key }.into());
    }
    let mut tiers: Vec<&str> = q.replicas.iter().map(|r| r.tier.as_str()).collect();
    tiers.sort_unstable();
    tiers.dedup();
    if a.cluster.json {
        print_json(&json!({
            "key": a.key, "size": q.size, "version": q.version, "lease_remaining_ms": q.lease_remaining_ms,
            "hard_pinned": q.hard_pinned, "tiers": tiers,
            "replicas": q.replicas.iter().map(|r| json!({
                "segment": r.segment, "host": r.host, "tier": r.tier, "status": r.status, "size": r.size,
            })).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    println!("key        {}", a.key);
    println!("size       {} ({})", q.size, bytes(q.size));
    println!("version    {}", q.version);
    match q.lease_remaining_ms {
        0 => println!("lease      none (removable, evictable)"),
        ms => println!("lease      read lease for {ms} ms more (not removed nor evicted until then)"),
    }
    println!("pinned     {}", if q.hard_pinned { "yes (never evicted)" } else { "no" });
    println!("tiers      {}", tiers.join(", "));
    println!("replicas   {}", q.replicas.len());
    let width = q.replicas.iter().map(|r| r.segment.len()).max().unwrap_or(0).max(7);
    println!("  {:<width$}  {:<4}  {:<10}  HOST", "SEGMENT", "TIER", "STATUS");
    for r in &q.replicas {
        println!("  {:<width$}  {:<4}  {:<10}  {}", r.segment, r.tier, r.status, r.host);
    }
    Ok(())
}

/// `crescent rm KEY` or `crescent rm --regex PATTERN`.
pub fn rm(a: RmArgs) -> Result<()> {
    let target = a.cluster.target()?;
    let client = super::transfer::consumer(&target)?;
    let result = match (&a.key, &a.regex) {
        (Some(key), _) => client.remove_with(key, a.force).map(|()| {
            if a.cluster.json {
                print_json(&json!({"removed": [key]}));
            } else {
                println!("removed {key}");
            }
        }),
        (None, Some(pattern)) => client.remove_by_regex(pattern).map(|n| {
            if a.cluster.json {
                print_json(&json!({"removed_count": n, "regex": pattern}));
            } else {
                println!("removed {n} key(s) matching {pattern:?}");
            }
        }),
        (None, None) => unreachable!("clap requires KEY or --regex"),
    };
    let _ = client.close();
    Ok(result?)
}
