//! A minimal HTTP/1.1 client for notifiers: `POST` a JSON body to an `http://host:port/path` URL and read the
//! status. Plain HTTP only (TLS to notifiers is not built yet; see the README).

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A parsed `http://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// `host:port` to connect to.
    pub authority: String,
    /// Path and query, starting with `/`.
    pub path: String,
}

/// Why a URL or a request failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Not an `http://host[:port][/path]` URL.
    #[error("must look like http://host:port/path (https is not supported yet)")]
    BadUrl,
    /// Connecting, writing or reading failed or timed out.
    #[error("{0}")]
    Io(String),
    /// The server answered with a non-2xx status.
    #[error("http status {0}")]
    Status(u16),
}

impl HttpUrl {
    /// Parses `http://host[:port][/path]`; the port defaults to 80.
    pub fn parse(url: &str) -> Result<HttpUrl, HttpError> {
        let rest = url.strip_prefix("http://").ok_or(HttpError::BadUrl)?;
        let (auth, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if auth.is_empty() || auth.contains(['@', ' ']) {
            return Err(HttpError::BadUrl);
        }
        let authority = if auth.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
            auth.to_string()
        } else if auth.contains(':') {
            return Err(HttpError::BadUrl);
        } else {
            format!("{auth}:80")
        };
        Ok(HttpUrl { authority, path: path.to_string() })
    }

    /// The same server with another path.
    pub fn with_path(&self, path: &str) -> HttpUrl {
        let base = self.path.trim_end_matches('/');
        HttpUrl { authority: self.authority.clone(), path: format!("{base}{path}") }
    }
}

/// POSTs `body` as JSON; Ok with the status when it is 2xx.
pub async fn post_json(url: &HttpUrl, body: &[u8], timeout: Duration) -> Result<u16, HttpError> {
    let io = |e: std::io::Error| HttpError::Io(e.to_string());
    let fut = async {
        let mut s = TcpStream::connect(&url.authority).await.map_err(io)?;
        s.set_nodelay(true).map_err(io)?;
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\nUser-Agent: startline-collector\r\n\r\n",
            url.path,
            url.authority,
            body.len()
        );
        s.write_all(head.as_bytes()).await.map_err(io)?;
        s.write_all(body).await.map_err(io)?;
        let mut buf = Vec::with_capacity(512);
        // The status line is all we need; read until it is complete or the server closes.
        let mut chunk = [0u8; 512];
        while !buf.windows(2).any(|w| w == b"\r\n") {
            let n = s.read(&mut chunk).await.map_err(io)?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let line = String::from_utf8_lossy(&buf);
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| HttpError::Io("no http status line".into()))?;
        if (200..300).contains(&status) {
            Ok(status)
        } else {
            Err(HttpError::Status(status))
        }
    };
    tokio::time::timeout(timeout, fut).await.map_err(|_| HttpError::Io("timed out".into()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_http_urls_only() {
        assert_eq!(
            HttpUrl::parse("http://127.0.0.1:9093").expect("ok"),
            HttpUrl { authority: "127.0.0.1:9093".into(), path: "/".into() }
        );
        let u = HttpUrl::parse("http://am.local/prefix/").expect("ok");
        assert_eq!(u.authority, "am.local:80");
        assert_eq!(u.with_path("/api/v2/alerts").path, "/prefix/api/v2/alerts");
        for bad in ["https://x", "ftp://x", "http://", "http://a:b:c", "localhost:9093"] {
            assert!(HttpUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
