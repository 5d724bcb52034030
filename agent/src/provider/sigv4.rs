//! AWS Signature Version 4 for the SageMaker adapter's JSON API calls (`AWS4-HMAC-SHA256` with a signed
//! `Authorization` header). Checked against AWS's published test-suite vectors.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// AWS credentials.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// Access key id.
    pub access_key: String,
    /// Secret access key.
    pub secret_key: String,
    /// Session token (temporary credentials), signed as `x-amz-security-token`.
    pub session_token: Option<String>,
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("hmac takes any key length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn sha_hex(b: &[u8]) -> String {
    hex(&Sha256::digest(b))
}

fn uri_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Canonical query string: pairs sorted by name then value, each part URI-encoded.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (uri_encode(k), uri_encode(v))
        })
        .collect();
    pairs.sort();
    pairs.into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

/// Signs a request. `headers` must include `host` and `x-amz-date` (and `x-amz-security-token` with temporary
/// credentials); names are matched case-insensitively. Returns the `Authorization` header value.
#[allow(clippy::too_many_arguments)]
pub fn authorization(
    creds: &Credentials,
    region: &str,
    service: &str,
    method: &str,
    path: &str,
    query: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> String {
    let amz_date =
        headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("x-amz-date")).map(|(_, v)| v.as_str()).unwrap_or("");
    let date = &amz_date[..amz_date.len().min(8)];
    let mut hs: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.split_whitespace().collect::<Vec<_>>().join(" ")))
        .collect();
    hs.sort();
    let canonical_headers: String = hs.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed_headers = hs.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(";");
    let canonical_request = format!(
        "{method}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{}",
        if path.is_empty() { "/" } else { path },
        canonical_query(query),
        sha_hex(body)
    );
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let string_to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", sha_hex(canonical_request.as_bytes()));
    let k_date = hmac(format!("AWS4{}", creds.secret_key).as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    let k_signing = hmac(&k_service, b"aws4_request");
    let signature = hex(&hmac(&k_signing, string_to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
        creds.access_key
    )
}

/// `YYYYMMDDTHHMMSSZ` for Unix milliseconds (RFC 3339's fields without separators or the fraction).
pub fn amz_date(ms: i64) -> String {
    let s = startline_proto::rfc3339::format_ms(ms.max(0)); // 2026-01-02T03:04:05.678Z
    let seconds = s.split('.').next().unwrap_or_default(); // 2026-01-02T03:04:05
    format!("{}Z", seconds.replace(['-', ':'], ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> Credentials {
        Credentials {
            access_key: "AKIDEXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        }
    }

    fn headers() -> Vec<(String, String)> {
        vec![("Host".into(), "example.amazonaws.com".into()), ("X-Amz-Date".into(), "20150830T123600Z".into())]
    }

    #[test]
    fn aws_test_suite_get_vanilla() {
        let a = authorization(&creds(), "us-east-1", "service", "GET", "/", "", &headers(), b"");
        assert_eq!(
            a,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
    }

    #[test]
    fn aws_test_suite_get_vanilla_query_order_key_case() {
        let a =
            authorization(&creds(), "us-east-1", "service", "GET", "/", "Param2=value2&Param1=value1", &headers(), b"");
        assert!(a.ends_with("Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"), "{a}");
    }

    #[test]
    fn formats_amz_dates() {
        assert_eq!(amz_date(1_440_938_160_000), "20150830T123600Z");
    }
}
