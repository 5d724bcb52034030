//! Outbound client settings shared by every connection the collector opens to another service (Alertmanager,
//! webhooks, the OTLP exporter): secrets read from files and kept out of `Debug` output ([`Secret`]), PEM
//! files read and checked at start with errors that name the config field ([`read_file`], [`read_pem_certs`],
//! [`ClientTlsFiles`]), and the one [`reqwest::Client`] built per notifier target ([`build_http_client`]).
//!
//! Secrets never appear in logs, error messages or `Debug` output: a [`Secret`] prints as `<redacted>`, and
//! file errors name the file, never its content.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A secret value (token, password, header value): usable, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Reads a whole file for config field `field`; the error names the field and the file, never its content.
pub fn read_file(field: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{field}: cannot read {}: {e}", path.display()))
}

/// Reads a secret from a file: UTF-8, surrounding whitespace (a trailing newline) trimmed, not empty.
pub fn read_secret_file(field: &str, path: &Path) -> Result<Secret, String> {
    let bytes = read_file(field, path)?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{field}: {} is not UTF-8 text", path.display()))?;
    let value = text.trim();
    if value.is_empty() {
        return Err(format!("{field}: {} is empty", path.display()));
    }
    if value.contains(['\r', '\n']) {
        return Err(format!("{field}: {} holds more than one line", path.display()));
    }
    Ok(Secret::new(value))
}

/// Reads a PEM file that must hold at least one certificate.
pub fn read_pem_certs(field: &str, path: &Path) -> Result<Vec<u8>, String> {
    let pem = read_file(field, path)?;
    let certs: Result<Vec<CertificateDer<'static>>, _> = CertificateDer::pem_slice_iter(&pem).collect();
    match certs {
        Ok(c) if !c.is_empty() => Ok(pem),
        Ok(_) => Err(format!("{field}: {} holds no PEM certificate", path.display())),
        Err(e) => Err(format!("{field}: {} is not valid PEM: {e:?}", path.display())),
    }
}

/// Reads a PEM file that must hold a private key (kept as a secret: it is never printed).
fn read_pem_key(field: &str, path: &Path) -> Result<Vec<u8>, String> {
    let pem = read_file(field, path)?;
    match PrivateKeyDer::from_pem_slice(&pem) {
        Ok(_) => Ok(pem),
        Err(_) => Err(format!("{field}: {} holds no PEM private key", path.display())),
    }
}

/// TLS material for a client, read at start: a CA bundle to trust instead of the built-in roots, and an
/// optional client certificate and key (mTLS).
#[derive(Clone, Default)]
pub struct ClientTlsFiles {
    /// Where the CA bundle came from (for `Debug`), with its PEM.
    pub ca: Option<(PathBuf, Vec<u8>)>,
    /// Where the client certificate came from, with the certificate chain's PEM and the key's PEM.
    pub identity: Option<(PathBuf, Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for ClientTlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTlsFiles")
            .field("ca_file", &self.ca.as_ref().map(|(p, _)| p))
            .field("client_cert_file", &self.identity.as_ref().map(|(p, _, _)| p))
            .finish()
    }
}

impl ClientTlsFiles {
    /// Reads the files named by `{prefix}.{ca_file,client_cert_file,client_key_file}` (or `{prefix}{ca_file}`
    /// when `prefix` ends in `_`, for flat keys like `metrics.otlp_ca_file`), pushing one message per problem.
    pub fn read(
        errs: &mut Vec<String>,
        prefix: &str,
        ca_file: Option<&Path>,
        client_cert_file: Option<&Path>,
        client_key_file: Option<&Path>,
    ) -> ClientTlsFiles {
        let field = |name: &str| {
            if prefix.ends_with('_') {
                format!("{prefix}{name}")
            } else {
                format!("{prefix}.{name}")
            }
        };
        let mut out = ClientTlsFiles::default();
        if let Some(p) = ca_file {
            match read_pem_certs(&field("ca_file"), p) {
                Ok(pem) => out.ca = Some((p.to_path_buf(), pem)),
                Err(e) => errs.push(e),
            }
        }
        match (client_cert_file, client_key_file) {
            (None, None) => {}
            (Some(c), Some(k)) => {
                let cert = read_pem_certs(&field("client_cert_file"), c).map_err(|e| errs.push(e)).ok();
                let key = read_pem_key(&field("client_key_file"), k).map_err(|e| errs.push(e)).ok();
                if let (Some(cert), Some(key)) = (cert, key) {
                    out.identity = Some((c.to_path_buf(), cert, key));
                }
            }
            (Some(_), None) => errs.push(format!("{}: set with client_cert_file", field("client_key_file"))),
            (None, Some(_)) => errs.push(format!("{}: set with client_key_file", field("client_cert_file"))),
        }
        out
    }
}

/// Builds the HTTP client of one target: HTTP/1.1 or HTTP/2 over TCP or rustls, the CA bundle (when given) as
/// the only trusted roots (else the built-in webpki roots), the client certificate (when given), and `timeout`
/// per request. Errors say what was wrong without secret material.
pub fn build_http_client(tls: &ClientTlsFiles, timeout: Duration) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .timeout(timeout)
        .connect_timeout(timeout)
        .user_agent(concat!("startline-collector/", env!("CARGO_PKG_VERSION")))
        // Notifications are posted to the configured URL only: a redirect could carry credentials elsewhere.
        .redirect(reqwest::redirect::Policy::none());
    if let Some((path, pem)) = &tls.ca {
        b = b.tls_built_in_root_certs(false);
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| format!("ca_file: {}: {}", path.display(), e.without_url()))?;
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    if let Some((path, cert, key)) = &tls.identity {
        let mut pem = cert.clone();
        pem.push(b'\n');
        pem.extend_from_slice(key);
        // The error text of a bad identity is reqwest's own and names no key material.
        let id = reqwest::Identity::from_pem(&pem)
            .map_err(|e| format!("client_cert_file: {}: {}", path.display(), e.without_url()))?;
        b = b.identity(id);
    }
    b.build().map_err(|e| format!("cannot build http client: {}", e.without_url()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some(<redacted>)");
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn secret_files_are_trimmed_and_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("t");
        std::fs::write(&p, "tok-123\n").expect("write");
        assert_eq!(read_secret_file("x.token_file", &p).expect("read").expose(), "tok-123");
        std::fs::write(&p, "\n").expect("write");
        assert_eq!(read_secret_file("x.token_file", &p), Err(format!("x.token_file: {} is empty", p.display())));
        std::fs::write(&p, "a\nb").expect("write");
        assert!(read_secret_file("x.token_file", &p).is_err_and(|e| e.ends_with("holds more than one line")));
        let missing = dir.path().join("missing");
        let e = read_secret_file("x.token_file", &missing).expect_err("missing");
        assert!(e.starts_with(&format!("x.token_file: cannot read {}: ", missing.display())), "{e}");
    }

    #[test]
    fn tls_files_are_read_and_named_in_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
        let ca_path = dir.path().join("ca.pem");
        let key_path = dir.path().join("key.pem");
        std::fs::write(&ca_path, ca.cert.pem()).expect("write");
        std::fs::write(&key_path, ca.key_pair.serialize_pem()).expect("write");
        let mut errs = Vec::new();
        let tls = ClientTlsFiles::read(&mut errs, "a.b[0]", Some(&ca_path), Some(&ca_path), Some(&key_path));
        assert!(errs.is_empty(), "{errs:?}");
        let debug = format!("{tls:?}");
        assert!(!debug.contains("BEGIN"), "no PEM in Debug: {debug}");
        build_http_client(&tls, Duration::from_secs(1)).expect("client");

        let mut errs = Vec::new();
        ClientTlsFiles::read(&mut errs, "metrics.otlp_", Some(&key_path), None, Some(&ca_path));
        assert_eq!(
            errs,
            [
                format!("metrics.otlp_ca_file: {} holds no PEM certificate", key_path.display()),
                "metrics.otlp_client_cert_file: set with client_key_file".to_string(),
            ]
        );
    }
}
