use super::config::{AuthSection, IdentitySection, TlsSection};
use super::*;

fn section(identities: Vec<IdentitySection>) -> AuthSection {
    AuthSection { insecure: None, metrics: None, max_open_jobs: None, identity: identities }
}

fn ident(name: &str, token: &str, scopes: &[&str]) -> IdentitySection {
    IdentitySection {
        name: Some(name.into()),
        token_hashes: vec![TokenHash::of(token).to_config()],
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn auth_of(s: &AuthSection) -> Auth {
    let mut errs = Vec::new();
    let cfg = s.validate(&mut errs, false);
    assert!(errs.is_empty(), "{errs:?}");
    Auth::new(cfg.keyring(), false, cfg.metrics_protected)
}

fn bearer_creds(h: &str) -> Credentials<'_> {
    Credentials { authorization: Some(h.as_bytes()), session: None, cert_names: &[] }
}

#[test]
fn token_hashes_round_trip_and_bad_ones_say_why() {
    let t = generate_token().expect("token");
    assert!(t.starts_with("stl_") && t.len() == 68, "{t}");
    assert_ne!(t, generate_token().expect("token"));
    let h = TokenHash::of(&t);
    assert_eq!(TokenHash::parse(&h.to_config()), Ok(h));
    // The known SHA-256 of "abc".
    assert_eq!(
        TokenHash::of("abc").to_config(),
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert!(TokenHash::parse("md5:00").expect_err("refused").contains("sha256:"));
    assert!(TokenHash::parse("sha256:abc").expect_err("refused").contains("64 expected"));
    assert!(TokenHash::parse(&format!("sha256:{}", "g".repeat(64))).expect_err("refused").contains("hex"));
}

#[test]
fn bearer_headers_parse_strictly() {
    assert_eq!(bearer(b"Bearer abc"), Some("abc"));
    assert_eq!(bearer(b"bearer   abc"), Some("abc"));
    assert_eq!(bearer(b"Basic abc"), None);
    assert_eq!(bearer(b"Bearer"), None);
    assert_eq!(bearer(b"Bearer "), None);
    assert_eq!(bearer(b"Bearer a b"), None);
    assert_eq!(bearer(b"Bearer \xff"), None);
    assert_eq!(bearer(format!("Bearer {}", "a".repeat(2000)).as_bytes()), None);
}

#[test]
fn without_identities_everyone_is_anonymous_with_every_scope() {
    let a = Auth::open();
    assert!(!a.required());
    let id = a.authorize(Credentials::default(), Scope::Admin).expect("open");
    assert_eq!(id.name, "anonymous");
    // Even a garbage header passes: there is nothing to check it against.
    assert!(a.authorize(bearer_creds("junk"), Scope::Ingest).is_ok());
}

#[test]
fn tokens_scopes_and_reloads_decide_every_request() {
    let s = section(vec![ident("reader", "tok-r", &["read"]), ident("boss", "tok-a", &["admin"])]);
    let a = auth_of(&s);
    assert_eq!(a.authorize(Credentials::default(), Scope::Read).expect_err("refused"), Denied::Missing);
    assert_eq!(a.authorize(bearer_creds("Token tok-r"), Scope::Read).expect_err("refused"), Denied::Malformed);
    assert_eq!(a.authorize(bearer_creds("Bearer nope"), Scope::Read).expect_err("refused"), Denied::Unknown);
    assert_eq!(a.authorize(bearer_creds("Bearer tok-r"), Scope::Read).expect("read").name, "reader");
    assert_eq!(
        a.authorize(bearer_creds("Bearer tok-r"), Scope::Ingest).expect_err("refused"),
        Denied::Scope { identity: "reader".into(), needed: Scope::Ingest }
    );
    // admin implies read, not ingest.
    assert!(a.authorize(bearer_creds("Bearer tok-a"), Scope::Read).is_ok());
    assert!(a.authorize(bearer_creds("Bearer tok-a"), Scope::Ingest).is_err());
    // A session resolves through the same keyring.
    let sess = Credentials { session: Some(TokenHash::of("tok-r")), ..Default::default() };
    assert!(a.authorize(sess, Scope::Read).is_ok());
    // Reload without "reader": its token and its sessions fail from the next request.
    let mut errs = Vec::new();
    let cfg = section(vec![ident("boss", "tok-a", &["admin"])]).validate(&mut errs, false);
    a.reload(cfg.keyring(), false, false);
    assert_eq!(a.authorize(bearer_creds("Bearer tok-r"), Scope::Read).expect_err("refused"), Denied::Unknown);
    assert_eq!(a.authorize(sess, Scope::Read).expect_err("refused"), Denied::Unknown);
    let counts: std::collections::HashMap<_, _> = a.stats.by_reason().into_iter().collect();
    assert_eq!(counts["missing"], 1);
    assert_eq!(counts["malformed"], 1);
    assert_eq!(counts["unknown"], 3);
    assert_eq!(counts["scope"], 2);
    // No refusal message carries a credential.
    for d in [Denied::Unknown, Denied::Malformed, Denied::Scope { identity: "reader".into(), needed: Scope::Read }] {
        assert!(!d.message().contains("tok-"), "{}", d.message());
    }
}

#[test]
fn certificate_names_prove_identities_and_tokens_win_over_them() {
    let mut s = section(vec![ident("reader", "tok-r", &["read"])]);
    s.identity.push(IdentitySection {
        name: Some("agent".into()),
        cert_names: vec!["agent.example".into(), "spiffe://example/agent".into()],
        scopes: vec!["ingest".into()],
        ..Default::default()
    });
    let mut errs = Vec::new();
    let cfg = s.validate(&mut errs, true);
    assert!(errs.is_empty(), "{errs:?}");
    let a = Auth::new(cfg.keyring(), false, false);
    let names = vec!["other".to_string(), "spiffe://example/agent".to_string()];
    let by_cert = Credentials { cert_names: &names, ..Default::default() };
    assert_eq!(a.authorize(by_cert, Scope::Ingest).expect("cert").name, "agent");
    let unknown = vec!["stranger".to_string()];
    assert_eq!(
        a.authorize(Credentials { cert_names: &unknown, ..Default::default() }, Scope::Ingest).expect_err("refused"),
        Denied::Unknown
    );
    let both = Credentials { authorization: Some(b"Bearer tok-r"), session: None, cert_names: &names };
    assert_eq!(a.authenticate(both).expect("token").name, "reader");
}

#[test]
fn events_outside_prefixes_or_sources_are_not_permitted() {
    let id = Identity {
        name: "a".into(),
        scopes: Scopes::default().with(Scope::Ingest),
        job_id_prefixes: vec!["slurm/cluster-a/".into()],
        sources: vec!["slurm-adapter/cluster-a".into()],
        node_prefixes: vec![],
        rate: None,
        events_per_day: None,
        max_open_jobs: 0,
    };
    assert_eq!(id.permits_event("slurm/cluster-a/1", "slurm-adapter/cluster-a"), Ok(()));
    assert_eq!(id.permits_event("slurm/cluster-b/1", "slurm-adapter/cluster-a"), Err("job_id"));
    assert_eq!(id.permits_event("slurm/cluster-a", "slurm-adapter/cluster-a"), Err("job_id"));
    assert_eq!(id.permits_event("slurm/cluster-a/1", "slurm-adapter/cluster-b"), Err("source"));
    assert_eq!(Identity::anonymous().permits_event("x", "y"), Ok(()));
}

#[test]
fn rate_limits_refuse_with_a_retry_hint_per_identity() {
    let mut s = section(vec![ident("slow", "t1", &["ingest"]), ident("fast", "t2", &["ingest"])]);
    s.identity[0].rate_per_second = Some(10.0);
    s.identity[0].burst = Some(10.0);
    let a = auth_of(&s);
    let slow = a.authorize(bearer_creds("Bearer t1"), Scope::Ingest).expect("slow");
    let fast = a.authorize(bearer_creds("Bearer t2"), Scope::Ingest).expect("fast");
    let t0 = Instant::now();
    assert!(a.take_at(&slow, 10, t0).is_ok());
    match a.take_at(&slow, 5, t0) {
        Err(Denied::RateLimited { identity, retry_after_ms }) => {
            assert_eq!(identity, "slow");
            assert_eq!(retry_after_ms, 500);
        }
        other => panic!("{other:?}"),
    }
    assert!(a.take_at(&fast, 1_000_000, t0).is_ok(), "no limit configured");
    assert_eq!(a.stats.rate_limited.load(Ordering::Relaxed), 1);
}

#[test]
fn config_errors_name_the_field() {
    let mut errs = Vec::new();
    let bad = section(vec![
        IdentitySection { name: Some("a b".into()), ..Default::default() },
        IdentitySection { name: Some("x".into()), scopes: vec!["write".into()], ..Default::default() },
        IdentitySection {
            name: Some("y".into()),
            token_hashes: vec!["plain-token".into()],
            cert_names: vec!["c.example".into()],
            scopes: vec!["read".into()],
            job_id_prefixes: vec![String::new()],
            rate_per_second: Some(-1.0),
            ..Default::default()
        },
    ]);
    bad.validate(&mut errs, false);
    let all = errs.join("\n");
    for needle in [
        "auth.identity[0].name",
        "auth.identity[1].scopes: \"write\"",
        "auth.identity[1] (x): needs token_hashes or cert_names",
        "auth.identity[2].token_hashes[0]",
        "auth.identity[2].cert_names: client certificates need tls.client_ca_file",
        "auth.identity[2].job_id_prefixes",
        "auth.identity[2].rate_per_second",
    ] {
        assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
    }
    let mut errs = Vec::new();
    let dup = section(vec![ident("a", "same", &["read"]), ident("a", "same", &["read"])]);
    dup.validate(&mut errs, false);
    assert!(errs.iter().any(|e| e.contains("used by another identity")), "{errs:?}");
    assert!(errs.iter().any(|e| e.contains("listed twice")), "{errs:?}");

    let mut errs = Vec::new();
    let tls = TlsSection { cert_file: Some("c".into()), client_certs: Some("always".into()), ..Default::default() };
    assert!(tls.validate(&mut errs).is_none());
    let all = errs.join("\n");
    assert!(all.contains("tls.key_file: is required") && all.contains("tls.client_certs: \"always\""), "{all}");
}

#[test]
fn listening_beyond_loopback_needs_identities_or_an_explicit_insecure() {
    let parse = |t: &str| crate::config::FileConfig::parse(t).expect("parses").validate();
    let e = parse("[grpc]\nlisten = \"0.0.0.0:50051\"\n").expect_err("exposed without auth");
    assert!(e.to_string().contains("grpc.listen: 0.0.0.0:50051 is reachable beyond this host"), "{e}");
    let e = parse("[http]\nlisten = \"[::]:8080\"\n").expect_err("exposed without auth");
    assert!(e.to_string().contains("http.listen"), "{e}");
    assert!(parse("[grpc]\nlisten = \"0.0.0.0:50051\"\n[auth]\ninsecure = true\n").is_ok());
    let with_id = format!(
        "[grpc]\nlisten = \"0.0.0.0:50051\"\n[[auth.identity]]\nname = \"a\"\ntoken_hashes = [\"{}\"]\nscopes = [\"ingest\"]\n",
        TokenHash::of("t").to_config()
    );
    assert!(parse(&with_id).is_ok());
    // Loopback needs nothing.
    assert!(parse("").is_ok());
}

#[test]
fn a_daily_quota_refuses_whole_batches_until_the_next_utc_day() {
    let mut s = section(vec![ident("q", "tq", &["ingest"])]);
    s.identity[0].events_per_day = Some(100);
    let a = auth_of(&s);
    let id = a.authorize(bearer_creds("Bearer tq"), Scope::Ingest).expect("q");
    let t0 = Instant::now();
    let day = 86_400_000u64;
    let noon = 20_000 * day + day / 2;
    assert!(a.take_events_at(&id, 60, t0, noon).is_ok());
    assert!(a.take_events_at(&id, 40, t0, noon + 1).is_ok());
    match a.take_events_at(&id, 1, t0, noon + 2) {
        Err(Denied::Quota { identity, retry_after_ms }) => {
            assert_eq!(identity, "q");
            assert_eq!(retry_after_ms, day / 2 - 2, "until the next UTC midnight");
        }
        other => panic!("{other:?}"),
    }
    // A refused batch takes nothing: the next day starts at zero.
    assert!(a.take_events_at(&id, 100, t0, 20_001 * day).is_ok());
    assert!(a.take_events_at(&id, 1, t0, 20_001 * day + 5).is_err());
    assert_eq!(a.stats.quota.load(Ordering::Relaxed), 2);
}

/// A held identity survives reloads that keep its token and scope (picking up the identity's new settings),
/// fails with `Unknown` once its token is gone and with `Scope` once the scope is; `revoked` wakes only then.
#[tokio::test]
async fn a_held_identity_is_proven_again_after_each_reload() {
    let keep = section(vec![ident("a", "tok-a", &["ingest", "read"]), ident("b", "tok-b", &["ingest"])]);
    let auth = Arc::new(auth_of(&keep));
    let header = "Bearer tok-a";
    let mut a = auth.hold(bearer_creds(header), Some(Scope::Ingest)).expect("a holds");
    let mut b = auth.hold(bearer_creds("Bearer tok-b"), Some(Scope::Ingest)).expect("b holds");
    assert_eq!(a.check().expect("a").name, "a");
    // A reload that keeps both, with a new rate for a: both keep going, a with its new settings.
    let mut changed = keep.clone();
    changed.identity[0].rate_per_second = Some(5.0);
    let reload = |s: &AuthSection| {
        let mut errs = Vec::new();
        let cfg = s.validate(&mut errs, false);
        assert!(errs.is_empty(), "{errs:?}");
        auth.reload(cfg.keyring(), false, false);
    };
    reload(&changed);
    assert!(a.check().expect("a kept").rate.is_some());
    let quiet = tokio::time::timeout(std::time::Duration::from_millis(50), b.revoked()).await;
    assert!(quiet.is_err(), "a reload that keeps b does not end it");
    // a's token is removed: a fails with Unknown (UNAUTHENTICATED); b is untouched.
    reload(&section(vec![ident("b", "tok-b", &["ingest"])]));
    let d = a.check().expect_err("a revoked");
    assert!(d.is_unauthenticated(), "{d:?}");
    assert_eq!(b.check().expect("b kept").name, "b");
    // b loses ingest: revoked() wakes with the scope refusal.
    let waiting = tokio::spawn(async move { b.revoked().await });
    tokio::task::yield_now().await;
    reload(&section(vec![ident("b", "tok-b", &["read"])]));
    let d = tokio::time::timeout(std::time::Duration::from_secs(5), waiting).await.expect("woken").expect("join");
    assert_eq!(d, Denied::Scope { identity: "b".into(), needed: Scope::Ingest });
    // Nothing counted as a request refusal: the calls' ends are counted by the calls.
    assert_eq!(auth.stats.by_reason().iter().map(|(_, n)| n).sum::<u64>(), 0);
}

/// `node_prefixes` reaches the identity; an empty prefix (which would permit every node) is a config error.
#[test]
fn node_prefixes_are_read_and_an_empty_one_is_refused() {
    let mut s = ident("a", "tok-a", &["ingest"]);
    s.node_prefixes = vec!["a-gpu-".into()];
    let auth = auth_of(&section(vec![s.clone()]));
    let id = auth.authorize(bearer_creds("Bearer tok-a"), Scope::Ingest).expect("a");
    assert!(id.permits_node("a-gpu-7") && !id.permits_node("b-gpu-7"));
    s.node_prefixes.push(String::new());
    let mut errs = Vec::new();
    section(vec![s]).validate(&mut errs, false);
    assert_eq!(
        errs,
        vec!["auth.identity[0].node_prefixes: an empty prefix permits every node; leave the list empty instead"]
    );
}

/// Prefixes no valid id can start with (ids follow the protocol's id rule) are config errors.
#[test]
fn prefixes_that_no_valid_id_can_match_are_refused() {
    let mut s = ident("a", "tok-a", &["ingest"]);
    s.job_id_prefixes = vec!["ok/".into(), "a/../".into(), "b//".into(), "c\u{3164}/".into(), "d/.".into()];
    s.node_prefixes = vec!["n\u{00A0}".into(), "gpu-".into()];
    let mut errs = Vec::new();
    section(vec![s]).validate(&mut errs, false);
    let fields: Vec<&str> = errs.iter().map(|e| e.split(':').next().unwrap_or("")).collect();
    assert_eq!(
        fields,
        [
            "auth.identity[0].job_id_prefixes",
            "auth.identity[0].job_id_prefixes",
            "auth.identity[0].job_id_prefixes",
            "auth.identity[0].node_prefixes"
        ],
        "{errs:?}"
    );
    assert!(errs[0].contains("\"a/../\""), "{errs:?}");
}
