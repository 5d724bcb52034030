//! AWS credentials for the SageMaker adapter, resolved the way the AWS SDKs resolve them and renewed before they
//! expire, so temporary credentials (EKS IRSA or Pod Identity, ECS task roles, EC2 instance roles, assumed
//! roles) keep working for as long as the adapter runs.
//!
//! The chain is the AWS SDK for Rust's own (`aws-config`'s default credentials chain), in its order:
//! 1. the environment: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`;
//! 2. the shared config and credentials files (`~/.aws/config`, `~/.aws/credentials`, `AWS_CONFIG_FILE`,
//!    `AWS_SHARED_CREDENTIALS_FILE`) and the profile `AWS_PROFILE` names: static keys, `role_arn` with
//!    `source_profile` or `credential_source` (STS `AssumeRole`), `web_identity_token_file`, `credential_process`;
//! 3. web identity: `AWS_ROLE_ARN` + `AWS_WEB_IDENTITY_TOKEN_FILE` (+ `AWS_ROLE_SESSION_NAME`) through STS
//!    `AssumeRoleWithWebIdentity` (EKS IRSA);
//! 4. container credentials: `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` (ECS) or `AWS_CONTAINER_CREDENTIALS_FULL_URI`
//!    with `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` or `AWS_CONTAINER_AUTHORIZATION_TOKEN` (EKS Pod Identity);
//! 5. the EC2 instance metadata service, IMDSv2 (a session token first; `AWS_EC2_METADATA_SERVICE_ENDPOINT`,
//!    `AWS_EC2_METADATA_DISABLED`).
//!
//! Endpoints follow the SDK's settings too (`AWS_ENDPOINT_URL_STS`, `AWS_ENDPOINT_URL`, `AWS_STS_REGIONAL_ENDPOINTS`).
//! IAM Identity Center (SSO) profiles are not built in (the `sso` feature would add two more SDK clients).
//!
//! [`AwsCredentials`] caches what the chain answered and asks it again shortly before the credentials expire
//! ([`super::renew_after`]: a fifth of their life early, at most 5 minutes); credentials without an expiry (static
//! keys) are read again every 15 minutes, as the SDK's own cache does. If renewing fails while the cached
//! credentials are still valid they are used and the failure is logged; once they have expired, each call fails
//! with a [`PollErrorKind::Credentials`] error naming the cause, and the next poll asks again.

use super::sigv4::Credentials;
use super::PollError;
use crate::metrics::PollErrorKind;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use std::time::{Duration, SystemTime};

/// How long credentials without an expiry are used before the chain is asked again.
pub const NO_EXPIRY_REFRESH: Duration = Duration::from_secs(15 * 60);

struct Cached {
    creds: Credentials,
    expires: Option<SystemTime>,
    renew_at: SystemTime,
}

/// A credentials provider with a cache that renews before expiry.
pub struct AwsCredentials {
    provider: SharedCredentialsProvider,
    cached: tokio::sync::Mutex<Option<Cached>>,
}

impl std::fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsCredentials").field("provider", &self.provider).finish_non_exhaustive()
    }
}

/// `e` and its sources, `: `-separated (the SDK's errors say the useful part in their sources).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        cur = s.source();
    }
    out
}

impl AwsCredentials {
    /// The AWS SDK's default credentials chain (see the module documentation), its STS calls made in `region`.
    pub async fn default_chain(region: &str) -> Result<AwsCredentials, String> {
        use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
        // The SDK's hyper client with rustls over ring, the crypto provider the rest of the agent uses.
        let http =
            aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https();
        let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(region.to_string()))
            .http_client(http)
            .load()
            .await;
        let provider = config.credentials_provider().ok_or("the AWS SDK configured no credentials provider")?;
        Ok(AwsCredentials::from_provider(provider))
    }

    /// Credentials from `provider` (tests, or a caller's own provider).
    pub fn from_provider(provider: impl ProvideCredentials + 'static) -> AwsCredentials {
        AwsCredentials { provider: SharedCredentialsProvider::new(provider), cached: tokio::sync::Mutex::new(None) }
    }

    /// Fixed credentials (never renewed).
    pub fn fixed(c: Credentials) -> AwsCredentials {
        AwsCredentials::from_provider(aws_credential_types::Credentials::new(
            c.access_key,
            c.secret_key,
            c.session_token,
            None,
            "fixed",
        ))
    }

    /// Credentials to sign with now: the cached ones until their renewal time, else the chain's answer.
    pub async fn get(&self) -> Result<Credentials, PollError> {
        let mut cached = self.cached.lock().await;
        let now = SystemTime::now();
        if let Some(c) = cached.as_ref() {
            if now < c.renew_at {
                return Ok(c.creds.clone());
            }
        }
        match self.provider.provide_credentials().await {
            Ok(fresh) => {
                let expires = fresh.expiry();
                let renew_at = match expires {
                    Some(at) => now + super::renew_after(at.duration_since(now).unwrap_or_default()),
                    None => now + NO_EXPIRY_REFRESH,
                };
                let creds = Credentials {
                    access_key: fresh.access_key_id().to_string(),
                    secret_key: fresh.secret_access_key().to_string(),
                    session_token: fresh.session_token().map(str::to_string),
                };
                tracing::debug!(access_key = %creds.access_key, ?expires, "AWS credentials resolved");
                *cached = Some(Cached { creds: creds.clone(), expires, renew_at });
                Ok(creds)
            }
            Err(e) => {
                let why = chain(&e);
                match cached.as_ref() {
                    Some(c) if c.expires.is_none_or(|at| now < at) => {
                        tracing::warn!(error = %why, "cannot renew the AWS credentials; using the current ones until they expire");
                        Ok(c.creds.clone())
                    }
                    _ => Err(PollError::new(PollErrorKind::Credentials, format!("AWS credentials: {why}"))),
                }
            }
        }
    }

    /// Drops the cached credentials (AWS refused them): the next [`AwsCredentials::get`] asks the chain.
    pub async fn forget(&self) {
        *self.cached.lock().await = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_credential_types::provider::{error::CredentialsError, future};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// One scripted answer: an access key and its life, or an error.
    type Answer = Result<(String, Option<Duration>), String>;

    /// A provider answering from a script: each call takes the next answer (the last one repeats).
    #[derive(Debug, Clone)]
    struct Script(Arc<(AtomicUsize, Vec<Answer>)>);

    impl ProvideCredentials for Script {
        fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
        where
            Self: 'a,
        {
            let (calls, answers) = &*self.0;
            let n = calls.fetch_add(1, Ordering::SeqCst).min(answers.len() - 1);
            future::ProvideCredentials::ready(match &answers[n] {
                Ok((key, life)) => Ok(aws_credential_types::Credentials::new(
                    key.clone(),
                    "secret",
                    Some("token".into()),
                    life.map(|l| SystemTime::now() + l),
                    "script",
                )),
                Err(e) => Err(CredentialsError::provider_error(e.clone())),
            })
        }
    }

    fn script(answers: Vec<Result<(&str, Option<Duration>), &str>>) -> Script {
        Script(Arc::new((
            AtomicUsize::new(0),
            answers.into_iter().map(|a| a.map(|(k, l)| (k.to_string(), l)).map_err(str::to_string)).collect(),
        )))
    }

    #[tokio::test]
    async fn credentials_are_cached_until_shortly_before_they_expire() {
        let s = script(vec![Ok(("AKID1", Some(Duration::from_secs(3600)))), Ok(("AKID2", None))]);
        let c = AwsCredentials::from_provider(s.clone());
        assert_eq!(c.get().await.expect("first").access_key, "AKID1");
        assert_eq!(c.get().await.expect("cached").access_key, "AKID1");
        assert_eq!(s.0 .0.load(Ordering::SeqCst), 1, "one call to the chain for two signatures");
        c.forget().await;
        assert_eq!(c.get().await.expect("after forget").access_key, "AKID2");
    }

    #[tokio::test]
    async fn credentials_about_to_expire_are_renewed() {
        // One second of life: renewed a fifth early, so at once on the next call (after 0.8 s).
        let s =
            script(vec![Ok(("AKID1", Some(Duration::from_secs(1)))), Ok(("AKID2", Some(Duration::from_secs(3600))))]);
        let c = AwsCredentials::from_provider(s);
        assert_eq!(c.get().await.expect("first").access_key, "AKID1");
        tokio::time::sleep(Duration::from_millis(850)).await;
        assert_eq!(c.get().await.expect("renewed").access_key, "AKID2");
    }

    #[tokio::test]
    async fn a_failed_renewal_keeps_valid_credentials_and_expired_ones_fail_with_the_cause() {
        let s = script(vec![Ok(("AKID1", Some(Duration::from_millis(1500)))), Err("sts said no")]);
        let c = AwsCredentials::from_provider(s);
        assert_eq!(c.get().await.expect("first").access_key, "AKID1");
        tokio::time::sleep(Duration::from_millis(1250)).await;
        assert_eq!(c.get().await.expect("still valid").access_key, "AKID1", "renewal failed, not yet expired");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let e = c.get().await.expect_err("expired");
        assert_eq!(e.kind, PollErrorKind::Credentials);
        assert!(e.message.contains("sts said no"), "{}", e.message);
    }
}
