//! TLS for both listeners (rustls with the ring provider): the certificate and key files, optional client
//! certificates verified against a CA bundle (mTLS), and reloads that never drop a connection.
//!
//! [`TlsState`] holds the current `rustls::ServerConfig`s (one per listener, differing only in ALPN: gRPC speaks
//! `h2`, HTTP `h2` and `http/1.1`). Each accepted connection takes the config current at its handshake, so a
//! reload (SIGHUP, a change of a file's modification time, or `POST /api/v1/admin/reload`) applies to new
//! connections while open ones keep theirs. A reload that fails (a half-written key, a mismatched pair) keeps
//! the old config and reports why.
//!
//! [`peer_names`] gives a verified client certificate's DNS and URI subject-alternative names (URI for SPIFFE
//! ids), which [`super::Keyring`] maps to identities.

use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

/// Whether clients must present a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// Not asked for.
    None,
    /// Verified when presented; a client may still use a bearer token instead.
    Optional,
    /// Every connection must present a valid certificate.
    Required,
}

/// The files of `[tls]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM bundle of CAs that sign client certificates.
    pub client_ca_file: Option<PathBuf>,
    /// Whether client certificates are asked for.
    pub client_certs: ClientCerts,
}

/// A TLS file problem, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or parsed.
    #[error("{what} {path}: {reason}")]
    File {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: String,
        /// Why.
        reason: String,
    },
    /// rustls refused the combination (a key that does not match the certificate, an empty CA bundle).
    #[error("tls: {0}")]
    Config(String),
}

fn file_err(what: &'static str, path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File { what, path: path.display().to_string(), reason: reason.to_string() }
}

/// Reads a PEM certificate chain.
pub fn load_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| file_err(what, path, e))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(what, path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(file_err(what, path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| file_err("tls.key_file", path, e))?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| file_err("tls.key_file", path, format!("holds no PEM private key: {e}")))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds a server config from the files, with the given ALPN protocols.
pub fn server_config(files: &TlsFiles, alpn: &[&[u8]]) -> Result<ServerConfig, TlsError> {
    let certs = load_certs("tls.cert_file", &files.cert_file)?;
    let key = load_key(&files.key_file)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match (&files.client_ca_file, files.client_certs) {
        (Some(ca), ClientCerts::Optional | ClientCerts::Required) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in load_certs("tls.client_ca_file", ca)? {
                roots.add(c).map_err(|e| file_err("tls.client_ca_file", ca, e))?;
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            let v = if files.client_certs == ClientCerts::Optional { v.allow_unauthenticated() } else { v };
            builder.with_client_cert_verifier(v.build().map_err(|e| TlsError::Config(e.to_string()))?)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(format!("tls.cert_file and tls.key_file do not make a pair: {e}")))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The listener a config is for.
#[derive(Debug, Clone, Copy)]
pub enum Listener {
    /// gRPC: ALPN `h2`.
    Grpc,
    /// HTTP: ALPN `h2`, `http/1.1`.
    Http,
}

/// The current TLS configs, reloadable.
#[derive(Debug)]
pub struct TlsState {
    files: RwLock<TlsFiles>,
    grpc: RwLock<Arc<ServerConfig>>,
    http: RwLock<Arc<ServerConfig>>,
    stamps: Mutex<Vec<Option<SystemTime>>>,
}

fn stamps(files: &TlsFiles) -> Vec<Option<SystemTime>> {
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut v = vec![mtime(&files.cert_file), mtime(&files.key_file)];
    if let Some(ca) = &files.client_ca_file {
        v.push(mtime(ca));
    }
    v
}

const GRPC_ALPN: &[&[u8]] = &[b"h2"];
const HTTP_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// Both listeners' configs from one read of the files: the same certificate and verifier, each its own ALPN.
fn configs(files: &TlsFiles) -> Result<(ServerConfig, ServerConfig), TlsError> {
    let grpc = server_config(files, GRPC_ALPN)?;
    let mut http = grpc.clone();
    http.alpn_protocols = HTTP_ALPN.iter().map(|p| p.to_vec()).collect();
    Ok((grpc, http))
}

impl TlsState {
    /// Loads the files.
    pub fn load(files: TlsFiles) -> Result<TlsState, TlsError> {
        let (grpc, http) = configs(&files)?;
        let s = stamps(&files);
        Ok(TlsState {
            files: RwLock::new(files),
            grpc: RwLock::new(Arc::new(grpc)),
            http: RwLock::new(Arc::new(http)),
            stamps: Mutex::new(s),
        })
    }

    /// The config a new connection on `listener` uses.
    pub fn config(&self, listener: Listener) -> Arc<ServerConfig> {
        let lock = match listener {
            Listener::Grpc => &self.grpc,
            Listener::Http => &self.http,
        };
        match lock.read() {
            Ok(c) => c.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// An acceptor for one new connection.
    pub fn acceptor(&self, listener: Listener) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config(listener))
    }

    /// Reloads from `files` (the same files, or new paths from a reloaded config). On error the old configs
    /// stay.
    pub fn reload(&self, files: TlsFiles) -> Result<(), TlsError> {
        let (grpc, http) = configs(&files)?;
        let s = stamps(&files);
        if let Ok(mut g) = self.grpc.write() {
            *g = Arc::new(grpc);
        }
        if let Ok(mut h) = self.http.write() {
            *h = Arc::new(http);
        }
        if let Ok(mut st) = self.stamps.lock() {
            *st = s;
        }
        if let Ok(mut f) = self.files.write() {
            *f = files;
        }
        Ok(())
    }

    /// The files in use.
    pub fn files(&self) -> TlsFiles {
        match self.files.read() {
            Ok(f) => f.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Whether any file's modification time changed since the last load.
    pub fn files_changed(&self) -> bool {
        let now = stamps(&self.files());
        self.stamps.lock().map(|s| *s != now).unwrap_or(false)
    }
}

/// The DNS and URI subject-alternative names of a connection's verified client certificate (none without one).
pub fn peer_names(conn: &rustls::ServerConnection) -> Vec<String> {
    let Some(leaf) = conn.peer_certificates().and_then(|c| c.first()) else { return Vec::new() };
    let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else { return Vec::new() };
    cert.valid_dns_names().chain(cert.valid_uri_names()).map(str::to_string).collect()
}
