//! The Rust the project says it needs is the Rust it really needs. The workspace's `rust-version` (Cargo.toml
//! `[workspace.package]`) must be at least every locked package's `rust_version` (as `cargo metadata --locked`
//! reports them, over the whole resolve), the container's builder image (`ARG RUST_IMAGE` in
//! deploy/Containerfile) must be that Rust's major.minor, and a `rust-toolchain.toml` / `rust-toolchain` file, if
//! one is added, must not pin another version. A dependency update that raises its minimum fails here, naming
//! the packages, instead of failing for whoever builds with the declared toolchain.

use startline_tests::workspace_root;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A Rust version as major.minor.patch; missing parts are 0 (`1.88` is `1.88.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Version([u64; 3]);

impl Version {
    /// `1`, `1.88` or `1.88.0`; anything else (a pre-release, a channel name, a fourth part) is `None`.
    fn parse(s: &str) -> Option<Version> {
        let mut parts = [0u64; 3];
        for (n, p) in s.trim().split('.').enumerate() {
            if n == 3 || p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            parts[n] = p.parse().ok()?;
        }
        Some(Version(parts))
    }

    fn major_minor(self) -> (u64, u64) {
        (self.0[0], self.0[1])
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0[0], self.0[1], self.0[2])
    }
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(workspace_root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The string value of `key = "..."` in `[section]` of a TOML file (one key per line, as the manifests write it).
fn toml_string(text: &str, section: &str, key: &str) -> Option<String> {
    let mut in_section = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line == format!("[{section}]");
            continue;
        }
        if !in_section {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else { continue };
        if k.trim() == key {
            let v = v.split('#').next().unwrap_or_default().trim();
            return Some(v.trim_matches('"').to_string());
        }
    }
    None
}

/// `[workspace.package] rust-version` of the workspace's Cargo.toml, as written and parsed.
fn declared() -> (String, Version) {
    let raw = toml_string(&read("Cargo.toml"), "workspace.package", "rust-version")
        .expect("Cargo.toml: [workspace.package] declares rust-version");
    let version = Version::parse(&raw).unwrap_or_else(|| panic!("Cargo.toml: rust-version = {raw:?} is not a version"));
    (raw, version)
}

fn metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(workspace_root())
        .output()
        .expect("run cargo metadata");
    assert!(out.status.success(), "cargo metadata --locked: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// The packages of the resolve (every locked package this workspace uses): (name, version, rust_version).
fn resolved_packages(meta: &serde_json::Value) -> Vec<(String, String, Option<String>)> {
    let nodes = meta["resolve"]["nodes"].as_array().expect("cargo metadata: resolve.nodes");
    let ids: std::collections::HashSet<&str> = nodes.iter().map(|n| n["id"].as_str().expect("node id")).collect();
    let packages: Vec<_> = meta["packages"]
        .as_array()
        .expect("cargo metadata: packages")
        .iter()
        .filter(|p| ids.contains(p["id"].as_str().expect("package id")))
        .map(|p| {
            let s = |k: &str| p[k].as_str().map(str::to_string);
            (s("name").expect("package name"), s("version").expect("package version"), s("rust_version"))
        })
        .collect();
    assert_eq!(packages.len(), ids.len(), "every resolve node is a package of cargo metadata");
    packages
}

#[test]
fn every_locked_package_builds_with_the_declared_rust_version() {
    let (raw_declared, declared) = declared();
    let meta = metadata();
    let packages = resolved_packages(&meta);
    assert!(packages.len() > 100, "the resolve holds the whole dependency tree: {} packages", packages.len());
    let mut newer: Vec<(Version, String)> = Vec::new();
    for (name, version, rust_version) in &packages {
        let Some(raw) = rust_version else { continue };
        let needs = Version::parse(raw).unwrap_or_else(|| panic!("{name} {version}: rust_version {raw:?}"));
        if needs > declared {
            newer.push((needs, format!("{name} {version} (rust_version {raw})")));
        }
    }
    newer.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let highest = newer.first().map_or(declared, |n| n.0);
    assert!(
        newer.is_empty(),
        "Cargo.toml declares rust-version = \"{raw_declared}\", but {} locked package(s) need a newer Rust; declare at \
         least {}.{} (and the same in deploy/Containerfile's RUST_IMAGE):\n  {}",
        newer.len(),
        highest.0[0],
        highest.0[1],
        newer.iter().map(|n| n.1.as_str()).collect::<Vec<_>>().join("\n  ")
    );
    // The members inherit the workspace's rust-version (`rust-version.workspace = true`); none declares its own.
    let members = meta["workspace_members"].as_array().expect("workspace_members");
    let members: Vec<&str> = members.iter().map(|m| m.as_str().expect("member id")).collect();
    for p in meta["packages"].as_array().expect("packages") {
        if members.contains(&p["id"].as_str().expect("id")) {
            let name = p["name"].as_str().expect("name");
            let own = p["rust_version"].as_str().and_then(Version::parse);
            assert_eq!(own, Some(declared), "{name}: rust-version.workspace = true");
        }
    }
}

/// The version in the tag of `ARG RUST_IMAGE=registry/library/rust:1.88-bookworm`: `1.88`.
fn containerfile_rust_image_tag(containerfile: &str) -> (String, Option<Version>) {
    let image = containerfile
        .lines()
        .find_map(|l| l.trim().strip_prefix("ARG RUST_IMAGE="))
        .expect("deploy/Containerfile: ARG RUST_IMAGE=<image> (the builder's default)")
        .trim()
        .to_string();
    let (_, tag) = image.rsplit_once(':').unwrap_or_else(|| panic!("RUST_IMAGE {image} has no tag"));
    let version = tag.split_once('-').map_or(tag, |(v, _)| v);
    let parsed = (version.split('.').count() == 2).then(|| Version::parse(version)).flatten();
    (image, parsed)
}

#[test]
fn container_builder_image_is_the_declared_rust_version() {
    let (raw_declared, declared) = declared();
    let containerfile = read("deploy/Containerfile");
    assert!(containerfile.contains("FROM ${RUST_IMAGE} AS builder"), "the builder stage is FROM ${{RUST_IMAGE}}");
    let (image, tag) = containerfile_rust_image_tag(&containerfile);
    let tag = tag.unwrap_or_else(|| panic!("RUST_IMAGE {image}: the tag starts with MAJOR.MINOR (rust:1.88-bookworm)"));
    let (major, minor) = declared.major_minor();
    assert_eq!(
        tag.major_minor(),
        declared.major_minor(),
        "deploy/Containerfile builds with {image}, but Cargo.toml declares rust-version = \"{raw_declared}\": use \
         rust:{major}.{minor}-bookworm"
    );
}

/// The pinned version of a rust-toolchain file's channel, `Ok(None)` when it names no version (`stable`, a
/// nightly) or has no channel. Either form: TOML (`[toolchain] channel = "1.88"`) or the legacy bare channel.
fn toolchain_file_channel(text: &str) -> Result<Option<Version>, String> {
    let channel = if text.contains("[toolchain]") {
        match toml_string(text, "toolchain", "channel") {
            Some(c) => c,
            None => return Ok(None),
        }
    } else {
        text.trim().to_string()
    };
    // `1.88`, `1.88.0`, or with a host triple: `1.88.0-x86_64-unknown-linux-gnu`.
    let version = channel.split_once('-').map_or(channel.as_str(), |(v, _)| v);
    if version.starts_with(|c: char| c.is_ascii_digit()) {
        Version::parse(version).map(Some).ok_or_else(|| format!("channel {channel:?} is not a version"))
    } else {
        Ok(None)
    }
}

/// Does a toolchain pinned at `pinned` agree with `declared`: same major.minor, and not an older patch.
fn toolchain_agrees(pinned: Version, declared: Version) -> bool {
    pinned.major_minor() == declared.major_minor() && pinned >= declared
}

#[test]
fn rust_toolchain_files_agree_with_the_declared_rust_version() {
    let (raw_declared, declared) = declared();
    // rustup reads the file from the directory cargo runs in or any parent: the root and every member.
    let meta = metadata();
    let mut dirs: Vec<PathBuf> = vec![workspace_root()];
    let members = meta["workspace_members"].as_array().expect("workspace_members");
    for p in meta["packages"].as_array().expect("packages") {
        if members.contains(&p["id"]) {
            let manifest = Path::new(p["manifest_path"].as_str().expect("manifest_path"));
            dirs.push(manifest.parent().expect("package dir").to_path_buf());
        }
    }
    assert!(dirs.len() >= 5, "the root and the four members: {dirs:?}");
    let mut disagree = Vec::new();
    for dir in &dirs {
        for name in ["rust-toolchain.toml", "rust-toolchain"] {
            let path = dir.join(name);
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            match toolchain_file_channel(&text) {
                Ok(Some(pinned)) if !toolchain_agrees(pinned, declared) => {
                    disagree.push(format!("{} pins {pinned}", path.display()))
                }
                Ok(_) => {}
                Err(e) => disagree.push(format!("{}: {e}", path.display())),
            }
        }
    }
    assert!(
        disagree.is_empty(),
        "Cargo.toml declares rust-version = \"{raw_declared}\", but:\n  {}",
        disagree.join("\n  ")
    );
}

#[test]
fn versions_and_toolchain_files_parse_as_cargo_and_rustup_read_them() {
    let v = |s: &str| Version::parse(s).unwrap_or_else(|| panic!("{s}"));
    assert_eq!(v("1.88"), v("1.88.0"));
    assert_eq!(v("1"), Version([1, 0, 0]));
    assert!(v("1.88") > v("1.85.1") && v("1.100") > v("1.88") && v("1.88.1") > v("1.88"));
    for bad in ["", "1.", "1.88.0.1", "1.88-beta", "stable", "1.x"] {
        assert_eq!(Version::parse(bad), None, "{bad:?}");
    }

    let (_, tag) = containerfile_rust_image_tag("ARG RUST_IMAGE=mirror.local:5000/library/rust:1.88-bookworm\n");
    assert_eq!(tag, Some(v("1.88")));
    let (_, tag) = containerfile_rust_image_tag("ARG RUST_IMAGE=docker.io/library/rust:latest\n");
    assert_eq!(tag, None);

    let channel = |s: &str| toolchain_file_channel(s).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(channel("[toolchain]\nchannel = \"1.88\"\ncomponents = [\"clippy\"]\n"), Some(v("1.88")));
    assert_eq!(channel("[toolchain]\nchannel = \"1.90.0\" # pinned\n"), Some(v("1.90")));
    assert_eq!(channel("1.85.0-x86_64-unknown-linux-gnu\n"), Some(v("1.85")));
    assert_eq!(channel("stable\n"), None);
    assert_eq!(channel("[toolchain]\ncomponents = [\"rustfmt\"]\n"), None);
    assert!(toolchain_file_channel("[toolchain]\nchannel = \"1.88.x\"\n").is_err());

    assert!(toolchain_agrees(v("1.88"), v("1.88")) && toolchain_agrees(v("1.88.1"), v("1.88")));
    assert!(!toolchain_agrees(v("1.85"), v("1.88")) && !toolchain_agrees(v("1.90"), v("1.88")));
    assert!(!toolchain_agrees(v("1.88.0"), v("1.88.1")));
}
