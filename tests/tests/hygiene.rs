//! Repository hygiene: the LICENSE is the Apache-2.0 text the manifests declare (compared with Debian's copy in
//! /usr/share/common-licenses), the workspace names no placeholder repository and publishes nothing, the
//! changelog covers every issue that shipped, and `cargo deny` accepts the dependency graph (licenses, bans,
//! sources; advisories against a local RustSec database when one exists, as github.com is unreachable here).

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
fn changelog_covers_every_shipped_issue() {
    let log = read("CHANGELOG.md");
    for issue in [2, 3, 4, 5, 8, 9, 10, 11] {
        assert!(log.contains(&format!("(issue {issue}")), "CHANGELOG.md has no section for issue {issue}");
    }
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
