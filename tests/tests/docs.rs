//! The documentation book (`docs/`, mdBook) against the code it describes: the book builds with the real
//! `mdbook` (installed by scripts/test.sh); every internal link and anchor of the book and of the top-level
//! Markdown files resolves; every key of the collector's configuration (taken from the code: the example
//! configuration read, validated and written back in full by `Config::effective`, as `check-config` prints it)
//! and every flag and environment variable of both binaries (from their own `--help`) is documented; every alert
//! the collector raises or the shipped rules define has a runbook, and every `runbook_url` in the repository
//! reaches one; the module maps of the crate docs, the binaries' docs and ARCHITECTURE.md name every module.

use startline_tests::{binary, workspace_root};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn docs() -> PathBuf {
    workspace_root().join("docs")
}

/// A page's text with `{{#include path}}` lines replaced by the file they name (relative to the page), as
/// mdBook's preprocessor does.
fn expanded(page: &Path) -> String {
    let text = read(page);
    let mut out = String::new();
    for line in text.lines() {
        match line.trim().strip_prefix("{{#include ").and_then(|r| r.strip_suffix("}}")) {
            Some(inc) => out.push_str(&expanded(&page.parent().expect("page dir").join(inc.trim()))),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fence = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
        } else if !fence {
            out.push(line);
        }
    }
    out
}

/// The anchor mdBook (and GitHub) gives a heading: its text without Markdown syntax, lower case, spaces as `-`,
/// punctuation other than `-` and `_` dropped; a repeated anchor gets `-1`, `-2`...
fn heading_ids(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut ids = BTreeSet::new();
    for line in prose(text) {
        let Some(rest) = line.strip_prefix('#') else { continue };
        let title = rest.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        // Link syntax keeps its text: [text](url) -> text.
        let mut plain = String::new();
        let mut chars = title.trim().chars().peekable();
        while let Some(c) = chars.next() {
            if c == ']' && chars.peek() == Some(&'(') {
                for d in chars.by_ref() {
                    if d == ')' {
                        break;
                    }
                }
            } else if c != '[' {
                plain.push(c);
            }
        }
        let id: String = plain
            .chars()
            .filter_map(|c| {
                if c.is_alphanumeric() || c == '_' || c == '-' {
                    Some(c.to_lowercase().next().unwrap_or(c))
                } else if c.is_whitespace() {
                    Some('-')
                } else {
                    None
                }
            })
            .collect();
        let n = seen.entry(id.clone()).or_insert(0);
        ids.insert(if *n == 0 { id.clone() } else { format!("{id}-{n}") });
        *n += 1;
    }
    ids
}

/// Inline link and image targets `](target)` of the prose, without a title.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        // Inline code spans hold no links.
        let mut plain = String::new();
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                plain.push(c);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("").to_string();
            out.push(target);
            rest = &after[end..];
        }
    }
    out
}

/// Every `.md` page SUMMARY.md lists, relative to docs/.
fn summary_pages() -> Vec<String> {
    link_targets(&read(&docs().join("SUMMARY.md")))
}

/// Checks one Markdown file's links: relative files exist, anchors exist in their target (or in the file itself).
fn check_links(file: &Path, problems: &mut Vec<String>) {
    let text = expanded(file);
    let dir = file.parent().expect("dir");
    for target in link_targets(&text) {
        if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() { file.to_path_buf() } else { dir.join(path) };
        if !resolved.exists() {
            problems.push(format!("{}: link to {target}: {} does not exist", file.display(), resolved.display()));
            continue;
        }
        if let Some(anchor) = anchor {
            let is_page = resolved.extension().is_some_and(|e| e == "md");
            if is_page && !heading_ids(&expanded(&resolved)).contains(anchor) {
                problems.push(format!("{}: link to {target}: no heading with anchor #{anchor}", file.display()));
            }
        }
    }
}

#[test]
fn book_links_and_anchors_resolve() {
    let mut problems = Vec::new();
    let listed: BTreeSet<String> = summary_pages().into_iter().collect();
    for page in &listed {
        if !docs().join(page).exists() {
            problems.push(format!("docs/SUMMARY.md lists {page}, which does not exist"));
        }
    }
    // Every page in docs/ is in the book (an unlisted page is not built, and its links are never checked).
    let mut stack = vec![docs()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                let rel = path.strip_prefix(docs()).expect("under docs").to_string_lossy().into_owned();
                if rel != "SUMMARY.md" && !listed.contains(&rel) {
                    problems.push(format!("docs/{rel} is not listed in docs/SUMMARY.md"));
                }
                check_links(&path, &mut problems);
            }
        }
    }
    for top in ["README.md", "CONTRIBUTING.md", "SECURITY.md", "CHANGELOG.md", "BENCHMARKS.md", "RELIABILITY.md"] {
        check_links(&workspace_root().join(top), &mut problems);
    }
    // Pages pulled into the book with {{#include}} must not link relatively: their links would point elsewhere
    // once rendered under docs/.
    for top in ["CONTRIBUTING.md", "CHANGELOG.md", "BENCHMARKS.md", "RELIABILITY.md"] {
        for target in link_targets(&read(&workspace_root().join(top))) {
            if !target.contains("://") && !target.starts_with('#') {
                problems.push(format!("{top} is included in the book: its relative link {target} would break there"));
            }
        }
    }
    assert!(problems.is_empty(), "{} broken links:\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn link_checker_finds_broken_links_and_anchors() {
    // The checker itself, on a page with one good and two broken links.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.md"), "# Title\n\n## The `x` part\n\ntext\n").expect("write");
    std::fs::write(
        dir.path().join("b.md"),
        "[ok](a.md#the-x-part) [gone](c.md) [no anchor](a.md#nope) `[code](d.md)`\n```\n[fenced](e.md)\n```\n",
    )
    .expect("write");
    let mut problems = Vec::new();
    check_links(&dir.path().join("b.md"), &mut problems);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("c.md") && problems[1].contains("#nope"), "{problems:?}");
}

/// The mdbook binary: on PATH or where `cargo install` puts it.
fn mdbook() -> PathBuf {
    let home = std::env::var("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cargo"));
    let installed = home.join("bin/mdbook");
    if installed.exists() {
        installed
    } else {
        PathBuf::from("mdbook")
    }
}

#[test]
fn mdbook_builds_every_page() {
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(mdbook())
        .args(["build", "--dest-dir"])
        .arg(out_dir.path())
        .arg(docs())
        .output()
        .expect("mdbook runs (scripts/test.sh installs it: cargo install --locked mdbook --no-default-features)");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "mdbook build docs failed:\n{said}");
    assert!(!said.contains("WARN") && !said.contains("ERROR"), "mdbook warned:\n{said}");
    for page in summary_pages() {
        let html = out_dir.path().join(page.replace(".md", ".html"));
        let text = read(&html);
        assert!(!text.contains("{{#include"), "{}: an include was not expanded", html.display());
    }
    // The included pages really carry their files' text.
    let bench = read(&out_dir.path().join("benchmarks.html"));
    assert!(bench.contains("Startline benchmarks"), "benchmarks.html holds BENCHMARKS.md");
    for img in ["dashboard-queue.png", "dashboard-slos.png", "dashboard-compare.png", "dashboard-goodput.png"] {
        assert!(out_dir.path().join("img").join(img).exists(), "img/{img} copied into the book");
    }
}

/// Dotted key paths of a JSON value (array elements merged, map entries under free-form tables skipped by the
/// caller's choice of which tables are maps).
fn key_paths(v: &serde_json::Value, prefix: &str, maps: &[&str], out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            if maps.contains(&prefix) {
                return;
            }
            for (k, v) in m {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                out.insert(path.clone());
                key_paths(v, &path, maps, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| key_paths(i, prefix, maps, out)),
        _ => {}
    }
}

/// The collector's configuration keys, from the code: the example configuration (which sets every optional table)
/// and the defaults, each validated and written back in full.
fn collector_config_keys() -> BTreeSet<String> {
    use startline_collector::config::FileConfig;
    let example = FileConfig::parse(&read(&workspace_root().join("deploy/collector.example.toml")))
        .expect("the example configuration parses");
    let mut keys = BTreeSet::new();
    // Tables whose keys are the user's (label names, alert names, header names), not settings.
    let maps = [
        "alerts.labels",
        "alerts.runbook_urls",
        "metrics.otlp_headers",
        "logs.otlp_headers",
        "alerts.alertmanager.headers",
        "alerts.webhook.headers",
    ];
    // Notifier tables: the example lists plain URLs, so one table of each kind with every optional part present.
    let mut tables = FileConfig::default();
    let table = startline_collector::alert::config::TargetSection {
        basic_auth: Some(Default::default()),
        ..Default::default()
    };
    tables.alerts.alertmanager = vec![startline_collector::alert::config::TargetEntry::Table(table.clone())];
    tables.alerts.webhook = vec![startline_collector::alert::config::TargetEntry::Table(table)];
    // Chain SLOs: the example defines none.
    tables.chain_slo = vec![Default::default()];
    // The history export: the example shows it commented out (it needs a bucket).
    tables.history.export = Some(Default::default());
    key_paths(&serde_json::to_value(&tables).expect("serialize"), "", &maps, &mut keys);
    for file in [example, FileConfig::default()] {
        // The example names credential files that exist only where it is deployed: the written form is enough.
        key_paths(&serde_json::to_value(&file).expect("serialize"), "", &maps, &mut keys);
        if let Ok(valid) = file.validate() {
            key_paths(&serde_json::to_value(valid.effective()).expect("serialize"), "", &maps, &mut keys);
        }
    }
    keys
}

/// Whether `key` (dotted) is documented in `text`: as `key` in backticks (or `[key]`, `[[key]]`), or split into a
/// table and the rest of the path, as the rest in backticks on a line that names the table (`table.`, `[table]`,
/// `[[table]]`, or `table` in backticks): `[[chain_slo]]` ... `selector.kind` documents `chain_slo.selector.kind`.
fn documented(text: &str, key: &str) -> bool {
    if text.contains(&format!("`{key}`"))
        || text.contains(&format!("`[{key}]`"))
        || text.contains(&format!("`[[{key}]]`"))
    {
        return true;
    }
    let parts: Vec<&str> = key.split('.').collect();
    (1..parts.len()).any(|cut| {
        let (table, rest) = (parts[..cut].join("."), parts[cut..].join("."));
        let rest_forms = [format!("`{rest}`"), format!("{rest}`"), format!("`{table}.{rest}")];
        let table_forms = [format!("`{table}."), format!("[{table}]"), format!("[[{table}]]"), format!("`{table}`")];
        text.lines().any(|l| rest_forms.iter().any(|f| l.contains(f)) && table_forms.iter().any(|f| l.contains(f)))
    })
}

#[test]
fn configuration_reference_names_every_collector_key() {
    let reference = read(&docs().join("configuration.md"));
    let keys = collector_config_keys();
    assert!(keys.len() > 150, "the key walk found only {} keys: {keys:?}", keys.len());
    for known in
        ["store.path", "auth.identity.token_hashes", "alerts.webhook.basic_auth.password_file", "slo.selector.timezone"]
    {
        assert!(keys.contains(known), "the key walk misses {known}");
    }
    let missing: Vec<_> = keys.iter().filter(|k| !documented(&reference, k)).collect();
    assert!(missing.is_empty(), "docs/configuration.md does not document {} keys: {missing:?}", missing.len());
    // The guard: a key nobody documented is noticed.
    assert!(!documented(&reference, "store.no_such_key"));
    // And the other way: every dotted key the reference's tables name exists (a removed or renamed key leaves
    // no stale row).
    let mut stale = Vec::new();
    for line in reference.lines().filter(|l| l.starts_with("| `")) {
        let first_cell = line.split('|').nth(1).unwrap_or_default();
        for token in first_cell.split('`').skip(1).step_by(2) {
            let is_key = token.contains('.')
                && token.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.');
            if is_key && !keys.iter().any(|k| k == token || k.ends_with(&format!(".{token}"))) {
                stale.push(token.to_string());
            }
        }
    }
    assert!(stale.is_empty(), "docs/configuration.md names keys the collector does not have: {stale:?}");
}

/// `(flags, environment variables)` that a `--help` text names.
fn flags_and_env(help: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut flags = BTreeSet::new();
    let mut env = BTreeSet::new();
    for line in help.lines() {
        let t = line.trim_start();
        if t.starts_with('-') {
            for word in t.split([' ', ',', '=', '<']) {
                if let Some(f) = word.strip_prefix("--") {
                    if !f.is_empty() && f != "help" && f != "version" {
                        flags.insert(format!("--{f}"));
                    }
                }
            }
        }
        let mut rest = line;
        while let Some(at) = rest.find("[env: ") {
            let name: String = rest[at + 6..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            env.insert(name);
            rest = &rest[at + 6..];
        }
    }
    (flags, env)
}

/// The subcommand names a `--help` lists under `Commands:`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect()
}

fn help(bin: &str, args: &[&str]) -> String {
    let out = Command::new(binary(bin)).args(args).arg("--help").output().expect("binary runs");
    assert!(out.status.success(), "{bin} {args:?} --help failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every (command path, help text) of a binary, subcommands of subcommands included.
fn command_tree(bin: &str) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    let mut stack = vec![Vec::<String>::new()];
    while let Some(path) = stack.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(bin, &args);
        for sub in subcommands(&text) {
            let mut p = path.clone();
            p.push(sub);
            stack.push(p);
        }
        out.push((path, text));
    }
    out
}

/// Environment variables the agent reads itself (outside clap): every upper-case name with an underscore passed
/// as a literal to `var(..)`, `var_os(..)` or `get(..)` (the environment map read once at start), outside tests.
fn env_reads(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).expect("source dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            env_reads(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tests.rs") {
            let text = read(&path);
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for pat in ["var(\"", "var_os(\"", "get(\""] {
                let mut rest = code;
                while let Some(at) = rest.find(pat) {
                    let name: String = rest[at + pat.len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    let closed = rest[at + pat.len() + name.len()..].starts_with("\")");
                    if closed && name.contains('_') && name.starts_with(|c: char| c.is_ascii_uppercase()) {
                        out.insert(name);
                    }
                    rest = &rest[at + pat.len()..];
                }
            }
        }
    }
}

#[test]
fn command_line_reference_names_every_flag_and_variable() {
    let cli = read(&docs().join("cli.md"));
    let book: String = summary_pages().iter().map(|p| expanded(&docs().join(p))).collect();
    let mut missing = Vec::new();
    for bin in ["startline-agent", "startline-collector"] {
        let tree = command_tree(bin);
        assert!(tree.len() > 5, "{bin}: only {} commands found", tree.len());
        for (path, text) in tree {
            let name = std::iter::once(bin.to_string()).chain(path.iter().cloned()).collect::<Vec<_>>().join(" ");
            if !cli.contains(&format!("`{name}`")) {
                missing.push(format!("command {name} (no heading `{name}` in docs/cli.md)"));
            }
            let (flags, env) = flags_and_env(&text);
            for f in flags {
                if !cli.contains(&f) {
                    missing.push(format!("{name} {f}"));
                }
            }
            for e in env {
                if !cli.contains(&e) {
                    missing.push(format!("{name}: variable {e}"));
                }
            }
        }
    }
    let mut reads = BTreeSet::new();
    env_reads(&workspace_root().join("agent/src"), &mut reads);
    assert!(reads.contains("NODE_NAME"), "the agent's own environment reads were found: {reads:?}");
    for e in reads {
        if !book.contains(&e) {
            missing.push(format!("variable {e}, read in agent/src, is not in the book"));
        }
    }
    assert!(
        missing.is_empty(),
        "not documented (run scripts/docs-cli.sh, then describe new variables in the book):\n{}",
        missing.join("\n")
    );
}

/// Alert names: the collector's (every `("alertname", "...")` it builds) and the shipped rules'.
fn alert_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let alert_src = read(&workspace_root().join("collector/src/alert/mod.rs"));
    let mut rest = alert_src.as_str();
    while let Some(at) = rest.find("(\"alertname\", \"") {
        let name: String = rest[at + 15..].chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        names.insert(name);
        rest = &rest[at + 15..];
    }
    assert!(names.len() >= 6, "the collector's alert names were found: {names:?}");
    for rules in ["deploy/prometheus/startline-rules.yml", "deploy/kubernetes/base/prometheusrule.yaml"] {
        for line in read(&workspace_root().join(rules)).lines() {
            if let Some(name) = line.trim().strip_prefix("- alert: ") {
                names.insert(name.trim().to_string());
            }
        }
    }
    names
}

/// Every file of the repository (as git tracks it) under `rel`.
fn tracked_files() -> Vec<PathBuf> {
    let out = Command::new("git").args(["ls-files"]).current_dir(workspace_root()).output().expect("git");
    String::from_utf8_lossy(&out.stdout).lines().map(|l| workspace_root().join(l)).collect()
}

#[test]
fn every_alert_has_a_runbook_and_every_runbook_url_reaches_one() {
    let runbooks = docs().join("runbooks.md");
    let ids = heading_ids(&read(&runbooks));
    let mut problems = Vec::new();
    let names = alert_names();
    for name in &names {
        if !ids.contains(&name.to_lowercase()) {
            problems.push(format!("alert {name} has no section `## {name}` in docs/runbooks.md"));
        }
    }
    // Every runbook_url in the repository that points into the book names an existing runbook.
    let mut urls = 0;
    for file in tracked_files() {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        for marker in ["runbooks.html#", "runbooks.md#"] {
            let mut rest = text.as_str();
            while let Some(at) = rest.find(marker) {
                let anchor: String = rest[at + marker.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                    .collect();
                urls += 1;
                if !anchor.is_empty() && !ids.contains(&anchor) {
                    problems.push(format!("{}: {marker}{anchor} names no runbook", file.display()));
                }
                rest = &rest[at + marker.len()..];
            }
        }
    }
    assert!(urls > 0, "no runbook links found in the repository");
    // The rules the collector generates with a runbook base carry a runbook_url for every alert, into this page.
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[alerts]\nrunbook_base_url = \"https://docs.example.com/startline/runbooks.html\"\n")
        .expect("write");
    let out =
        Command::new(binary("startline-collector")).args(["rules", "--config"]).arg(&cfg).output().expect("rules");
    assert!(out.status.success(), "rules: {}", String::from_utf8_lossy(&out.stderr));
    let rules = String::from_utf8_lossy(&out.stdout);
    let alerts = rules.matches("- alert: ").count();
    let linked: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("runbook_url: ")).collect();
    assert_eq!(linked.len(), alerts, "every generated alert carries a runbook_url:\n{rules}");
    for url in linked {
        let anchor = url.trim_matches('"').rsplit_once('#').map(|(_, a)| a).unwrap_or("");
        if !ids.contains(anchor) {
            problems.push(format!("generated rules: runbook_url {url} names no runbook"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Module names declared in a file (`mod x;` / `pub mod x;`).
fn declared_modules(src: &str) -> Vec<String> {
    src.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')).map(str::to_string)
        })
        .collect()
}

#[test]
fn module_maps_name_every_module() {
    let root = workspace_root();
    let mut problems = Vec::new();
    for lib in ["collector/src/lib.rs", "agent/src/lib.rs"] {
        let src = read(&root.join(lib));
        let doc: String = src.lines().filter(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
        let mods = declared_modules(&src);
        assert!(mods.len() > 8, "{lib}: modules found: {mods:?}");
        for m in mods {
            if !doc.contains(&format!("[`{m}`]")) {
                problems.push(format!("{lib}: the crate doc's layout does not name module `{m}`"));
            }
        }
    }
    // Each binary's doc names the modules of its own (`mod cli_docs;` and the like).
    for bin in ["collector/src/main.rs", "agent/src/main.rs"] {
        let src = read(&root.join(bin));
        let doc: String = src.lines().filter(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
        for m in declared_modules(&src) {
            if !doc.contains(&format!("[`{m}`]")) {
                problems.push(format!("{bin}: its doc does not name module `{m}`"));
            }
        }
    }
    let arch = read(&docs().join("ARCHITECTURE.md"));
    for (krate, lib) in [("collector", "collector/src/lib.rs"), ("agent", "agent/src/lib.rs")] {
        for m in declared_modules(&read(&root.join(lib))) {
            if !arch.contains(&format!("`{m}`")) {
                problems.push(format!("docs/ARCHITECTURE.md does not name the {krate} module `{m}`"));
            }
        }
    }
    // The agent binary's doc and ARCHITECTURE's agent picture name every mode the binary has.
    let main_doc: String =
        read(&root.join("agent/src/main.rs")).lines().filter(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
    let picture = arch.split("```").nth(1).unwrap_or_default().to_string();
    for mode in subcommands(&help("startline-agent", &[])) {
        if !main_doc.contains(&format!("`{mode}`")) {
            problems.push(format!("agent/src/main.rs: its doc does not name the mode `{mode}`"));
        }
        if !picture.contains(&mode) {
            problems.push(format!("docs/ARCHITECTURE.md: the agent picture does not show `{mode}`"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_screenshot_is_made_by_the_script_and_shown_in_the_book() {
    // The pictures come from scripts/docs-screenshots.sh (the demo in headless Chromium), never by hand, so a
    // picture the script does not make is stale by construction.
    let script = read(&workspace_root().join("scripts/docs-screenshots.sh"));
    let book: String = summary_pages().iter().map(|p| expanded(&docs().join(p))).collect();
    let mut pictures = 0;
    for entry in std::fs::read_dir(docs().join("img")).expect("docs/img").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        pictures += 1;
        assert!(script.contains(&format!(" {name}\n")), "docs/img/{name} is not made by scripts/docs-screenshots.sh");
        assert!(book.contains(&format!("img/{name}")), "docs/img/{name} is shown on no page of the book");
        let size = entry.metadata().expect("metadata").len();
        assert!(size > 20_000, "docs/img/{name} is {size} bytes: not a rendered dashboard view");
    }
    assert!(pictures >= 7, "one picture per dashboard view ({pictures})");
}

#[test]
fn api_reference_names_every_route_of_the_openapi_document() {
    // The OpenAPI document is generated from the router's route table; every operation in it has a row in the
    // book's API page (a path with its query example, or the bare path).
    let api = read(&docs().join("api.md"));
    let ops = startline_collector::api::openapi::operations();
    assert!(ops.len() > 15, "operations: {ops:?}");
    let missing: Vec<String> = ops
        .iter()
        .map(|(method, path)| format!("{} {path}", method.to_ascii_uppercase()))
        .filter(|op| !api.contains(&format!("`{op}`")) && !api.contains(&format!("`{op}?")))
        .collect();
    assert!(missing.is_empty(), "docs/api.md has no row for: {missing:?}");
}
