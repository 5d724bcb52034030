//! Credentials the agent holds: bearer tokens for the collector (the uplink) and for the node agent's local
//! endpoint (`emit`), read from a file (preferred: a flag or environment variable holding the token itself
//! shows in `ps` and in `/proc/<pid>/environ`) or given directly.
//!
//! A token is opaque text. It lives in a [`Secret`], whose `Debug` and `Display` print `<redacted>`, so it can
//! not end up in a log line, an error message or a panic by accident; only [`Secret::expose`] reads it, at
//! the one place it goes on the wire (an `authorization: Bearer` header). [`secret_eq`] compares a presented
//! token with the expected one in constant time.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// A bearer token (or any credential): printed as `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The credential itself, for the one place it is sent.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A credential that cannot be used. Messages name the file, never its content.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The token file could not be read.
    #[error("cannot read token file {path}: {cause}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// The token file (or the token given directly) is empty after trimming whitespace.
    #[error("token {0} is empty")]
    Empty(String),
    /// The token holds characters a header value cannot carry (only visible ASCII is allowed).
    #[error("token {0} holds characters other than visible ASCII")]
    NotVisibleAscii(String),
}

/// Checks a token: not empty, visible ASCII only (what an HTTP header value carries without escaping).
/// `origin` names where it came from for the error (a file path or an option), never the token.
pub fn check_token(value: &str, origin: &str) -> Result<Secret, CredentialError> {
    let value = value.trim();
    if value.is_empty() {
        return Err(CredentialError::Empty(origin.to_string()));
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(CredentialError::NotVisibleAscii(origin.to_string()));
    }
    Ok(Secret::new(value))
}

/// Reads a token file: its content, trimmed. A missing, unreadable or empty file is an error naming the file.
pub fn read_token_file(path: &Path) -> Result<Secret, CredentialError> {
    let text = std::fs::read_to_string(path)
        .map_err(|cause| CredentialError::Unreadable { path: path.to_path_buf(), cause })?;
    check_token(&text, &format!("file {}", path.display()))
}

/// Where a token comes from. A file is read again each time [`TokenSource::load`] is called, so a rotated
/// token is picked up at the next connection without a restart.
#[derive(Debug, Clone)]
pub enum TokenSource {
    /// Given directly (flag or environment variable).
    Static(Secret),
    /// Read from this file.
    File(PathBuf),
}

impl TokenSource {
    /// The current token.
    pub fn load(&self) -> Result<Secret, CredentialError> {
        match self {
            TokenSource::Static(s) => Ok(s.clone()),
            TokenSource::File(p) => read_token_file(p),
        }
    }
}

/// Compares a presented credential with the expected one in constant time (of the SHA-256 digests, so the
/// time does not depend on where they differ nor on the expected length).
pub fn secret_eq(presented: &[u8], expected: &Secret) -> bool {
    let a = Sha256::digest(presented);
    let b = Sha256::digest(expected.expose().as_bytes());
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer <token>` header value, if it has that form (the scheme is
/// case-insensitive, as HTTP specifies).
pub fn bearer(header: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = (header.get(..7)?, header.get(7..)?);
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print_their_value() {
        let s = Secret::new("stl_abcdef");
        assert_eq!(format!("{s:?} {s}"), "<redacted> <redacted>");
        assert_eq!(format!("{:?}", TokenSource::Static(s.clone())), "Static(<redacted>)");
        assert_eq!(s.expose(), "stl_abcdef");
    }

    #[test]
    fn token_files_are_trimmed_and_missing_or_empty_ones_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("token");
        std::fs::write(&file, "  stl_abc-_XYZ\n").expect("write");
        assert_eq!(read_token_file(&file).expect("token").expose(), "stl_abc-_XYZ");
        std::fs::write(&file, " \n\t").expect("write");
        let err = read_token_file(&file).expect_err("empty");
        assert!(matches!(err, CredentialError::Empty(_)) && err.to_string().contains("token"), "{err}");
        let err = read_token_file(&dir.path().join("absent")).expect_err("missing");
        assert!(err.to_string().contains("absent"), "{err}");
        std::fs::write(&file, "stl_secret with space").expect("write");
        let err = read_token_file(&file).expect_err("space");
        assert!(!err.to_string().contains("stl_secret"), "the token is not in the message: {err}");
    }

    #[test]
    fn bearer_headers_are_parsed_and_compared_in_constant_time() {
        let expected = Secret::new("stl_right");
        assert_eq!(bearer(b"Bearer stl_right"), Some(&b"stl_right"[..]));
        assert_eq!(bearer(b"bearer  stl_right "), Some(&b"stl_right"[..]));
        assert_eq!(bearer(b"Basic dXNlcjpwdw=="), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bear"), None);
        assert!(secret_eq(b"stl_right", &expected));
        assert!(!secret_eq(b"stl_wrong", &expected));
        assert!(!secret_eq(b"stl_righ", &expected));
        assert!(!secret_eq(b"", &expected));
    }
}
