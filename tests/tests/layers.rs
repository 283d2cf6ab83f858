//! The module layering of `transports/` and `store/`, read from their sources.
//!
//! Every `.rs` file of a crate's `src/` is parsed (with `syn`); each path a module names
//! (`use` trees, paths in code and inside macro calls) is resolved to the module it points
//! into, following `use` re-exports (`crate::FailureReason` is `crate::slice`; a path through
//! another module's re-export names that module too). Code under
//! `#[cfg(test)]` is left out: tests may reach anywhere to set things up. The checks:
//!
//! * `transports/src/rdma`: each module imports only modules of lower layers ([`RDMA`]);
//! * `transports/` and `transfer-engine/`: no import cycle between their modules;
//! * `store/`: the same over its layers ([`STORE`], [`STORE_CLIENT`], [`STORE_MASTER`]): the
//!   master and the client never import each other (they share `proto`, `protocol`, `error`
//!   and `leader`), the master's core imports none of its driver, and no import cycle.
//!
//! A parent module importing its own children is not an edge (`mod.rs` is its folder's
//! face); a child importing its parent is. A new module of `rdma/` must be given its place
//! in [`RDMA`]: an unplaced one fails the check.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// How the modules of one layer may import each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Within {
    /// Each may import those listed before it.
    Ordered,
    /// None imports another.
    Apart,
}
use Within::{Apart, Ordered};

/// One layer: its name, how its modules may import each other, and its modules (paths
/// relative to the checked root; `""` is the root itself, `"*"` every module placed nowhere
/// else). A module stands for the modules below it too, unless one of those is placed on its
/// own. A module may import those of lower layers, and within its layer as [`Within`] says.
struct Layer(&'static str, Within, &'static [&'static str]);

/// The rdma transport (`transports/src/rdma`), lowest layer first.
const RDMA: &[Layer] = &[
    Layer("settings", Ordered, &["config"]),
    Layer("verbs resources", Ordered, &["ffi", "device", "mr", "gpudirect", "qp"]),
    Layer("completion dispatch", Ordered, &["poller"]),
    Layer("lanes", Ordered, &["lane"]),
    Layer("peers", Ordered, &["wire", "shared", "peer", "server"]),
    Layer("transport", Ordered, &[""]),
];

/// The store (`store/src`), lowest layer first.
const STORE: &[Layer] = &[
    Layer(
        "shared types",
        Ordered,
        &["proto", "error", "protocol", "fastrpc", "metrics_registry", "pattern", "blank_record", "leader", "logging"],
    ),
    Layer("memory", Ordered, &["allocator", "staging", "resident"]),
    Layer("services", Apart, &["master", "client"]),
    // The standalone client serves a full client's store to dummy clients.
    Layer("standalone", Ordered, &["standalone"]),
    Layer("crate", Ordered, &[""]),
];

/// Inside the master: its core (the state and the logic over it, and what they are made of:
/// the objects, tenants and access rules, the settings) at the bottom; the policies over the
/// core (where replicas go, which objects eviction takes) apart from each other above it; the
/// driver (`Master`, its calls, threads and services) on top.
const STORE_MASTER: &[Layer] = &[
    Layer("core", Ordered, &["access", "tenant", "objects", "core", "config"]),
    Layer("policies", Apart, &["allocation", "eviction"]),
    Layer("the driver", Ordered, &["*"]),
];

/// Inside the store client: what a value is (its scatter/gather pieces, its checksum) at the
/// bottom; its storage tiers above, standing on their own; the rest of it on top.
const STORE_CLIENT: &[Layer] = &[
    Layer("values", Ordered, &["sg", "checksum"]),
    Layer("tiers", Apart, &["disk", "hot_cache"]),
    Layer("the rest of the client", Ordered, &["*"]),
];

/// One import: `from` names `to` (both module paths, `""` the crate root) at `file:line`.
#[derive(Debug, Clone)]
struct Edge {
    from: String,
    to: String,
    file: PathBuf,
    line: usize,
    path: String,
}

/// A crate's modules and the imports between them.
struct Graph {
    modules: BTreeSet<String>,
    edges: Vec<Edge>,
}

fn join(segs: &[String]) -> String {
    segs.join("::")
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs
        .iter()
        .any(|a| a.path().is_ident("cfg") && a.meta.require_list().is_ok_and(|l| l.tokens.to_string().trim() == "test"))
}

/// The module path of a source file (`src/a/mod.rs` and `src/a.rs` are `a`), or `None` for
/// binaries (`src/bin/`), which are crates of their own.
fn module_of(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).ok()?;
    let mut segs: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    if segs.first().is_some_and(|s| s == "bin") {
        return None;
    }
    let last = segs.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if !(stem == "mod" || stem == "lib" && segs.is_empty()) {
        segs.push(stem.to_string());
    }
    Some(segs)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// A path as written: its segments and the module it is written in.
#[derive(Debug, Clone)]
struct Written {
    segs: Vec<String>,
    scope: Vec<String>,
}

/// What the pass over the files gathers.
#[derive(Default)]
struct Gathered {
    /// File modules, inline modules (`mod x { .. }`) and declared ones (`mod x;`).
    modules: BTreeSet<String>,
    /// Modules declared under `#[cfg(test)]`.
    test_modules: BTreeSet<String>,
    /// Names brought in by `use`: (module, name) → the path it imports.
    aliases: HashMap<(String, String), Written>,
    /// Every path the non-test code writes, with its file and line.
    named: Vec<(PathBuf, Vec<String>, Written, usize)>,
}

impl Gathered {
    /// A written path from the crate root, or `None` where it names something outside the
    /// crate's modules (std, another crate, a local item or variable).
    fn absolute(&self, w: &Written, depth: usize) -> Option<Vec<String>> {
        let first = w.segs.first()?;
        let mut base = w.scope.clone();
        let mut rest: &[String] = &w.segs;
        match first.as_str() {
            "crate" => {
                base.clear();
                rest = &rest[1..];
            }
            "self" => rest = &rest[1..],
            "super" => {
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            _ => {
                let mut child = w.scope.clone();
                child.push(first.clone());
                if !self.modules.contains(&join(&child)) {
                    // A name imported here (`use super::lane; lane::Work`), else not ours.
                    let alias = self.aliases.get(&(join(&w.scope), first.clone()))?;
                    if depth > 16 {
                        return None;
                    }
                    let mut abs = self.absolute(alias, depth + 1)?;
                    abs.extend(rest[1..].iter().cloned());
                    return Some(abs);
                }
            }
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The module an absolute path points into, following re-exports, and the modules whose
    /// re-exports it went through.
    fn resolve(&self, abs: Vec<String>) -> (String, Vec<String>) {
        let mut segs = abs;
        let mut via = Vec::new();
        for _ in 0..16 {
            let mut at: Vec<String> = Vec::new();
            let mut redirected = None;
            for (i, s) in segs.iter().enumerate() {
                let mut next = at.clone();
                next.push(s.clone());
                if self.modules.contains(&join(&next)) {
                    at = next;
                    continue;
                }
                if let Some(alias) = self.aliases.get(&(join(&at), s.clone())) {
                    if let Some(mut t) = self.absolute(alias, 0) {
                        t.extend(segs[i + 1..].iter().cloned());
                        if t != segs {
                            redirected = Some(t);
                        }
                    }
                }
                break;
            }
            match redirected {
                Some(t) => {
                    via.push(join(&at));
                    segs = t;
                }
                None => return (join(&at), via),
            }
        }
        (join(&segs), via)
    }
}

struct Visitor<'a> {
    file: PathBuf,
    file_module: Vec<String>,
    scope: Vec<String>,
    gathered: &'a mut Gathered,
}

impl Visitor<'_> {
    fn note(&mut self, segs: Vec<String>, line: usize) {
        if segs.len() > 1 || segs.first().is_some_and(|s| s == "super" || s == "crate") {
            let w = Written { segs, scope: self.scope.clone() };
            self.gathered.named.push((self.file.clone(), self.file_module.clone(), w, line));
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree, line: usize) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree, line);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                let mut full = prefix.clone();
                if name != "self" {
                    full.push(name.clone());
                }
                let alias = if name == "self" { prefix.last().cloned().unwrap_or_default() } else { name };
                self.alias(&full, alias);
                self.note(full, line);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                if r.ident != "self" {
                    full.push(r.ident.to_string());
                }
                self.alias(&full, r.rename.to_string());
                self.note(full, line);
            }
            syn::UseTree::Glob(_) => self.note(prefix.clone(), line),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t, line);
                }
            }
        }
    }

    fn alias(&mut self, full: &[String], name: String) {
        let w = Written { segs: full.to_vec(), scope: self.scope.clone() };
        self.gathered.aliases.insert((join(&self.scope), name), w);
    }

    /// Paths inside a macro call (`format!`, `assert!`, ...): `a::b::c` token runs.
    fn macro_tokens(&mut self, tokens: TokenStream) {
        let mut run: Vec<String> = Vec::new();
        let mut line = 0;
        let mut colons = 0;
        for tt in tokens {
            match tt {
                TokenTree::Ident(i) => {
                    if colons != 2 && !run.is_empty() {
                        self.note(std::mem::take(&mut run), line);
                    }
                    if run.is_empty() {
                        line = i.span().start().line;
                    }
                    run.push(i.to_string());
                    colons = 0;
                }
                TokenTree::Punct(p) if p.as_char() == ':' => colons += 1,
                other => {
                    if !run.is_empty() {
                        self.note(std::mem::take(&mut run), line);
                    }
                    colons = 0;
                    if let TokenTree::Group(g) = other {
                        self.macro_tokens(g.stream());
                    }
                }
            }
        }
        if !run.is_empty() {
            self.note(run, line);
        }
    }
}

impl<'ast> Visit<'ast> for Visitor<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Mod(m) => {
                let mut child = self.scope.clone();
                child.push(m.ident.to_string());
                self.gathered.modules.insert(join(&child));
                if is_cfg_test(&m.attrs) {
                    self.gathered.test_modules.insert(join(&child));
                    return;
                }
                if let Some((_, items)) = &m.content {
                    let outer = std::mem::replace(&mut self.scope, child);
                    for i in items {
                        self.visit_item(i);
                    }
                    self.scope = outer;
                }
                return;
            }
            _ => return syn::visit::visit_item(self, item),
        };
        if !is_cfg_test(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let test = match item {
            syn::ImplItem::Fn(f) => is_cfg_test(&f.attrs),
            syn::ImplItem::Const(c) => is_cfg_test(&c.attrs),
            _ => false,
        };
        if !test {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let line = u.use_token.span.start().line;
        self.use_tree(&mut Vec::new(), &u.tree, line);
    }

    /// `pub(crate)`, `pub(super)`: not imports.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = p.segments.first().map_or(0, |s| s.ident.span().start().line);
        self.note(segs, line);
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.macro_tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
}

/// Reads a crate's `src/` and resolves every path its modules name.
fn graph(crate_dir: &str) -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let src = root.join(crate_dir).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut g = Gathered::default();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        g.modules.insert(join(&module));
        let text = std::fs::read_to_string(file).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let rel = file.strip_prefix(root).unwrap_or(file).to_path_buf();
        let mut v = Visitor { file: rel, file_module: module.clone(), scope: module, gathered: &mut g };
        v.visit_file(&ast);
    }
    // Files of `#[cfg(test)]` modules (and everything below them) are tests.
    let is_test = |m: &str| g.test_modules.iter().any(|t| m == t || m.starts_with(&format!("{t}::")));
    let mut edges = Vec::new();
    for (file, module, w, line) in &g.named {
        let from = join(module);
        if is_test(&from) {
            continue;
        }
        let Some(abs) = g.absolute(w, 0) else {
            continue;
        };
        // The module the item is in, and any module whose re-export the path goes through
        // (`crate::master::MAX_KEY_LEN` names `master` even where `master` re-exports it),
        // but not the re-exports of the module's own ancestors (`crate::Slice`).
        let (to, via) = g.resolve(abs);
        let ancestor = |m: &str| m.is_empty() || from == m || from.starts_with(&format!("{m}::"));
        let named = via.into_iter().filter(|m| !ancestor(m)).chain(std::iter::once(to));
        for to in named.collect::<BTreeSet<_>>() {
            if to != from {
                edges.push(Edge { from: from.clone(), to, file: file.clone(), line: *line, path: w.segs.join("::") });
            }
        }
    }
    let modules = g.modules.iter().filter(|m| !is_test(m)).cloned().collect();
    Graph { modules, edges }
}

/// Where `module` (relative to the checked root) stands in `layers`: (layer, entry).
fn place(layers: &[Layer], module: &str) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize, usize)> = None;
    let mut rest = None;
    for (li, Layer(_, _, mods)) in layers.iter().enumerate() {
        for (mi, m) in mods.iter().enumerate() {
            if *m == "*" {
                rest = Some((li, mi));
                continue;
            }
            let covers = module == *m || !m.is_empty() && module.starts_with(&format!("{m}::"));
            let depth = if m.is_empty() { 0 } else { m.split("::").count() };
            if covers && best.is_none_or(|(_, _, d)| depth > d) {
                best = Some((li, mi, depth));
            }
        }
    }
    best.map(|(l, m, _)| (l, m)).or(rest)
}

/// The imports that break `layers` among the modules under `root`, and the modules under
/// it that have no place.
fn layer_violations(g: &Graph, root: &str, layers: &[Layer]) -> (Vec<String>, Vec<String>) {
    let rel = |m: &str| -> Option<String> {
        if m == root {
            Some(String::new())
        } else if root.is_empty() {
            Some(m.to_string())
        } else {
            m.strip_prefix(&format!("{root}::")).map(str::to_string)
        }
    };
    let unplaced = g.modules.iter().filter(|m| rel(m).is_some_and(|r| place(layers, &r).is_none())).cloned().collect();
    let mut bad = Vec::new();
    for e in &g.edges {
        let (Some(from), Some(to)) = (rel(&e.from), rel(&e.to)) else {
            continue;
        };
        let (Some(f), Some(t)) = (place(layers, &from), place(layers, &to)) else {
            continue;
        };
        let allowed = match (t.0.cmp(&f.0), layers[f.0].1) {
            (std::cmp::Ordering::Less, _) => true,
            (std::cmp::Ordering::Greater, _) => false,
            (std::cmp::Ordering::Equal, _) if t.1 == f.1 => true,
            (std::cmp::Ordering::Equal, Ordered) => t.1 < f.1,
            (std::cmp::Ordering::Equal, Apart) => false,
        };
        if !allowed {
            bad.push(format!(
                "{}:{}: `{}` ({}) imports `{}` ({}) through `{}`",
                e.file.display(),
                e.line,
                e.from,
                layers[f.0].0,
                e.to,
                layers[t.0].0,
                e.path
            ));
        }
    }
    (bad, unplaced)
}

/// Import cycles among the modules of `g`: the modules of each strongly connected component
/// of more than one module, with the imports that make it up.
fn cycles(g: &Graph) -> Vec<String> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for e in &g.edges {
        let parent_to_child = e.from.is_empty() || e.to.starts_with(&format!("{}::", e.from));
        if !parent_to_child {
            next.entry(e.from.as_str()).or_default().insert(e.to.as_str());
        }
    }
    // Tarjan's strongly connected components.
    #[derive(Default)]
    struct State<'a> {
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<BTreeSet<&'a str>>,
    }
    fn visit<'a>(v: &'a str, next: &BTreeMap<&'a str, BTreeSet<&'a str>>, s: &mut State<'a>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        for &w in next.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(w, next, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = BTreeSet::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(w);
                comp.insert(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                s.out.push(comp);
            }
        }
    }
    let mut s = State::default();
    let nodes: BTreeSet<&str> = next.keys().copied().chain(next.values().flatten().copied()).collect();
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(v, &next, &mut s);
        }
    }
    s.out
        .iter()
        .map(|comp| {
            let inside: Vec<String> = g
                .edges
                .iter()
                .filter(|e| comp.contains(e.from.as_str()) && comp.contains(e.to.as_str()))
                .filter(|e| next.get(e.from.as_str()).is_some_and(|n| n.contains(e.to.as_str())))
                .map(|e| format!("  {}:{}: `{}` -> `{}` ({})", e.file.display(), e.line, e.from, e.to, e.path))
                .collect();
            format!("cycle between {:?}:\n{}", comp, inside.join("\n"))
        })
        .collect()
}

fn assert_layered(g: &Graph, root: &str, layers: &[Layer]) {
    let (bad, unplaced) = layer_violations(g, root, layers);
    assert!(unplaced.is_empty(), "modules with no layer (give them one in tests/tests/layers.rs): {unplaced:?}");
    assert!(bad.is_empty(), "imports from a higher layer:\n{}", bad.join("\n"));
}

#[test]
fn rdma_modules_import_only_from_lower_layers() {
    let g = graph("transports");
    assert!(
        g.edges.iter().any(|e| e.from == "rdma" && e.to == "rdma::peer"),
        "the reader sees the rdma imports (the transport uses its peers)"
    );
    assert_layered(&g, "rdma", RDMA);
}

#[test]
fn transports_has_no_import_cycle() {
    let found = cycles(&graph("transports"));
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn transfer_engine_has_no_import_cycle() {
    let g = graph("transfer-engine");
    assert!(g.edges.iter().any(|e| e.from == "notify" && e.to == "handshake_wire"), "the reader sees imports");
    let found = cycles(&g);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn store_modules_import_only_from_lower_layers_and_have_no_cycle() {
    let g = graph("store");
    assert!(g.edges.iter().any(|e| e.from == "client::read" && e.to == "client::exec"), "the reader sees imports");
    assert_layered(&g, "", STORE);
    assert_layered(&g, "client", STORE_CLIENT);
    assert_layered(&g, "master", STORE_MASTER);
    let found = cycles(&g);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The checks themselves, on a made-up crate: they catch what they are for.
#[test]
fn an_upward_import_an_unplaced_module_and_a_cycle_are_caught() {
    let edge = |from: &str, to: &str| Edge {
        from: from.into(),
        to: to.into(),
        file: PathBuf::from("x.rs"),
        line: 1,
        path: format!("crate::{to}"),
    };
    let modules = ["", "low", "mid", "mid::part", "high", "a", "b", "new"].map(String::from).into();
    let layers = &[
        Layer("low", Ordered, &["low"]),
        Layer("mid", Apart, &["mid", "a", "b"]),
        Layer("top", Ordered, &["high", ""]),
    ];
    let fine = Graph { modules, edges: vec![edge("mid::part", "low"), edge("high", "mid"), edge("", "high")] };
    let (bad, unplaced) = layer_violations(&fine, "", layers);
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(unplaced, vec!["new".to_string()]);
    assert!(cycles(&fine).is_empty());

    let upward = Graph { modules: fine.modules.clone(), edges: vec![edge("mid::part", "high")] };
    assert_eq!(layer_violations(&upward, "", layers).0.len(), 1, "mid imports the top layer");
    let apart = Graph { modules: fine.modules.clone(), edges: vec![edge("a", "b")] };
    assert_eq!(layer_violations(&apart, "", layers).0.len(), 1, "two modules of an Apart layer");
    let later = Graph { modules: fine.modules.clone(), edges: vec![edge("high", "")] };
    assert_eq!(layer_violations(&later, "", layers).0.len(), 1, "one listed after it in an Ordered layer");

    let cycle = Graph {
        modules: fine.modules.clone(),
        edges: vec![edge("a", "b"), edge("b", "mid::part"), edge("mid::part", "a")],
    };
    let found = cycles(&cycle);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("\"a\", \"b\", \"mid::part\""), "{found:?}");
    let parent =
        Graph { modules: fine.modules.clone(), edges: vec![edge("mid", "mid::part"), edge("mid::part", "mid")] };
    assert!(cycles(&parent).is_empty(), "a parent importing its own child is not an edge");
}

/// Prints the import graphs (`cargo test -p crescent-tests --test layers -- --ignored
/// --nocapture print_graphs`).
#[test]
#[ignore = "a printer for readers, not a check: asserts nothing; run it by hand (see above)"]
fn print_graphs() {
    for c in ["transports", "store"] {
        let g = graph(c);
        let mut edges: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for e in g.edges {
            edges.entry((e.from, e.to)).or_default().push(format!("{}:{} {}", e.file.display(), e.line, e.path));
        }
        for ((f, t), at) in edges {
            println!("{c}: {f} -> {t}    ({})", at[0]);
        }
    }
}
