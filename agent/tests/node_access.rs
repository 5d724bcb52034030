//! The node agent's hardened endpoint, in process through the router and over a real unix socket:
//! content type, Host and Origin, the local token, the stamped source, the job allow-list, per-client quotas,
//! the socket's mode and peer credentials, and `emit`'s client over TCP and the socket.

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use startline_agent::access::{bind_socket, Access, JobAllowList, LocalToken, PeerCred};
use startline_agent::auth::Secret;
use startline_agent::emit::{post_with_retry, Client, PostError, Target};
use startline_agent::node::{router, MonotonicWall, NodeState};
use startline_agent::spool::{ClientQuota, Spool, SpoolLimits};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

const SOURCE: &str = "node-agent/test-node";

fn node(dir: &std::path::Path, configure: impl FnOnce(&mut Access)) -> (NodeState, Spool) {
    let limits = SpoolLimits { max_events: 100, max_bytes: 1 << 20 };
    let spool = Spool::open(dir, limits).expect("spool");
    let mut access = Access::open(limits);
    configure(&mut access);
    let state = NodeState {
        clock: MonotonicWall::start(),
        spool: spool.clone(),
        source: SOURCE.into(),
        limits: startline_proto::Limits::default(),
        access: Arc::new(access),
        metrics: startline_agent::metrics::Metrics::new("node").expect("metrics"),
    };
    (state, spool)
}

fn first_step(job: &str) -> String {
    json!({"kind": "first_step", "job_id": job, "step": 1}).to_string()
}

/// A POST to `/v1/events` with JSON content type and `Host: localhost:7465`, changed by `edit`.
fn post(body: String, edit: impl FnOnce(&mut Request<Body>)) -> Request<Body> {
    let mut req = Request::post("/v1/events")
        .header(header::HOST, "localhost:7465")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("request");
    edit(&mut req);
    req
}

async fn send(state: &NodeState, req: Request<Body>) -> (StatusCode, Value, HeaderMap) {
    let resp = router(state.clone()).oneshot(req).await.expect("response");
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("{status}: not JSON: {bytes:?}"));
    (status, v, headers)
}

fn set(req: &mut Request<Body>, name: header::HeaderName, value: &str) {
    req.headers_mut().insert(name, value.parse().expect("header value"));
}

#[tokio::test]
async fn only_json_bodies_are_accepted_others_get_415() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (state, spool) = node(dir.path(), |_| {});
    for ct in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
        let (status, v, _) = send(&state, post(first_step("j/1"), |r| set(r, header::CONTENT_TYPE, ct))).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct}");
        assert!(v["error"].as_str().expect("error").contains("application/json"), "{v}");
    }
    let (status, ..) =
        send(&state, post(first_step("j/1"), |r| drop(r.headers_mut().remove(header::CONTENT_TYPE)))).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "no content type");
    assert_eq!(spool.len(), 0);
    let (status, ..) =
        send(&state, post(first_step("j/1"), |r| set(r, header::CONTENT_TYPE, "application/json; charset=utf-8")))
            .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(spool.len(), 1);
}

#[tokio::test]
async fn foreign_hosts_and_cross_origin_requests_get_403() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (state, spool) = node(dir.path(), |a| a.listen_hosts = vec!["10.0.0.7:7465".into()]);
    for host in ["evil.example", "evil.example:7465", "127.0.0.1.nip.io:7465"] {
        let (status, v, _) = send(&state, post(first_step("j/1"), |r| set(r, header::HOST, host))).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{host}");
        assert!(v["error"].as_str().expect("error").contains("Host"), "{v}");
    }
    let (status, ..) = send(
        &state,
        post(first_step("j/1"), |r| {
            set(r, header::ORIGIN, "http://evil.example");
        }),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "cross-origin");
    let (status, ..) = send(&state, post(first_step("j/1"), |r| set(r, header::ORIGIN, "null"))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "opaque origin");
    // The status route is guarded too; /healthz is not.
    let get =
        |path: &str, host: &str| Request::get(path).header(header::HOST, host).body(Body::empty()).expect("request");
    assert_eq!(send(&state, get("/v1/spool", "evil.example")).await.0, StatusCode::FORBIDDEN);
    assert_eq!(send(&state, get("/healthz", "evil.example")).await.0, StatusCode::OK);
    assert_eq!(spool.len(), 0);

    for (host, origin) in [
        ("localhost:7465", Some("http://localhost:7465")),
        ("127.0.0.1:7465", None),
        ("[::1]:7465", None),
        ("10.0.0.7:7465", Some("http://10.0.0.7:7465")),
    ] {
        let (status, ..) = send(
            &state,
            post(first_step("j/1"), |r| {
                set(r, header::HOST, host);
                if let Some(o) = origin {
                    set(r, header::ORIGIN, o);
                }
            }),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{host} {origin:?}");
    }
}

#[tokio::test]
async fn with_a_local_token_posts_without_the_right_bearer_get_401() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (state, spool) = node(dir.path(), |a| a.local_token = Some(LocalToken::Fixed(Secret::new("stl_local_right"))));
    let (status, v, headers) = send(&state, post(first_step("j/1"), |_| {})).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "missing");
    assert_eq!(headers.get(header::WWW_AUTHENTICATE).and_then(|h| h.to_str().ok()), Some("Bearer"));
    assert!(!v.to_string().contains("stl_local"), "no token in the answer: {v}");
    for wrong in ["Bearer stl_local_wrong", "Bearer stl_local_righ", "Basic c3RsX2xvY2FsX3JpZ2h0", "stl_local_right"] {
        let (status, v, _) = send(&state, post(first_step("j/1"), |r| set(r, header::AUTHORIZATION, wrong))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{wrong}");
        assert!(!v.to_string().contains("stl_local"), "no token in the answer: {v}");
    }
    assert_eq!(spool.len(), 0);
    let (status, ..) =
        send(&state, post(first_step("j/1"), |r| set(r, header::AUTHORIZATION, "Bearer stl_local_right"))).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(spool.len(), 1);
}

#[tokio::test]
async fn a_rotated_local_token_file_applies_at_once_and_a_removed_one_refuses_everything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("local-token");
    std::fs::write(&file, "stl_first\n").expect("token");
    let token = LocalToken::file(file.clone()).expect("token file");
    let (state, spool) = node(&dir.path().join("spool"), |a| a.local_token = Some(token));
    let with = |t: &'static str| post(first_step("j/1"), move |r| set(r, header::AUTHORIZATION, t));
    assert_eq!(send(&state, with("Bearer stl_first")).await.0, StatusCode::ACCEPTED);
    // Rotate by rename (a new inode), as a secret manager does.
    let next = dir.path().join("local-token.new");
    std::fs::write(&next, "stl_second_token\n").expect("token");
    std::fs::rename(&next, &file).expect("rotate");
    assert_eq!(send(&state, with("Bearer stl_first")).await.0, StatusCode::UNAUTHORIZED, "the old token still works");
    assert_eq!(send(&state, with("Bearer stl_second_token")).await.0, StatusCode::ACCEPTED);
    // Removed or emptied: fail closed.
    std::fs::write(&file, "").expect("empty");
    assert_eq!(send(&state, with("Bearer stl_second_token")).await.0, StatusCode::UNAUTHORIZED);
    std::fs::remove_file(&file).expect("remove");
    assert_eq!(send(&state, with("Bearer stl_second_token")).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(spool.len(), 2);
}

#[tokio::test]
async fn the_agent_stamps_source_and_refuses_a_client_supplied_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (state, spool) = node(dir.path(), |_| {});
    let forged = json!({"kind": "done", "job_id": "slurm/cluster-a/424242", "outcome": "succeeded",
                        "source": "slurm-adapter/cluster-a"});
    let (status, v, _) = send(&state, post(forged.to_string(), |_| {})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["field"], "events[0].source");
    let batch = json!({"events": [{"kind": "first_step", "job_id": "j/1", "step": 1},
                                  {"kind": "checkpoint", "job_id": "j/1", "step": 2, "source": SOURCE}]});
    let (status, v, _) = send(&state, post(batch.to_string(), |_| {})).await;
    assert_eq!((status, v["field"].clone()), (StatusCode::BAD_REQUEST, json!("events[1].source")), "even our own");
    assert_eq!(spool.len(), 0, "all or nothing");

    let (status, ..) = send(&state, post(first_step("j/1"), |_| {})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let spooled = spool.oldest(10).expect("oldest");
    assert_eq!(spooled.len(), 1);
    assert_eq!(spooled[0].1.source, SOURCE);
}

#[tokio::test]
async fn a_job_restriction_refuses_other_jobs_with_403_and_follows_the_allow_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let allow_file = dir.path().join("allowed-jobs");
    let (state, spool) = node(&dir.path().join("spool"), |a| {
        a.jobs = Some(JobAllowList::new(["slurm/c1/1".to_string()], Some(allow_file.clone())));
    });
    let status_of = |job: &'static str| {
        let state = state.clone();
        async move {
            let (status, v, _) = send(&state, post(first_step(job), |_| {})).await;
            (status, v)
        }
    };
    assert_eq!(status_of("slurm/c1/1").await.0, StatusCode::ACCEPTED, "a fixed id");
    let (status, v) = status_of("slurm/c1/2").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "the file does not exist yet");
    assert_eq!(v["field"], "events[0].job_id");
    assert!(v["error"].as_str().expect("error").contains("not permitted"), "{v}");

    std::fs::write(&allow_file, "# written by the prolog\nslurm/c1/2\n").expect("write");
    assert_eq!(status_of("slurm/c1/2").await.0, StatusCode::ACCEPTED, "listed in the file");
    assert_eq!(status_of("slurm/c1/3").await.0, StatusCode::FORBIDDEN);

    // The prolog of the next job replaces the file (write + rename: a new inode).
    let next = dir.path().join("allowed-jobs.new");
    std::fs::write(&next, "slurm/c1/3\n").expect("write");
    std::fs::rename(&next, &allow_file).expect("rename");
    assert_eq!(status_of("slurm/c1/3").await.0, StatusCode::ACCEPTED, "the new job");
    assert_eq!(status_of("slurm/c1/2").await.0, StatusCode::FORBIDDEN, "the ended job");

    let held = spool.len();
    let batch = json!({"events": [{"kind": "first_step", "job_id": "slurm/c1/3", "step": 1},
                                  {"kind": "first_step", "job_id": "slurm/c1/9", "step": 1}]});
    let (status, v, _) = send(&state, post(batch.to_string(), |_| {})).await;
    assert_eq!((status, v["field"].clone()), (StatusCode::FORBIDDEN, json!("events[1].job_id")));
    assert_eq!(spool.len(), held, "a refused batch spools nothing");
}

#[tokio::test]
async fn a_client_over_its_quota_gets_429_while_other_clients_are_accepted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (state, spool) = node(dir.path(), |a| a.client_quota = ClientQuota { max_events: 3, max_bytes: 1 << 20 });
    let as_uid = |uid: u32| {
        move |r: &mut Request<Body>| {
            r.extensions_mut().insert(ConnectInfo(PeerCred { uid: Some(uid), gid: Some(uid), pid: Some(1) }));
        }
    };
    let flood = json!({"events": (0..3).map(|i| json!({"kind": "checkpoint", "job_id": "j/noise", "step": i}))
        .collect::<Vec<_>>()});
    assert_eq!(send(&state, post(flood.to_string(), as_uid(65534))).await.0, StatusCode::ACCEPTED);
    let (status, v, headers) = send(&state, post(first_step("j/noise"), as_uid(65534))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(v["error"].as_str().expect("error").contains("quota"), "{v}");
    assert_eq!(headers.get(header::RETRY_AFTER).and_then(|h| h.to_str().ok()), Some("5"));

    // Another local user's job, and loopback TCP, still get their events in.
    assert_eq!(send(&state, post(first_step("j/own"), as_uid(1000))).await.0, StatusCode::ACCEPTED);
    assert_eq!(send(&state, post(first_step("j/tcp"), |_| {})).await.0, StatusCode::ACCEPTED);
    assert_eq!(spool.held_by("uid:65534").events, 3);
    assert_eq!(spool.held_by("uid:1000").events, 1);
    assert_eq!(spool.held_by("tcp").events, 1);

    // Delivery releases the quota.
    let oldest = spool.oldest(1).expect("oldest")[0].0;
    spool.remove_through(oldest).expect("delivered");
    assert_eq!(send(&state, post(first_step("j/noise"), as_uid(65534))).await.0, StatusCode::ACCEPTED);
}

/// Serves the node agent's router on a unix socket, as `startline-agent node --socket` does.
fn serve_socket(listener: tokio::net::UnixListener, state: NodeState) -> tokio::task::JoinHandle<()> {
    let app = router(state).into_make_service_with_connect_info::<PeerCred>();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    })
}

#[tokio::test]
async fn the_socket_is_0660_knows_its_peer_and_takes_emit_posts_with_the_local_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let probe = dir.path().join("probe");
    std::fs::write(&probe, "").expect("probe");
    let (my_uid, my_gid) = {
        let m = std::fs::metadata(&probe).expect("metadata");
        (m.uid(), m.gid())
    };
    let path = dir.path().join("agent.sock");
    let (state, spool) =
        node(&dir.path().join("spool"), |a| a.local_token = Some(LocalToken::Fixed(Secret::new("stl_socket_token"))));
    let listener = bind_socket(&path, Some(my_gid)).expect("bind");
    let meta = std::fs::metadata(&path).expect("socket metadata");
    assert_eq!(meta.permissions().mode() & 0o777, 0o660, "socket mode");
    assert_eq!(meta.gid(), my_gid, "socket group");
    assert!(
        matches!(bind_socket(&path, None), Err(startline_agent::access::SocketError::InUse(_))),
        "a live socket is not taken over"
    );
    let server = serve_socket(listener, state.clone());

    let payload =
        startline_agent::node::emit_body("first_step", "j/socket", &[], None, startline_proto::time::now_ms())
            .expect("body")
            .to_string();
    let no_token = Client::new(Target::Socket(path.clone()), None).expect("client");
    match post_with_retry(&no_token, &payload, Duration::from_secs(5), |_, _| {}).await {
        Err(PostError::Refused { status: 401, body }) => assert!(!body.contains("stl_socket"), "{body}"),
        other => panic!("without the token: {other:?}"),
    }
    let wrong = Client::new(Target::Socket(path.clone()), Some(Secret::new("stl_wrong"))).expect("client");
    assert!(matches!(wrong.post_once(&payload).await, Ok(a) if a.status == 401));
    let right = Client::new(Target::Socket(path.clone()), Some(Secret::new("stl_socket_token"))).expect("client");
    let answer = post_with_retry(&right, &payload, Duration::from_secs(5), |_, _| {}).await.expect("accepted");
    assert_eq!(answer.status, 202);
    assert_eq!(spool.held_by(&format!("uid:{my_uid}")).events, 1, "the peer's uid is the client identity");
    assert_eq!(spool.held_by("tcp").events, 0);

    // A socket left behind by a dead agent is replaced at the next start.
    server.abort();
    let _ = server.await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(path.exists(), "the stale socket file is still there");
    let again = bind_socket(&path, None).expect("stale socket replaced");
    let server = serve_socket(again, state);
    assert_eq!(right.post_once(&payload).await.expect("answer").status, 202);
    server.abort();

    // A path that is not a socket is never removed.
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "keep").expect("write");
    assert!(matches!(bind_socket(&file, None), Err(startline_agent::access::SocketError::NotASocket(_))));
    assert_eq!(std::fs::read_to_string(&file).expect("kept"), "keep");
}

#[tokio::test]
async fn emit_posts_over_tcp_with_the_local_token_and_stops_at_a_refusal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (state, spool) = node(dir.path(), |a| a.local_token = Some(LocalToken::Fixed(Secret::new("stl_tcp_token"))));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let app = router(state);
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let payload = startline_agent::node::emit_body("first_step", "j/tcp", &[], None, startline_proto::time::now_ms())
        .expect("body")
        .to_string();
    let mut retries = 0;
    let anonymous = Client::new(Target::Url(url.clone()), None).expect("client");
    let refused = post_with_retry(&anonymous, &payload, Duration::from_secs(5), |_, _| retries += 1).await;
    assert!(matches!(refused, Err(PostError::Refused { status: 401, .. })), "{refused:?}");
    assert_eq!(retries, 0, "a 401 is not retried");
    let client = Client::new(Target::Url(url), Some(Secret::new("stl_tcp_token"))).expect("client");
    let answer = post_with_retry(&client, &payload, Duration::from_secs(5), |_, _| {}).await.expect("accepted");
    assert_eq!(answer.status, 202);
    assert_eq!(spool.held_by("tcp").events, 1);
    server.abort();
}
