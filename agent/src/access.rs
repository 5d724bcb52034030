//! Who may post to the node agent, and how much: the checks of the node agent's local endpoint.
//!
//! - **Host and Origin** ([`host_allowed`], [`origin_allowed`]): a request whose `Host` is not the listen
//!   address, `localhost`, `127.0.0.1` or `[::1]` (any port) is refused with 403, so a web page that rebinds
//!   its DNS name to 127.0.0.1 cannot reach the agent; a request with an `Origin` (a browser's cross-origin
//!   request) other than the request's own host is refused with 403 (no CSRF). No `Host` at all is accepted
//!   (browsers always send one; an HTTP/1.0 script may not).
//! - **Content type** ([`json_content_type`]): a POST must be `application/json` (optionally with
//!   `; charset=utf-8`), else 415; a browser cannot send that cross-origin without a CORS preflight, which the
//!   agent never grants.
//! - **Local token** ([`Access::local_token`]): when configured, a POST without `Authorization: Bearer <it>`
//!   gets 401; compared in constant time ([`crate::auth::secret_eq`]). A token file is read again when it
//!   changes ([`LocalToken`]): a rotated token applies from the next request and the old one fails; a file
//!   that becomes missing or empty refuses every POST (fail closed) until it is fixed.
//! - **Job ids** ([`JobAllowList`]): when a restriction is configured, only the listed jobs (flags, the
//!   agent's own job from its environment, and a file such as a Slurm prolog writes, re-read when it changes)
//!   may be reported, else 403 naming `job_id`.
//! - **Client identity and quotas** ([`PeerCred`], [`client_id`]): a unix-socket connection's peer credentials
//!   (uid, gid, pid, read once per connection and logged at debug) make the client `uid:<uid>`; every loopback
//!   TCP client is the one client `tcp` (TCP carries no local identity). Each client may hold at most
//!   [`Access::client_quota`] of the spool (enforced by [`crate::spool::Spool::append_for`]: 429).
//! - **The socket** ([`bind_socket`]): created with mode 0660 and the configured group (looked up in
//!   `/etc/group`), a stale socket file removed first (a live one is an error: another agent owns it).

use crate::auth::Secret;
use crate::spool::ClientQuota;
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::serve::IncomingStream;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tokio::net::UnixListener;

/// The node agent's access rules.
#[derive(Debug)]
pub struct Access {
    /// Token a POST must carry as `Authorization: Bearer`, if any.
    pub local_token: Option<LocalToken>,
    /// `Host` values accepted besides `localhost`, `127.0.0.1` and `[::1]` (the listen address as given and
    /// as bound), lowercase.
    pub listen_hosts: Vec<String>,
    /// Job ids that may be reported, when restricted.
    pub jobs: Option<JobAllowList>,
    /// The most each client may hold in the spool.
    pub client_quota: ClientQuota,
}

impl Access {
    /// No token, no job restriction, and a quota of a quarter of the spool's limits per client.
    pub fn open(spool: crate::spool::SpoolLimits) -> Self {
        Access {
            local_token: None,
            listen_hosts: Vec::new(),
            jobs: None,
            client_quota: ClientQuota {
                max_events: (spool.max_events / 4).max(1),
                max_bytes: (spool.max_bytes / 4).max(1),
            },
        }
    }
}

/// Splits `host[:port]` (an IPv6 host in brackets) into the host, lowercase, and whether a port that is all
/// digits (or none) follows.
fn split_host(authority: &str) -> Option<String> {
    let a = authority.trim().to_ascii_lowercase();
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        (format!("[{h}]"), after.strip_prefix(':').map(str::to_string).or_else(|| after.is_empty().then(String::new))?)
    } else {
        match a.split_once(':') {
            Some((h, p)) => (h.to_string(), p.to_string()),
            None => (a.clone(), String::new()),
        }
    };
    (!host.is_empty() && port.bytes().all(|b| b.is_ascii_digit())).then_some(host)
}

/// Whether a `Host` value names this agent: `localhost`, `127.0.0.1` or `[::1]` with any port, or one of the
/// listen addresses exactly.
pub fn host_allowed(host: &str, listen_hosts: &[String]) -> bool {
    let lower = host.trim().to_ascii_lowercase();
    if listen_hosts.contains(&lower) {
        return true;
    }
    matches!(split_host(&lower).as_deref(), Some("localhost" | "127.0.0.1" | "[::1]"))
}

/// Whether an `Origin` is the request's own host: `http(s)://<authority>` where the authority equals the
/// `Host` (or, without a `Host`, is itself allowed). `null` and other schemes are not.
pub fn origin_allowed(origin: &str, host: Option<&str>, listen_hosts: &[String]) -> bool {
    let lower = origin.trim().to_ascii_lowercase();
    let Some(authority) = lower.strip_prefix("http://").or_else(|| lower.strip_prefix("https://")) else {
        return false;
    };
    let authority = authority.trim_end_matches('/');
    if authority.contains('/') {
        return false;
    }
    match host {
        Some(h) => h.trim().eq_ignore_ascii_case(authority) && host_allowed(h, listen_hosts),
        None => host_allowed(authority, listen_hosts),
    }
}

/// Whether a `Content-Type` is JSON: `application/json`, optionally `; charset=utf-8` (any case, quoted or not).
pub fn json_content_type(value: &str) -> bool {
    let mut parts = value.split(';');
    if !parts.next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json")) {
        return false;
    }
    parts.all(|p| match p.split_once('=') {
        Some((k, v)) => {
            k.trim().eq_ignore_ascii_case("charset") && v.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        None => p.trim().is_empty(),
    })
}

/// The node agent's local token: fixed, or a file read again when its modification time, size or inode changes.
#[derive(Debug)]
pub enum LocalToken {
    /// A fixed value (tests, or a token given on the command line).
    Fixed(Secret),
    /// A file (`--local-token-file`).
    File {
        /// The file.
        path: PathBuf,
        /// Its stamp when last read, and the token then (None: unreadable or empty: refuse everything).
        cache: Mutex<(Option<FileStamp>, Option<Secret>)>,
    },
}

impl LocalToken {
    /// A token file, read now (a missing or empty file is a startup error).
    pub fn file(path: PathBuf) -> Result<LocalToken, crate::auth::CredentialError> {
        let token = crate::auth::read_token_file(&path)?;
        let st = stamp(&path);
        Ok(LocalToken::File { path, cache: Mutex::new((st, Some(token))) })
    }

    /// The token a POST must carry now; `None` refuses every POST (the file became unreadable or empty).
    pub fn current(&self) -> Option<Secret> {
        match self {
            LocalToken::Fixed(s) => Some(s.clone()),
            LocalToken::File { path, cache } => {
                let now = stamp(path);
                let mut c = cache.lock().ok()?;
                if c.0 != now || now.is_none() {
                    let token = match crate::auth::read_token_file(path) {
                        Ok(t) => Some(t),
                        Err(e) => {
                            if c.1.is_some() {
                                tracing::error!(error = %e, "local token file unusable: every POST is refused until it is fixed");
                            }
                            None
                        }
                    };
                    if token.is_some() && c.1.is_some() && now != c.0 {
                        tracing::info!(file = %path.display(), "local token file changed: the new token applies");
                    }
                    *c = (now, token);
                }
                c.1.clone()
            }
        }
    }
}

/// Job ids the agent accepts events for: fixed ones (flags, the agent's own job) and a file with one id per
/// line (`#` comments and blank lines ignored), read again when its modification time, size or inode
/// changes. A missing file allows no job (a prolog may not have written it yet).
#[derive(Debug)]
pub struct JobAllowList {
    fixed: HashSet<String>,
    file: Option<AllowFile>,
}

#[derive(Debug)]
struct AllowFile {
    path: PathBuf,
    /// The file's stamp when last read, and its ids.
    cache: Mutex<(Option<FileStamp>, HashSet<String>)>,
}

type FileStamp = (std::time::SystemTime, u64, u64);

fn stamp(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

impl JobAllowList {
    /// A list of `fixed` ids and, if given, the ids in `file`.
    pub fn new(fixed: impl IntoIterator<Item = String>, file: Option<PathBuf>) -> Self {
        JobAllowList {
            fixed: fixed.into_iter().filter(|j| !j.is_empty()).collect(),
            file: file.map(|path| AllowFile { path, cache: Mutex::new((None, HashSet::new())) }),
        }
    }

    /// Whether events for `job` are accepted. Reading the file (a stat per call, a read when it changed) is
    /// small enough to do inline.
    pub fn permits(&self, job: &str) -> bool {
        if self.fixed.contains(job) {
            return true;
        }
        let Some(f) = &self.file else {
            return false;
        };
        let now = stamp(&f.path);
        let mut cache = f.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.0 != now || now.is_none() {
            let ids = match std::fs::read_to_string(&f.path) {
                Ok(text) => text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_string)
                    .collect(),
                Err(e) => {
                    if cache.0.is_some() || now.is_some() {
                        tracing::warn!(path = %f.path.display(), error = %e, "cannot read the allowed jobs file");
                    }
                    HashSet::new()
                }
            };
            *cache = (now, ids);
        }
        cache.1.contains(job)
    }
}

/// A unix-socket peer's credentials, read once per connection (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerCred {
    /// Effective user id.
    pub uid: Option<u32>,
    /// Effective group id.
    pub gid: Option<u32>,
    /// Process id, when the platform reports it.
    pub pid: Option<i32>,
}

impl Connected<IncomingStream<'_, UnixListener>> for PeerCred {
    fn connect_info(stream: IncomingStream<'_, UnixListener>) -> Self {
        match stream.io().peer_cred() {
            Ok(c) => {
                let cred = PeerCred { uid: Some(c.uid()), gid: Some(c.gid()), pid: c.pid() };
                tracing::debug!(uid = c.uid(), gid = c.gid(), pid = c.pid(), "node agent socket connection");
                cred
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a socket peer's credentials");
                PeerCred::default()
            }
        }
    }
}

/// The client a request comes from, for quotas: `uid:<uid>` over the unix socket, `tcp` over loopback TCP.
pub fn client_id(extensions: &axum::http::Extensions) -> String {
    match extensions.get::<ConnectInfo<PeerCred>>() {
        Some(ConnectInfo(PeerCred { uid: Some(uid), .. })) => format!("uid:{uid}"),
        Some(_) => "unix:unknown".to_string(),
        None => "tcp".to_string(),
    }
}

/// Setting up the socket failed.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The group is not in `/etc/group`.
    #[error("unknown group {0:?} (not in /etc/group)")]
    UnknownGroup(String),
    /// Another process serves the socket.
    #[error("socket {0} is in use by another process")]
    InUse(PathBuf),
    /// The path exists and is not a socket (not removed: it is not the agent's).
    #[error("{0} exists and is not a socket")]
    NotASocket(PathBuf),
    /// A file operation failed.
    #[error("socket {path}: {what}: {cause}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The operation.
        what: &'static str,
        /// Why.
        cause: std::io::Error,
    },
}

/// The gid of a group in `/etc/group`-formatted text (`name:password:gid:members`); a number is taken as a gid.
pub fn lookup_group(name: &str, group_file: &str) -> Option<u32> {
    if let Ok(gid) = name.parse() {
        return Some(gid);
    }
    group_file.lines().find_map(|line| {
        let mut f = line.split(':');
        (f.next()? == name).then_some(())?;
        f.nth(1)?.parse().ok()
    })
}

/// The gid of a group, from `/etc/group`.
pub fn group_id(name: &str) -> Result<u32, SocketError> {
    let text = std::fs::read_to_string("/etc/group").unwrap_or_default();
    lookup_group(name, &text).ok_or_else(|| SocketError::UnknownGroup(name.to_string()))
}

/// Binds the node agent's socket at `path`: mode 0660, group `gid` if given. A stale socket file (nothing
/// accepts on it) is removed first; a live one or a file that is not a socket is an error. The socket is bound
/// under a temporary name, given its mode and group, then renamed into place, so no client can connect to it
/// before its permissions are set.
pub fn bind_socket(path: &Path, gid: Option<u32>) -> Result<UnixListener, SocketError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let io = |what: &'static str| move |cause| SocketError::Io { path: path.to_path_buf(), what, cause };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(SocketError::InUse(path.to_path_buf()));
            }
            std::fs::remove_file(path).map_err(io("remove stale socket"))?;
            tracing::info!(path = %path.display(), "removed a stale socket file");
        }
        Ok(_) => return Err(SocketError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("inspect")(e)),
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(io("bind"))?;
    let placed = (|| {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o660)).map_err(io("chmod 0660"))?;
        if let Some(gid) = gid {
            std::os::unix::fs::chown(&tmp, None, Some(gid)).map_err(io("set group"))?;
        }
        std::fs::rename(&tmp, path).map_err(io("rename into place"))
    })();
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_the_listen_address_or_loopback_names() {
        let listen = vec!["10.1.2.3:7465".to_string()];
        for ok in
            ["localhost", "localhost:7465", "LOCALHOST:1", "127.0.0.1:7465", "[::1]", "[::1]:7465", "10.1.2.3:7465"]
        {
            assert!(host_allowed(ok, &listen), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:7465",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "10.1.2.3",
            "localhost:80x",
            "[::2]:7465",
            "",
        ] {
            assert!(!host_allowed(bad, &listen), "{bad}");
        }
    }

    #[test]
    fn origins_must_be_the_same_host() {
        assert!(origin_allowed("http://localhost:7465", Some("localhost:7465"), &[]));
        assert!(origin_allowed("http://127.0.0.1:7465", None, &[]));
        assert!(!origin_allowed("http://evil.example", Some("localhost:7465"), &[]));
        assert!(!origin_allowed("http://localhost:9999", Some("localhost:7465"), &[]), "another local port");
        assert!(!origin_allowed("null", Some("localhost:7465"), &[]));
        assert!(!origin_allowed("file://", None, &[]));
    }

    #[test]
    fn only_json_content_types_pass() {
        for ok in ["application/json", "Application/JSON; charset=utf-8", "application/json;charset=\"UTF-8\""] {
            assert!(json_content_type(ok), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/json; charset=latin1",
            "application/jsonx",
            "",
        ] {
            assert!(!json_content_type(bad), "{bad}");
        }
    }

    #[test]
    fn groups_are_looked_up_by_name_or_number() {
        let file = "root:x:0:\nslurm:x:64030:\ngpu-users:x:1234:ana,bo\n";
        assert_eq!(lookup_group("gpu-users", file), Some(1234));
        assert_eq!(lookup_group("slurm", file), Some(64030));
        assert_eq!(lookup_group("4321", file), Some(4321));
        assert_eq!(lookup_group("nobody-here", file), None);
        assert_eq!(lookup_group("gpu", file), None);
    }
}
