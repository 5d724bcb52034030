//! The collector's module layering, checked from its source: every `.rs` file under `src/` is read, test code
//! is left out (`#[cfg(test)]` items and the files they declare), and each top-level module's references to
//! another (`crate::<module>`, `crate::{<module>, ..}`, and `super::` chains that climb out of the module) are
//! collected as edges. An edge that [`ALLOWED`] does not permit fails the test unless it is listed in
//! [`KNOWN_VIOLATIONS`]; a listed violation that no longer exists fails it too, so that list only shrinks.
//!
//! The layers, bottom to top (see `docs/ARCHITECTURE.md` and `/work/shared/notes/collector-layering.md`):
//! - leaves that import no other module: `time` (clock, time text), `settings` (shared config checks),
//!   `health`, `conn_limit` (connection caps, used by both listeners), and the pure domain `job`;
//! - pure SLO maths `slo` (on `job` and `time`) and the accepted-event feed `feed` (on `job`);
//! - storage `store` (bytes in and out: `job`, `time`, `health`) and the in-memory index `index`;
//! - the applier `applier` (group commit, acks, checkpoints, folds, retention) over both;
//! - the ingest edge `ingest`, which hands batches to the applier;
//! - readers, which never import `ingest` or `applier`: `alert`, `compare`, `export` (which may observe
//!   `alert`), then `api` over all of them;
//! - the top, which may import anything: `config` (it owns the file and calls every section's validator) and
//!   `app` (wiring), plus the crate root `lib.rs`.
//!
//! Nothing below `config`/`app` imports `api`, `app` or `config`. `main.rs` is its own crate (it reaches the
//! library as `startline_collector::`) and is not read.
//!
//! The index has one writer: outside `applier/` (and `index/` itself) no non-test code takes the index write lock
//! (`index.write()`, `idx.write()`); readers and the alert loop ask the applier instead (see
//! `index::deadlines`). [`only_the_applier_takes_the_index_write_lock`] checks it.
//!
//! The scan is lexical, not a full parser: comments, strings and char literals are skipped; inline non-test
//! `mod x { .. }` blocks are treated as part of their file's module (only the crate root has one).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Which modules each top-level module may import. A module missing here fails the test: classify it.
const ALLOWED: &[(&str, &[&str])] = &[
    // Leaves.
    ("time", &[]),
    ("settings", &[]),
    ("health", &[]),
    ("job", &[]),
    // Connection caps and the descriptor budget both listeners share (and the client-address key of per-address
    // limits).
    ("conn_limit", &[]),
    // The binary's shell completions and man pages, from its clap definition.
    ("cli_docs", &[]),
    // Pure maths over the domain.
    ("slo", &["job", "time"]),
    // The accepted-event feed: the applier publishes, readers subscribe.
    ("feed", &["job"]),
    // The stream out's records, job changes, filters, live hub and alert outbox.
    ("stream", &["job", "slo", "time", "settings"]),
    // Storage: bytes in and out, keyed by the domain's types.
    ("store", &["job", "time", "health"]),
    // The in-memory index: hot jobs, folded rows, derived SLO and metric state, label limits.
    ("index", &["job", "slo", "time", "health"]),
    // The applier: group commit and acks, checkpoints, folds, retention.
    ("applier", &["job", "slo", "index", "store", "time", "health", "feed", "stream"]),
    // The ingest edge: validation and the batch handed to the applier.
    // Who is talking and what they may do: used by both edges and exported by `export`.
    ("auth", &["settings", "time"]),
    ("ingest", &["job", "applier", "store", "time", "health", "settings", "auth", "conn_limit"]),
    // Readers: never the ingest path or the applier. `export` observes the alert board for its gauges (alert
    // never imports export); `api` serves every reader.
    ("alert", &["job", "slo", "index", "store", "time", "health", "settings", "stream"]),
    ("export", &["job", "slo", "index", "store", "time", "health", "settings", "alert", "auth", "feed", "stream"]),
    ("compare", &["job", "slo", "index", "time"]),
    (
        "api",
        &[
            "job",
            "slo",
            "index",
            "store",
            "time",
            "health",
            "settings",
            "alert",
            "export",
            "compare",
            "auth",
            "conn_limit",
        ],
    ),
    // The top.
    ("config", &["*"]),
    ("app", &["*"]),
    ("lib", &["*"]),
];

/// Names that still resolve to another module, mapped to it.
const ALIASES: &[(&str, &str)] = &[];

/// Edges that break the layering today, each with the file that holds it; delete an entry when its edge goes.
const KNOWN_VIOLATIONS: &[(&str, &str, &str)] = &[];

/// One reference from a module to another, where it was first seen.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    from: String,
    to: String,
}

/// Every edge of the crate under `src`, with the places (file:line) that make it.
fn edges(src: &Path) -> BTreeMap<Edge, Vec<String>> {
    let files = rust_files(src);
    let test_files = test_only_files(&files);
    let modules: BTreeSet<String> = top_level_modules(src);
    let mut out: BTreeMap<Edge, Vec<String>> = BTreeMap::new();
    for file in &files {
        if test_files.contains(file) {
            continue;
        }
        let rel = file.strip_prefix(src).unwrap_or(file);
        let module_path = module_path(rel);
        let Some(from) = module_path.first().cloned() else { continue };
        if from == "main" {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let tokens = strip_test_items(tokenize(&text));
        for (to, line) in references(&tokens, module_path.len()) {
            let to = ALIASES.iter().find(|(a, _)| *a == to).map_or(to.clone(), |(_, t)| t.to_string());
            if to == from || !modules.contains(&to) {
                continue;
            }
            out.entry(Edge { from: from.clone(), to }).or_default().push(format!("{}:{line}", rel.display()));
        }
    }
    out
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read_dir {}: {e}", d.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The top-level modules: `src/<name>.rs` and `src/<name>/`, plus the crate root as `lib`.
fn top_level_modules(src: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(src).expect("read src") {
        let path = entry.expect("dir entry").path();
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        if path.is_dir() || path.extension().is_some_and(|e| e == "rs") {
            out.insert(name);
        }
    }
    out.extend(ALIASES.iter().map(|(a, _)| a.to_string()));
    out
}

/// The module path of a file relative to `src`: `alert/notify.rs` -> `[alert, notify]`, `alert/mod.rs` ->
/// `[alert]`, `lib.rs` -> `[lib]` (the root, where `super` cannot appear).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if let Some(last) = parts.last_mut() {
        *last = last.trim_end_matches(".rs").to_string();
        if last == "mod" {
            parts.pop();
        }
    }
    parts
}

/// Files declared by `#[cfg(test)] mod name;`.
fn test_only_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let toks = tokenize(&text);
        let dir = if file.file_name().is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs") {
            file.parent().map(Path::to_path_buf)
        } else {
            Some(file.with_extension(""))
        };
        let Some(dir) = dir else { continue };
        let mut i = 0;
        while i < toks.len() {
            if let Some(after) = cfg_test_at(&toks, i) {
                let mut j = after;
                if toks.get(j).is_some_and(|t| t.text == "pub") {
                    j += 1;
                }
                if toks.get(j).is_some_and(|t| t.text == "mod") && toks.get(j + 2).is_some_and(|t| t.text == ";") {
                    let name = &toks[j + 1].text;
                    out.insert(dir.join(format!("{name}.rs")));
                    out.insert(dir.join(name).join("mod.rs"));
                }
                i = after;
            } else {
                i += 1;
            }
        }
    }
    out
}

/// A token: an identifier, `::`, or one punctuation character, with its line.
#[derive(Debug, Clone)]
struct Token {
    text: String,
    line: usize,
}

/// Splits source into tokens, leaving out comments, string, byte-string, raw-string and char literals.
fn tokenize(src: &str) -> Vec<Token> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let push = |out: &mut Vec<Token>, text: String, line: usize| out.push(Token { text, line });
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(&c, i) {
            // r"..", r#".."#, br#".."#: skip to the quote followed by as many hashes.
            i += hashes.0;
            let close: Vec<char> = format!("\"{}", "#".repeat(hashes.1)).chars().collect();
            while i < c.len() && !c[i..].starts_with(&close) {
                if c[i] == '\n' {
                    line += 1;
                }
                i += 1;
            }
            i += close.len();
        } else if ch == '"' || (ch == 'b' && next == Some('"')) {
            i += if ch == 'b' { 2 } else { 1 };
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                if c.get(i) == Some(&'\n') {
                    line += 1;
                }
                i += 1;
            }
            i += 1;
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            push(&mut out, c[start..i].iter().collect(), line);
        } else if ch == ':' && next == Some(':') {
            push(&mut out, "::".into(), line);
            i += 2;
        } else {
            push(&mut out, ch.to_string(), line);
            i += 1;
        }
    }
    out
}

/// At a raw string's start: (length of the prefix through the opening quote, number of hashes).
fn raw_string_start(c: &[char], i: usize) -> Option<(usize, usize)> {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while c.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (c.get(j) == Some(&'"')).then_some((j + 1 - i, hashes))
}

/// If tokens at `i` are `# [ cfg ( test ) ]`, the index after them.
fn cfg_test_at(t: &[Token], i: usize) -> Option<usize> {
    let want = ["#", "[", "cfg", "(", "test", ")", "]"];
    let matches = want.iter().enumerate().all(|(k, w)| t.get(i + k).is_some_and(|x| x.text == *w));
    matches.then_some(i + want.len())
}

/// Leaves out every item marked `#[cfg(test)]`: up to its `;`, or through its `{ .. }` block.
fn strip_test_items(t: Vec<Token>) -> Vec<Token> {
    let mut out = Vec::with_capacity(t.len());
    let mut i = 0;
    while i < t.len() {
        let Some(mut j) = cfg_test_at(&t, i) else {
            out.push(t[i].clone());
            i += 1;
            continue;
        };
        let mut nest = 0i32;
        while j < t.len() {
            match t[j].text.as_str() {
                "(" | "[" => nest += 1,
                ")" | "]" => nest -= 1,
                ";" if nest == 0 => {
                    j += 1;
                    break;
                }
                "{" if nest == 0 => {
                    let mut depth = 0;
                    while j < t.len() {
                        match t[j].text.as_str() {
                            "{" => depth += 1,
                            "}" => depth -= 1,
                            _ => {}
                        }
                        j += 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        i = j;
    }
    out
}

/// The crate-level modules named by `crate::` paths and by `super::` chains that climb `depth` levels (out of
/// the file's top-level module), with their lines. Groups (`crate::{a, b::c}`) name each of their first segments.
fn references(t: &[Token], depth: usize) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        let mut j = i;
        let at_root = if t[i].text == "crate" && t.get(i + 1).is_some_and(|x| x.text == "::") {
            j = i + 2;
            true
        } else if t[i].text == "super" && (i == 0 || t[i - 1].text != "::") {
            let mut climbs = 0;
            while t.get(j).is_some_and(|x| x.text == "super") && t.get(j + 1).is_some_and(|x| x.text == "::") {
                climbs += 1;
                j += 2;
            }
            climbs > 0 && climbs >= depth
        } else {
            false
        };
        if !at_root {
            i += 1;
            continue;
        }
        match t.get(j) {
            Some(x) if x.text == "{" => {
                let mut level = 0;
                let mut expect_name = true;
                while j < t.len() {
                    let x = &t[j];
                    match x.text.as_str() {
                        "{" => {
                            level += 1;
                            expect_name = level == 1;
                        }
                        "}" => {
                            level -= 1;
                            if level == 0 {
                                break;
                            }
                        }
                        "," if level == 1 => expect_name = true,
                        name if expect_name && level == 1 => {
                            out.push((name.to_string(), x.line));
                            expect_name = false;
                        }
                        _ => {}
                    }
                    j += 1;
                }
            }
            Some(x) => out.push((x.text.clone(), x.line)),
            None => {}
        }
        i = j.max(i + 1);
    }
    out
}

/// The edges that break [`ALLOWED`], with where they are.
fn violations(all: &BTreeMap<Edge, Vec<String>>) -> Result<BTreeMap<Edge, Vec<String>>, String> {
    let mut out = BTreeMap::new();
    for (edge, places) in all {
        let Some((_, allowed)) = ALLOWED.iter().find(|(m, _)| *m == edge.from) else {
            return Err(format!("module `{}` is not in ALLOWED: give it a layer", edge.from));
        };
        if !allowed.contains(&"*") && !allowed.contains(&edge.to.as_str()) {
            out.insert(edge.clone(), places.clone());
        }
    }
    Ok(out)
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn modules_import_only_the_layers_below_them() {
    let all = edges(&src_dir());
    assert!(!all.is_empty(), "no edges found: is the scan reading src/?");
    let found = violations(&all).unwrap_or_else(|e| panic!("{e}"));
    let known: BTreeSet<(String, String)> =
        KNOWN_VIOLATIONS.iter().map(|(from, to, _)| (from.to_string(), to.to_string())).collect();
    let mut problems = Vec::new();
    for (edge, places) in &found {
        if !known.contains(&(edge.from.clone(), edge.to.clone())) {
            problems.push(format!(
                "forbidden edge {} -> {} at {}: import from a lower layer, or move the code",
                edge.from,
                edge.to,
                places.join(", ")
            ));
        }
    }
    for (from, to, file) in KNOWN_VIOLATIONS {
        let still = found.keys().any(|e| e.from == *from && e.to == *to);
        if !still {
            problems.push(format!("known violation {from} -> {to} ({file}) is gone: remove it from KNOWN_VIOLATIONS"));
        }
    }
    assert!(problems.is_empty(), "layering:\n  {}", problems.join("\n  "));
}

#[test]
fn every_module_has_a_layer() {
    let modules = top_level_modules(&src_dir());
    for m in modules {
        if m == "main" || ALIASES.iter().any(|(a, _)| *a == m) {
            continue;
        }
        assert!(ALLOWED.iter().any(|(name, _)| *name == m), "module `{m}` is not in ALLOWED: give it a layer");
    }
}

#[test]
fn the_scan_sees_paths_groups_and_super_but_not_tests_comments_or_strings() {
    let src = r##"
        //! Mentions crate::api in a doc comment.
        use crate::{job::JobRecord, store::{self, Store}};
        use super::super::slo::SloDef;
        use super::sibling;
        /* crate::app in a block comment */
        fn f() -> &'static str { let _c = '"'; let _ = crate::time::format_ms(0); "crate::config" }
        const RAW: &str = r#"crate::app"#;
        #[cfg(test)]
        const N: usize = 3;
        #[cfg(test)]
        mod tests {
            use crate::ingest::IngestStats;
        }
        pub(crate) fn g() {}
    "##;
    let tokens = strip_test_items(tokenize(src));
    let names: Vec<String> = references(&tokens, 2).into_iter().map(|(m, _)| m).collect();
    assert_eq!(names, ["job", "store", "slo", "time"]);
    // From a top-level module's own file (depth 1), one `super::` already reaches the crate root.
    let names: Vec<String> =
        references(&tokenize("use super::health::Health;"), 1).into_iter().map(|(m, _)| m).collect();
    assert_eq!(names, ["health"]);
}

#[test]
fn a_planted_forbidden_edge_is_caught() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("store")).expect("mkdir");
    std::fs::write(src.join("lib.rs"), "pub mod api;\npub mod store;\npub mod job;\n").expect("write");
    std::fs::write(src.join("api.rs"), "use crate::store::Store;\n").expect("write");
    std::fs::write(src.join("job.rs"), "pub struct JobRecord;\n").expect("write");
    std::fs::write(
        src.join("store/mod.rs"),
        "use crate::job::JobRecord;\nuse super::api::router;\n#[cfg(test)]\nmod tests;\n",
    )
    .expect("write");
    std::fs::write(src.join("store/tests.rs"), "use crate::api::router;\n").expect("write");
    let all = edges(src);
    let bad = violations(&all).expect("every module classified");
    let bad: Vec<(&str, &str, &Vec<String>)> = bad.iter().map(|(e, p)| (e.from.as_str(), e.to.as_str(), p)).collect();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!((bad[0].0, bad[0].1), ("store", "api"));
    assert_eq!(bad[0].2, &vec!["store/mod.rs:2".to_string()], "the test file's edge is not counted");
}

/// Lines where the tokens take the index write lock: `index.write()` or `idx.write()`.
fn index_writes(t: &[Token]) -> Vec<usize> {
    (2..t.len().saturating_sub(2))
        .filter(|&i| {
            t[i].text == "write"
                && t[i - 1].text == "."
                && matches!(t[i - 2].text.as_str(), "index" | "idx")
                && t[i + 1].text == "("
                && t[i + 2].text == ")"
        })
        .map(|i| t[i].line)
        .collect()
}

#[test]
fn only_the_applier_takes_the_index_write_lock() {
    let src = src_dir();
    let files = rust_files(&src);
    let test_files = test_only_files(&files);
    let mut writers = BTreeSet::new();
    let mut problems = Vec::new();
    for file in &files {
        if test_files.contains(file) {
            continue;
        }
        let rel = file.strip_prefix(&src).unwrap_or(file);
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let lines = index_writes(&strip_test_items(tokenize(&text)));
        if lines.is_empty() {
            continue;
        }
        let module = module_path(rel).first().cloned().unwrap_or_default();
        writers.insert(module.clone());
        if module != "applier" && module != "index" {
            problems.extend(lines.iter().map(|l| format!("{}:{l}", rel.display())));
        }
    }
    assert!(writers.contains("applier"), "the scan found no index write in the applier: is it reading src/?");
    assert!(
        problems.is_empty(),
        "the index write lock taken outside the applier (ask the applier: index::deadlines): {}",
        problems.join(", ")
    );
    // The scan sees a planted write, and not one in a comment, a string or test code.
    let planted = "fn f(s: &S) {\n    let g = s.index.write();\n    // idx.write()\n    let t = \"idx.write()\";\n}\n\
                   #[cfg(test)]\nmod tests { fn g(idx: &I) { idx.write(); } }\n";
    assert_eq!(index_writes(&strip_test_items(tokenize(planted))), vec![2]);
}
