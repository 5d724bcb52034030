//! The dashboard behind authentication in a real headless Chromium (Debian `chromium`): without a session the
//! browser lands on the login page and sees no data; after submitting a `read` token through the login form it
//! renders the queue view with the API's numbers. The session lives in an HttpOnly cookie in the browser
//! profile; the token never appears in a URL. A login form submitted from a page of another origin (a local
//! file: `Origin: null`) is refused; one from an origin listed in `http.allowed_origins` works.

use startline_tests::{binary, Collector};
use std::process::Command;

fn chromium(args: &[&str], profile: &std::path::Path) -> String {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1400,1000",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("chromium runs (scripts/test.sh installs Debian's chromium)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn chromium_sees_the_login_page_then_logs_in_with_a_read_token_and_sees_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let reader = startline_collector::auth::generate_token().expect("token");
    let writer = startline_collector::auth::generate_token().expect("token");
    let h = |t: &str| startline_collector::auth::TokenHash::of(t).to_config();
    // The page that submits the login form, served from another origin the config lists.
    let page = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let served = page.clone();
    let form_site = startline_tests::serve_http(move |_| {
        (200, "text/html; charset=utf-8", served.lock().map(|p| p.clone()).unwrap_or_default())
    });
    let cfg = d.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[http]\nallowed_origins = [\"http://{form_site}\"]\n\
             [[auth.identity]]\nname = \"ui\"\ntoken_hashes = [\"{}\"]\nscopes = [\"read\"]\n\
             [[auth.identity]]\nname = \"sim\"\ntoken_hashes = [\"{}\"]\nscopes = [\"ingest\"]\n",
            h(&reader),
            h(&writer)
        ),
    )
    .expect("config");
    let c = Collector::start(&d.join("db"), &["--config", &cfg.display().to_string()]);
    let sim = Command::new(binary("startline-agent"))
        .args(["--collector", &c.endpoint(), "simulate", "--history", "1d", "--seed", "3", "--jobs-per-hour", "20"])
        .env("STARTLINE_TOKEN", &writer)
        .output()
        .expect("simulator");
    assert!(sim.status.success(), "{}", String::from_utf8_lossy(&sim.stderr));
    let profile = d.join("profile");
    let base = format!("http://{}", c.http);

    // No session: the login page, and no data.
    let dom = chromium(&["--dump-dom", &format!("{base}/#queue")], &profile);
    assert!(dom.contains("id=\"login\"") && dom.contains("name=\"token\""), "{}", &dom[..dom.len().min(2000)]);
    assert!(!dom.contains("data-ready="), "data shown without a session");

    // A login form submitted from a page of another origin (a local file) is refused: no session.
    let submit = format!(
        "<!doctype html><form method=\"post\" action=\"{base}/login\"><input name=\"token\" value=\"{reader}\">\
         </form><script>document.forms[0].submit()</script>"
    );
    let form = d.join("login.html");
    std::fs::write(&form, &submit).expect("form");
    let refused = chromium(&["--dump-dom", &format!("file://{}", form.display())], &profile);
    assert!(refused.contains("cross-origin request refused"), "{}", &refused[..refused.len().min(2000)]);
    let dom = chromium(&["--dump-dom", &format!("{base}/#queue")], &profile);
    assert!(dom.contains("id=\"login\""), "a cross-origin login opened a session");

    // Log in through the form from the listed origin (its page submits it, as a person would).
    *page.lock().expect("page") = submit;
    chromium(&["--dump-dom", &format!("http://{form_site}/")], &profile);

    // The session cookie is in the profile: the dashboard renders with data.
    let dom = chromium(&["--dump-dom", &format!("{base}/#queue")], &profile);
    assert!(dom.contains("data-ready=\"queue\""), "{}", &dom[..dom.len().min(3000)]);
    assert!(!dom.contains("data-failed="), "{}", &dom[..dom.len().min(3000)]);
    // The API, asked with the token, agrees with what the page shows.
    let o = get_with_token(c.http, "/api/v1/overview?window=7d", &reader);
    let w = o["waiting_total"].to_string();
    assert!(dom.contains(&format!("id=\"waiting-total\" data-value=\"{w}\"")), "waiting total {w} not shown");
    assert!(!std::fs::read_to_string(&c.log).expect("log").contains(&reader), "the token is in the log");
}

fn get_with_token(addr: std::net::SocketAddr, path: &str, token: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(!head.to_ascii_lowercase().contains("chunked"), "chunked body");
    serde_json::from_str(body).expect("json")
}
