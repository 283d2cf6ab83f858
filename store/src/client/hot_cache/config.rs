//! The hot cache's settings: `LOCAL_HOT_CACHE_SIZE` / `LOCAL_HOT_BLOCK_SIZE` (or their
//! `MC_STORE_` forms), the config file's `local_hot_cache_size` / `local_hot_block_size`, or a
//! builder; beside them the admission policy (`LOCAL_HOT_CACHE_ADMISSION`,
//! `local_hot_cache_admission`) and how misses fill the cache (`LOCAL_HOT_CACHE_FILL`,
//! `local_hot_cache_fill`: [`FillMode`]). Sizes take the grammar of every size knob ([`crescent_engine::parse_size`]:
//! `419430400`, `400M`, `1G`, ...). Unlike the client's other settings, an unusable size is not
//! an error: it disables the cache with one warning that names the value (an unset size
//! disables it silently).

use crescent_engine::parse_size;

use crate::error::{Result, StoreError};

/// Default block size: 16 MiB.
pub const DEFAULT_BLOCK_SIZE: u64 = 16 << 20;

/// Most blocks one cache may have (a guard against absurd settings such as 1-byte blocks,
/// whose bookkeeping alone would need gigabytes).
pub const MAX_BLOCKS: u64 = 1 << 20;

/// Environment variables, first spelling first: when both are set, the first wins.
pub const CACHE_SIZE_VARS: [&str; 2] = ["LOCAL_HOT_CACHE_SIZE", "MC_STORE_LOCAL_HOT_CACHE_SIZE"];
/// The block size's environment variables, first spelling first (as [`CACHE_SIZE_VARS`]).
pub const BLOCK_SIZE_VARS: [&str; 2] = ["LOCAL_HOT_BLOCK_SIZE", "MC_STORE_LOCAL_HOT_BLOCK_SIZE"];
/// The environment variable of the admission policy (`always`, `second_access`).
pub const ADMISSION_VAR: &str = "LOCAL_HOT_CACHE_ADMISSION";
/// The environment variables of the fill mode (`auto`, `inline`, `deferred`), first spelling first.
pub const FILL_VARS: [&str; 2] = ["LOCAL_HOT_CACHE_FILL", "MC_STORE_LOCAL_HOT_CACHE_FILL"];

/// A size as it was written, and where (for the warning that names it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeSetting {
    /// Where it was written: a variable's or config key's name, or the builder's setting.
    pub source: String,
    /// The text as written (not yet parsed).
    pub value: String,
}

impl SizeSetting {
    /// The size `value`, written at `source`.
    pub fn new(source: impl Into<String>, value: impl Into<String>) -> Self {
        SizeSetting { source: source.into(), value: value.into() }
    }
}

/// Which objects a miss may bring into the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Admission {
    /// Every remote object read (default).
    #[default]
    Always,
    /// Objects read a second time while still remembered (a bounded list of recently missed
    /// keys): one-off reads do not push hot keys out.
    SecondAccess,
}

impl std::str::FromStr for Admission {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "always" | "" => Ok(Admission::Always),
            "second_access" => Ok(Admission::SecondAccess),
            _ => {
                Err(StoreError::Config(format!("hot cache admission {s:?}: expected \"always\" or \"second_access\"")))
            }
        }
    }
}

/// How a miss fills the cache (see the module doc of [`super`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FillMode {
    /// Each miss inline or deferred, by how the link compares with a memory copy
    /// (`super::fill_choice`): inline while the copy adds at most a tenth to a miss's read
    /// (a link much slower than the copy, such as the reference's 2.5 Gbit/s one), deferred
    /// where it would add more (a fast link, RDMA). The default.
    #[default]
    Auto,
    /// The get itself fills the cache from the bytes it brought: one more copy of the value
    /// inside the call (a byte get lands in the cache's blocks and copies out, a get into
    /// the caller's memory copies from there into the blocks).
    Inline,
    /// The get does what it does without the cache; a background filler reads the replica
    /// again into the cache's blocks when this client's own reads leave the link idle.
    Deferred,
}

impl std::str::FromStr for FillMode {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(FillMode::Auto),
            "inline" => Ok(FillMode::Inline),
            "deferred" => Ok(FillMode::Deferred),
            _ => {
                Err(StoreError::Config(format!("hot cache fill {s:?}: expected \"auto\", \"inline\" or \"deferred\"")))
            }
        }
    }
}

/// The hot cache's settings before they are checked (see [`HotCacheSettings::resolve`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HotCacheSettings {
    /// Bytes of the whole cache; unset: no cache.
    pub cache_size: Option<SizeSetting>,
    /// Bytes of one block; unset: `DEFAULT_BLOCK_SIZE`.
    pub block_size: Option<SizeSetting>,
    /// Which misses may fill the cache.
    pub admission: Admission,
    /// How a miss fills the cache.
    pub fill: FillMode,
}

/// What the settings amount to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// No cache; `warning` (one line naming the unusable value) unless the size was unset.
    Disabled {
        /// The line to log, naming the setting and why it is unusable.
        warning: Option<String>,
    },
    /// A cache of this layout.
    Enabled(Layout),
}

/// `blocks` blocks of `block_size` bytes, allocated and registered once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Number of blocks: the cache size over the block size, rounded down, at least 1 and
    /// at most `MAX_BLOCKS`.
    pub blocks: u32,
    /// Bytes of one block.
    pub block_size: u64,
    /// Which misses may fill the cache.
    pub admission: Admission,
    /// How a miss fills the cache.
    pub fill: FillMode,
}

/// A size in the grammar of every size knob ([`crescent_engine::parse_size`]: `4096`, `64K`,
/// `16MB`, `1G`, ...), or why it cannot be used. A negative number, which that grammar does
/// not know, is told apart from text that is no size at all.
fn parse_bytes(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    if let Some(rest) = t.strip_prefix('-') {
        return Err(match parse_size(rest) {
            Ok(_) => "is negative".into(),
            Err(_) if !rest.is_empty() && rest.bytes().all(|b| b == b'0') => "is zero".into(),
            Err(e) => e,
        });
    }
    parse_size(t)
}

impl HotCacheSettings {
    /// A cache of `cache_size` bytes in blocks of `block_size` (default 16 MiB).
    pub fn with_sizes(cache_size: u64, block_size: Option<u64>) -> Self {
        HotCacheSettings {
            cache_size: Some(SizeSetting::new("hot cache size", cache_size.to_string())),
            block_size: block_size.map(|b| SizeSetting::new("hot cache block size", b.to_string())),
            admission: Admission::Always,
            fill: FillMode::default(),
        }
    }

    /// From the process environment.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// From variables looked up by `get` (the environment, or a test's map).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let first = |names: [&str; 2]| names.iter().find_map(|n| get(n).map(|v| SizeSetting::new(*n, v)));
        Ok(HotCacheSettings {
            cache_size: first(CACHE_SIZE_VARS),
            block_size: first(BLOCK_SIZE_VARS),
            admission: match get(ADMISSION_VAR) {
                Some(v) => v.parse().map_err(|e| StoreError::Config(format!("{ADMISSION_VAR}: {e}")))?,
                None => Admission::Always,
            },
            fill: match FILL_VARS.iter().find_map(|n| get(n).map(|v| (*n, v))) {
                Some((name, v)) => v.parse().map_err(|e| StoreError::Config(format!("{name}: {e}")))?,
                None => FillMode::default(),
            },
        })
    }

    /// Checks the sizes: every disabled outcome but "unset" carries exactly one warning.
    pub fn resolve(&self) -> Resolved {
        let Some(cache) = &self.cache_size else {
            return Resolved::Disabled { warning: None };
        };
        let disabled = |what: &SizeSetting, why: &str| Resolved::Disabled {
            warning: Some(format!("local hot cache disabled: {}={:?}: {why}", what.source, what.value)),
        };
        let cache_bytes = match parse_bytes(&cache.value) {
            Ok(n) => n,
            Err(why) => return disabled(cache, &why),
        };
        let block_bytes = match &self.block_size {
            None => DEFAULT_BLOCK_SIZE,
            Some(b) => match parse_bytes(&b.value) {
                Ok(n) => n,
                Err(why) => return disabled(b, &why),
            },
        };
        let block_name = match &self.block_size {
            Some(b) => format!("{}={}", b.source, b.value.trim()),
            None => format!("the default block of {DEFAULT_BLOCK_SIZE} bytes"),
        };
        if cache_bytes < block_bytes {
            return disabled(cache, &format!("is smaller than one block ({block_name})"));
        }
        let blocks = cache_bytes / block_bytes;
        if blocks > MAX_BLOCKS {
            return disabled(cache, &format!("makes {blocks} blocks of {block_name}: more than {MAX_BLOCKS} blocks"));
        }
        Resolved::Enabled(Layout {
            blocks: blocks as u32,
            block_size: block_bytes,
            admission: self.admission,
            fill: self.fill,
        })
    }

    /// Applies the config file's keys (any JSON value: numbers, strings, and whatever else is
    /// written there, which [`Self::resolve`] then judges).
    pub fn apply_file_value(slot: &mut Option<SizeSetting>, key: &str, v: Option<serde_json::Value>) {
        match v {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::String(s)) => *slot = Some(SizeSetting::new(key, s)),
            Some(other) => *slot = Some(SizeSetting::new(key, other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> HotCacheSettings {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        HotCacheSettings::from_vars(|n| map.get(n).cloned()).unwrap()
    }

    fn warning(vars: &[(&str, &str)]) -> String {
        match from(vars).resolve() {
            Resolved::Disabled { warning: Some(w) } => w,
            other => panic!("{vars:?} should disable the cache with a warning, got {other:?}"),
        }
    }

    #[test]
    fn unset_disables_without_a_warning() {
        assert_eq!(from(&[]).resolve(), Resolved::Disabled { warning: None });
        // A block size alone does not enable anything, and is not judged.
        assert_eq!(from(&[("LOCAL_HOT_BLOCK_SIZE", "junk")]).resolve(), Resolved::Disabled { warning: None });
    }

    #[test]
    fn valid_sizes_make_floor_size_over_block_blocks() {
        let r = from(&[("LOCAL_HOT_CACHE_SIZE", "419430400")]).resolve();
        assert_eq!(
            r,
            Resolved::Enabled(Layout {
                blocks: 25,
                block_size: 16 << 20,
                admission: Admission::Always,
                fill: FillMode::Auto
            })
        );
        let r = from(&[("LOCAL_HOT_CACHE_SIZE", " 1000 "), ("LOCAL_HOT_BLOCK_SIZE", "300")]).resolve();
        assert_eq!(
            r,
            Resolved::Enabled(Layout {
                blocks: 3,
                block_size: 300,
                admission: Admission::Always,
                fill: FillMode::Auto
            })
        );
        // Exactly one block.
        let r = from(&[("MC_STORE_LOCAL_HOT_CACHE_SIZE", "4096"), ("MC_STORE_LOCAL_HOT_BLOCK_SIZE", "4096")]).resolve();
        assert_eq!(
            r,
            Resolved::Enabled(Layout {
                blocks: 1,
                block_size: 4096,
                admission: Admission::Always,
                fill: FillMode::Auto
            })
        );
    }

    #[test]
    fn sizes_take_the_grammar_of_every_other_size_knob() {
        // `1G` is a gigabyte here as in `global_segment_size`, `MC_SLICE_SIZE` or the disk
        // tier's sizes; it used to disable the cache as "not a number".
        for (cache, block, blocks, block_size) in [
            ("1G", None, 64, 16 << 20),
            ("1GB", Some("64M"), 16, 64 << 20),
            ("800MiB", Some("16m"), 50, 16 << 20),
            (" 64k ", Some("4K"), 16, 4096),
        ] {
            let mut vars = vec![("LOCAL_HOT_CACHE_SIZE", cache)];
            vars.extend(block.map(|b| ("LOCAL_HOT_BLOCK_SIZE", b)));
            assert_eq!(
                from(&vars).resolve(),
                Resolved::Enabled(Layout { blocks, block_size, admission: Admission::Always, fill: FillMode::Auto }),
                "{vars:?}"
            );
            assert_eq!(crescent_engine::parse_size(cache).unwrap(), blocks as u64 * block_size, "{cache}");
        }
    }

    #[test]
    fn the_plain_spelling_wins_over_the_mc_store_one() {
        let s = from(&[("LOCAL_HOT_CACHE_SIZE", "8192"), ("MC_STORE_LOCAL_HOT_CACHE_SIZE", "junk")]);
        assert_eq!(s.cache_size.unwrap().value, "8192");
        let s = from(&[("MC_STORE_LOCAL_HOT_CACHE_SIZE", "8192")]);
        assert_eq!(s.cache_size.unwrap().source, "MC_STORE_LOCAL_HOT_CACHE_SIZE");
    }

    #[test]
    fn every_invalid_form_disables_with_one_warning_naming_the_value() {
        for (value, why) in [
            ("0", "zero"),
            ("-0", "zero"),
            ("-5", "negative"),
            ("-1048576", "negative"),
            ("-16M", "negative"),
            ("abc", "not a size"),
            ("1.5", "unknown unit"),
            ("0x100", "unknown unit"),
            ("", "not a size"),
            ("  ", "not a size"),
            ("--5", "not a size"),
            ("16XB", "unknown unit"),
            ("99999999999999999999999", "not a size"),
            ("99999999999T", "too large"),
            ("1000", "smaller than one block"),
            ("16777215", "smaller than one block"),
        ] {
            for var in CACHE_SIZE_VARS {
                let w = warning(&[(var, value)]);
                assert!(
                    w.contains(var) && w.contains(&format!("{value:?}")) && w.contains(why),
                    "{var}={value:?}: {w}"
                );
                assert_eq!(w.lines().count(), 1, "one warning line: {w}");
            }
        }
        for (value, why) in
            [("0", "zero"), ("-4096", "negative"), ("4x", "unknown unit"), ("", "not a size"), ("1e6", "unknown unit")]
        {
            for var in BLOCK_SIZE_VARS {
                let w = warning(&[("LOCAL_HOT_CACHE_SIZE", "1073741824"), (var, value)]);
                assert!(
                    w.contains(var) && w.contains(&format!("{value:?}")) && w.contains(why),
                    "{var}={value:?}: {w}"
                );
            }
        }
        // Smaller than a configured block: both values are named.
        let w = warning(&[("LOCAL_HOT_CACHE_SIZE", "8191"), ("LOCAL_HOT_BLOCK_SIZE", "8192")]);
        assert!(w.contains("\"8191\"") && w.contains("LOCAL_HOT_BLOCK_SIZE=8192"), "{w}");
        // Absurd block counts.
        let w = warning(&[("LOCAL_HOT_CACHE_SIZE", "1073741824"), ("LOCAL_HOT_BLOCK_SIZE", "1")]);
        assert!(w.contains("more than"), "{w}");
    }

    #[test]
    fn admission_parses_and_rejects_unknown_words() {
        assert_eq!(from(&[(ADMISSION_VAR, "second-access")]).admission, Admission::SecondAccess);
        assert_eq!(from(&[(ADMISSION_VAR, "ALWAYS")]).admission, Admission::Always);
        let map: HashMap<&str, &str> = [(ADMISSION_VAR, "sometimes")].into();
        let e = HotCacheSettings::from_vars(|n| map.get(n).map(|v| v.to_string())).unwrap_err().to_string();
        assert!(e.contains("sometimes"), "{e}");
    }

    #[test]
    fn fill_mode_defaults_to_auto_and_parses_both_spellings() {
        assert_eq!(from(&[]).fill, FillMode::Auto);
        assert_eq!(from(&[("LOCAL_HOT_CACHE_FILL", "AUTO")]).fill, FillMode::Auto);
        assert_eq!(from(&[("LOCAL_HOT_CACHE_FILL", " Deferred ")]).fill, FillMode::Deferred);
        assert_eq!(from(&[("LOCAL_HOT_CACHE_FILL", "Inline")]).fill, FillMode::Inline);
        assert_eq!(from(&[("MC_STORE_LOCAL_HOT_CACHE_FILL", "inline")]).fill, FillMode::Inline);
        assert_eq!(
            from(&[("LOCAL_HOT_CACHE_FILL", "deferred"), ("MC_STORE_LOCAL_HOT_CACHE_FILL", "inline")]).fill,
            FillMode::Deferred,
            "the plain spelling wins"
        );
        let map: HashMap<&str, &str> = [("LOCAL_HOT_CACHE_FILL", "lazy")].into();
        let e = HotCacheSettings::from_vars(|n| map.get(n).map(|v| v.to_string())).unwrap_err().to_string();
        assert!(e.contains("lazy") && e.contains("LOCAL_HOT_CACHE_FILL"), "{e}");
        let r = from(&[
            ("LOCAL_HOT_CACHE_SIZE", "8192"),
            ("LOCAL_HOT_BLOCK_SIZE", "4096"),
            ("LOCAL_HOT_CACHE_FILL", "deferred"),
        ])
        .resolve();
        assert_eq!(
            r,
            Resolved::Enabled(Layout {
                blocks: 2,
                block_size: 4096,
                admission: Admission::Always,
                fill: FillMode::Deferred
            })
        );
    }

    #[test]
    fn file_values_of_any_json_type_are_judged_by_resolve() {
        let mut s = HotCacheSettings::default();
        HotCacheSettings::apply_file_value(&mut s.cache_size, "local_hot_cache_size", Some(serde_json::json!(-5)));
        assert!(
            matches!(s.resolve(), Resolved::Disabled { warning: Some(w) } if w.contains("negative") && w.contains("local_hot_cache_size"))
        );
        HotCacheSettings::apply_file_value(&mut s.cache_size, "local_hot_cache_size", Some(serde_json::json!(1.5)));
        assert!(matches!(s.resolve(), Resolved::Disabled { warning: Some(w) } if w.contains("\"1.5\"")));
        HotCacheSettings::apply_file_value(&mut s.cache_size, "local_hot_cache_size", Some(serde_json::json!(true)));
        assert!(matches!(s.resolve(), Resolved::Disabled { warning: Some(w) } if w.contains("\"true\"")));
        HotCacheSettings::apply_file_value(
            &mut s.cache_size,
            "local_hot_cache_size",
            Some(serde_json::json!("33554432")),
        );
        assert_eq!(
            s.resolve(),
            Resolved::Enabled(Layout {
                blocks: 2,
                block_size: 16 << 20,
                admission: Admission::Always,
                fill: FillMode::Auto
            })
        );
        // null leaves the previous value.
        HotCacheSettings::apply_file_value(&mut s.cache_size, "local_hot_cache_size", Some(serde_json::Value::Null));
        assert!(matches!(s.resolve(), Resolved::Enabled(_)));
    }
}
