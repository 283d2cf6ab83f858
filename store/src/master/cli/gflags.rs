//! gflags' spellings and config files: `-flag`, `--noflag`, `--flagfile`, and
//! `--config_path` files (JSON or YAML of flag names) turned into the flags clap parses.

use std::path::Path;

use clap::{Arg, ArgAction, Command};

use super::{command, invalid, CliError};
use crate::master::config::MasterConfig;

/// Upstream's config-file keys that differ from the flag of the same setting.
const CONFIG_KEY_ALIASES: &[(&str, &str)] = &[("client_live_ttl_sec", "client_ttl")];

/// Every long flag name the parser knows, with whether it is a boolean (for `-flag` and
/// `--noflag`).
pub(crate) fn long_flags(cmd: &Command) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for a in cmd.get_arguments() {
        let is_bool = a.get_num_args().is_some_and(|n| n.min_values() == 0);
        for name in a.get_long_and_visible_aliases().into_iter().flatten() {
            out.push((name.to_string(), is_bool));
        }
    }
    out.push(("help".into(), false));
    out.push(("version".into(), false));
    out
}

/// gflags spellings clap does not have, rewritten: `-flag[=v]` (one dash) as `--flag[=v]`,
/// `--noflag` (a boolean) as `--flag=false`, and `--flagfile=F` (one flag per line, `#`
/// comments) expanded in place.
pub(crate) fn normalize(args: Vec<String>, known: &[(String, bool)], depth: usize) -> Result<Vec<String>, CliError> {
    let is_known = |n: &str| known.iter().any(|(k, _)| k == n);
    let is_bool = |n: &str| known.iter().any(|(k, b)| k == n && *b);
    let mut out = Vec::with_capacity(args.len());
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        if arg == "--" {
            out.push(arg);
            out.extend(it.by_ref());
            break;
        }
        let long = match arg.strip_prefix("--") {
            Some(rest) => Some(rest.to_string()),
            // One dash and a name (not `-h`, not a negative number): gflags' long flag.
            None => arg
                .strip_prefix('-')
                .filter(|r| r.len() > 1 && r.starts_with(|c: char| c.is_ascii_alphabetic()))
                .map(str::to_string),
        };
        let Some(long) = long else {
            out.push(arg);
            continue;
        };
        let (name, value) = match long.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (long.clone(), None),
        };
        if name == "flagfile" {
            let path = match value {
                Some(v) => v,
                None => it.next().ok_or_else(|| invalid("--flagfile needs a file"))?,
            };
            if depth > 8 {
                return Err(invalid(format!("--flagfile={path}: flag files nested too deep")));
            }
            let text = std::fs::read_to_string(&path).map_err(|e| invalid(format!("--flagfile={path}: {e}")))?;
            let lines: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_string)
                .collect();
            out.extend(normalize(lines, known, depth + 1)?);
            continue;
        }
        if value.is_none() && !is_known(&name) {
            if let Some(base) = name.strip_prefix("no").filter(|b| is_bool(b)) {
                out.push(format!("--{base}=false"));
                continue;
            }
        }
        out.push(format!("--{long}"));
    }
    Ok(out)
}

/// Upstream's JSON master config as flags (placed before the command line, which wins).
pub(super) fn config_path_args(path: &Path, known: &[(String, bool)]) -> Result<Vec<String>, CliError> {
    let shown = path.display().to_string();
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default().to_ascii_lowercase();
    if ext == "yaml" || ext == "yml" {
        return Err(invalid(format!("--config_path={shown}: Crescent reads JSON master configs only")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| invalid(format!("--config_path={shown}: {e}")))?;
    config_path_flags(&shown, &text, known)
}

/// The flags an upstream JSON master config (`text`, read from `shown`) stands for.
pub(super) fn config_path_flags(shown: &str, text: &str, known: &[(String, bool)]) -> Result<Vec<String>, CliError> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| invalid(format!("--config_path={shown}: {e}")))?;
    let obj = json.as_object().ok_or_else(|| invalid(format!("--config_path={shown}: not a JSON object")))?;
    let mut out = Vec::new();
    for (key, value) in obj {
        let flag = CONFIG_KEY_ALIASES.iter().find(|(k, _)| k == key).map(|(_, f)| *f).unwrap_or(key);
        if matches!(flag, "config" | "config_path" | "port" | "max_threads") || !known.iter().any(|(k, _)| k == flag) {
            return Err(invalid(format!("--config_path={shown}: unknown key {key:?}")));
        }
        let text = match value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Bool(b) => b.to_string(),
            serde_json::Value::Number(n) => n.to_string(),
            other => return Err(invalid(format!("--config_path={shown}: {key} is {other}, not a value"))),
        };
        out.push(format!("--{flag}={text}"));
    }
    Ok(out)
}

/// Crescent's JSON master config (`--config`), read from `shown`.
pub(super) fn config_file(shown: &str, text: &str) -> Result<MasterConfig, CliError> {
    serde_json::from_str::<MasterConfig>(text).map_err(|e| invalid(format!("{shown}: {e}")))
}

/// The two formats of a master config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigFormat {
    /// Crescent's JSON (`--config`): [`MasterConfig`]'s fields.
    Crescent,
    /// `mooncake_master`'s JSON (`--config_path`): keys named as its flags.
    Mooncake,
}

/// Every long flag name with a command of that one argument (the value check of [`parse`]
/// without matching a whole command line), and [`long_flags`]; built once.
#[allow(clippy::type_complexity)]
pub(super) fn single_flag_commands() -> &'static (std::collections::HashMap<String, Command>, Vec<(String, bool)>) {
    static BUILT: std::sync::OnceLock<(std::collections::HashMap<String, Command>, Vec<(String, bool)>)> =
        std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let full = command("crescent-master");
        let mut map = std::collections::HashMap::new();
        let help = |a: &Arg| {
            matches!(a.get_action(), ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version)
        };
        for a in full.get_arguments().filter(|a| !help(a)) {
            for name in a.get_long_and_visible_aliases().into_iter().flatten() {
                let mut one = Command::new("check")
                    .no_binary_name(true)
                    .disable_help_flag(true)
                    .disable_version_flag(true)
                    .arg(a.clone());
                one.build();
                map.insert(name.to_string(), one);
            }
        }
        (map, long_flags(&full))
    })
}

/// Reads a master config file's text as [`parse`](super::parse) reads the file, without a command line
/// around it: every key known and every value of the type its flag takes (upstream's format),
/// or a configuration that passes [`MasterConfig::validate`] (Crescent's). Checks a file before
/// a deployment uses it (and is what the `master_config` fuzz target drives: the file formats
/// without the command-line matching around them).
pub fn check_config_file(format: ConfigFormat, text: &str) -> Result<(), CliError> {
    match format {
        ConfigFormat::Crescent => config_file("the config file", text)?.validate().map_err(|e| invalid(e.to_string())),
        ConfigFormat::Mooncake => {
            let (commands, known) = single_flag_commands();
            for flag in &config_path_flags("the config file", text, known)? {
                let name = flag.trim_start_matches("--").split_once('=').map_or(flag.as_str(), |(n, _)| n);
                let cmd = commands.get(name).ok_or_else(|| invalid(format!("--config_path: unknown key {name:?}")))?;
                cmd.clone().try_get_matches_from([flag]).map_err(|e| invalid(format!("--config_path: {e}")))?;
            }
            Ok(())
        }
    }
}
