//! Authentication in front of the gRPC services: [`Guarded`] wraps a service, proves the caller's identity from
//! the `authorization` metadata (`Bearer <token>`) or the connection's verified client certificate
//! ([`crate::auth::Peer`], from [`super::conn`]), checks the scope the service needs, and hands the identity to the service in the
//! request's extensions ([`Caller`]). Refusals answer `UNAUTHENTICATED` (no, malformed or unknown credentials)
//! or `PERMISSION_DENIED` (a scope the identity lacks) before the service sees a byte of the body. The health
//! service is not wrapped: probes need no credentials. Every admitted request also carries the
//! [`Held`](crate::auth::Held) identity, which the streaming calls (`Publish`, `Subscribe`) check again after
//! each reload and end with [`Denied::revoked_status`] when it was taken away.

use crate::auth::{Auth, Credentials, Denied, Identity, Peer, Scope};
use std::convert::Infallible;
use std::sync::Arc;
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::server::NamedService;
use tonic::Status;

/// The proven identity of a request's caller.
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<Identity>);

/// A gRPC service behind authentication.
#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    auth: Arc<Auth>,
    scope: Option<Scope>,
}

impl<S> Guarded<S> {
    /// Wraps `inner`; callers need `scope` (`None`: any proven identity).
    pub fn new(inner: S, auth: Arc<Auth>, scope: Option<Scope>) -> Self {
        Guarded { inner, auth, scope }
    }
}

impl<S: NamedService> NamedService for Guarded<S> {
    const NAME: &'static str = S::NAME;
}

/// The gRPC status for a refusal.
pub fn status_of(d: &Denied) -> Status {
    match d {
        d if d.is_unauthenticated() => Status::unauthenticated(d.message()),
        Denied::RateLimited { retry_after_ms, .. } | Denied::Quota { retry_after_ms, .. } => {
            let mut s = Status::resource_exhausted(d.message());
            if let Ok(v) = retry_after_ms.to_string().parse() {
                s.metadata_mut().insert("retry-after-ms", v);
            }
            s
        }
        _ => Status::permission_denied(d.message()),
    }
}

impl<S, B> Service<http::Request<B>> for Guarded<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let peer = req.extensions().get::<Peer>().cloned();
        let names: &[String] = peer.as_ref().map(|p| &p.cert_names[..]).unwrap_or(&[]);
        let creds = Credentials {
            authorization: req.headers().get(http::header::AUTHORIZATION).map(|v| v.as_bytes()),
            session: None,
            cert_names: names,
        };
        match self.auth.hold(creds, self.scope) {
            Ok(held) => {
                let id = held.identity().clone();
                // The request's span: what the logs of this call (validation, refusals, drain) are about.
                let span = tracing::info_span!(
                    "grpc",
                    method = req.uri().path().rsplit('/').next().unwrap_or(""),
                    identity = %id.name,
                    peer = ?peer.as_ref().and_then(|p| p.remote),
                );
                req.extensions_mut().insert(Caller(id));
                req.extensions_mut().insert(held);
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Box::pin(tracing::Instrument::instrument(inner.call(req), span))
            }
            Err(d) => {
                self.auth.audit(&d, peer.as_ref().and_then(|p| p.remote), req.uri().path());
                let response = status_of(&d).into_http();
                Box::pin(async move { Ok(response) })
            }
        }
    }
}
