//! Repository hygiene: the LICENSE is the Apache-2.0 text the manifests declare (compared with Debian's copy in
//! /usr/share/common-licenses), the workspace names no placeholder repository and publishes nothing, the
//! changelog has an unreleased section, no tracked file refers to this project's numbered work items (code and
//! docs say what the code does, not which ticket or work period brought it), and `cargo deny` accepts the
//! dependency graph (licenses, bans, sources; advisories against a local RustSec database when one exists, as
//! github.com is unreachable here).

use startline_tests::workspace_root;
use std::process::Command;

fn read(rel: &str) -> String {
    std::fs::read_to_string(workspace_root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn normalized(s: &str) -> Vec<String> {
    s.lines().map(|l| l.trim_end().to_string()).skip_while(String::is_empty).collect()
}

#[test]
fn license_is_the_full_apache_2_0_text() {
    let ours = read("LICENSE");
    let debian = std::fs::read_to_string("/usr/share/common-licenses/Apache-2.0")
        .expect("Debian's base-files ships /usr/share/common-licenses/Apache-2.0");
    assert_eq!(normalized(&ours), normalized(&debian), "LICENSE differs from the Apache License 2.0");
    let manifest = read("Cargo.toml");
    assert!(manifest.contains("license = \"Apache-2.0\""), "the workspace declares Apache-2.0");
}

#[test]
fn workspace_has_no_placeholder_repository_and_publishes_nothing() {
    let manifest = read("Cargo.toml");
    assert!(!manifest.contains("example.invalid"), "placeholder repository URL in Cargo.toml");
    for krate in ["proto", "collector", "agent", "tests"] {
        let m = read(&format!("{krate}/Cargo.toml"));
        assert!(m.contains("\npublish = false\n"), "{krate}/Cargo.toml: publish = false (shipped as binaries)");
        assert!(!m.contains("repository"), "{krate}/Cargo.toml names a repository");
    }
}

#[test]
fn changelog_has_an_unreleased_section_by_area() {
    let log = read("CHANGELOG.md");
    assert!(log.contains("\n## Unreleased\n"), "CHANGELOG.md has an Unreleased section for the next version");
    let areas = log.lines().filter(|l| l.starts_with("### ")).count();
    assert!(areas >= 10, "CHANGELOG.md groups its changes by area ({areas} sections)");
}

/// References to this project's numbered work items: the word issue, session, wave or work period (or their
/// plurals) followed by a number, or a number right after a `#` that starts a word. Upstream projects' issues are cited by their URL
/// (`github.com/owner/repo/issues/123`), which this does not match.
fn work_item_references(text: &str) -> Vec<String> {
    let words = ["issue", "issues", "session", "sessions", "wave", "waves", "work period", "work periods"];
    let lower = text.to_lowercase();
    let mut found = Vec::new();
    for (n, line) in lower.lines().enumerate() {
        for w in words {
            let mut rest = line;
            let mut offset = 0;
            while let Some(at) = rest.find(w) {
                let start = offset + at;
                let before_ok = start == 0 || !line.as_bytes()[start - 1].is_ascii_alphanumeric();
                let after = &line[start + w.len()..];
                let num = after.strip_prefix(' ').map(|a| a.strip_prefix('#').unwrap_or(a));
                if before_ok && num.is_some_and(|a| a.starts_with(|c: char| c.is_ascii_digit())) {
                    found.push(format!("line {}: {}", n + 1, line.trim()));
                }
                offset = start + w.len();
                rest = &line[offset..];
            }
        }
        let bytes = line.as_bytes();
        for (i, b) in bytes.iter().enumerate() {
            if *b == b'#'
                && (i == 0 || bytes[i - 1] == b' ' || bytes[i - 1] == b'(')
                && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)
            {
                let digits = bytes[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                if digits <= 4 && !bytes.get(i + 1 + digits).is_some_and(|c| c.is_ascii_alphanumeric()) {
                    found.push(format!("line {}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn no_tracked_file_refers_to_numbered_work_items() {
    let out = Command::new("git").args(["ls-files", "-z"]).current_dir(workspace_root()).output().expect("git");
    assert!(out.status.success(), "git ls-files");
    let files: Vec<String> = out
        .stdout
        .split(|b| *b == 0)
        .filter(|f| !f.is_empty())
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    assert!(files.len() > 100, "tracked files: {}", files.len());
    let mut problems = Vec::new();
    for file in &files {
        // The lock file names crates; binary files are not prose.
        if file == "Cargo.lock" {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(workspace_root().join(file)) else { continue };
        for hit in work_item_references(&text) {
            problems.push(format!("{file}: {hit}"));
        }
    }
    assert!(
        problems.is_empty(),
        "say what the code does and why instead of naming a work item ({} places):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn work_item_references_are_recognized_and_upstream_issue_links_are_not() {
    let text = concat!(
        // Split so that this file does not match itself.
        "fixed in Iss",
        "ue 12\n",
        "see (#",
        "33) and #",
        "7.\n",
        "measured in sess",
        "ion 20 and Wa",
        "ve 3\n",
        "upstream: https://github.com/spacejam/sled/issues/1351\n",
        "stroke=\"#888\" tissue 5 issues: 3 open; run 19; #[derive(Debug)]\n",
    );
    let hits = work_item_references(text);
    assert_eq!(hits.len(), 5, "{hits:?}");
    assert!(hits.iter().all(|h| !h.contains("github.com") && !h.contains("#888")), "{hits:?}");
}

fn cargo_deny(args: &[&str]) -> (bool, String) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo).arg("deny").args(args).current_dir(workspace_root()).output().expect("cargo");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !said.contains("no such command"),
        "cargo-deny is not installed: cargo install --locked cargo-deny (scripts/test.sh does)"
    );
    (out.status.success(), said)
}

#[test]
fn cargo_deny_accepts_licenses_bans_and_sources() {
    let (ok, said) = cargo_deny(&["--locked", "check", "licenses", "bans", "sources"]);
    assert!(ok, "cargo deny check licenses bans sources failed:\n{said}");
    // The guard: the same graph with no license allowed fails, so the check above really looked.
    let dir = tempfile::tempdir().expect("tempdir");
    let strict = dir.path().join("deny.toml");
    std::fs::write(&strict, "[licenses]\nallow = []\n[licenses.private]\nignore = true\n").expect("write");
    let (ok, said) = cargo_deny(&["--locked", "--config", strict.to_str().expect("utf-8"), "check", "licenses"]);
    assert!(!ok && said.contains("rejected"), "an empty license allow-list must reject crates:\n{said}");
}

#[test]
fn cargo_deny_advisories_against_a_local_database() {
    let home = std::env::var("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cargo"));
    let dbs = home.join("advisory-dbs");
    // A database is a directory (`advisory-db-<hash>`); cargo-deny's other checks leave a bare `db.lock` here.
    let has_db = std::fs::read_dir(&dbs).is_ok_and(|d| {
        d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("advisory-db") && e.path().is_dir())
    });
    if !has_db {
        // The RustSec database is cloned from github.com, which these machines cannot reach; the accepted
        // advisories in deny.toml were checked against a copy when they were written.
        println!("no RustSec database under {}: advisories not checked here", dbs.display());
        return;
    }
    let (ok, said) = cargo_deny(&["--offline", "--locked", "check", "advisories"]);
    assert!(ok, "cargo deny check advisories (local database in {}):\n{said}", dbs.display());
}
