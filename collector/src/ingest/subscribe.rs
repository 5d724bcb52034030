//! `startline.v1.StreamService` over HTTP/2 with the collector's own request codec: [`SubscribeServer`] serves any
//! implementation of the generated service trait (the stream out's, `export::stream`), counting the filter lists
//! of a `SubscribeRequest` before it is decoded ([`check_subscribe`]) and answering undecodable bytes, an
//! oversized message or a malformed frame with `INVALID_ARGUMENT` or `RESOURCE_EXHAUSTED` in the collector's
//! words (`codec::inbound_error`), never `INTERNAL` with decoder text. `Subscribe` is read as a client stream of one
//! message (the same bytes on the wire as a unary request), so even its refusal is the collector's answer.

use super::codec::{check_subscribe, single_message, CheckedCodec, MALFORMED_SUBSCRIBE};
use startline_proto::pb::{self, stream_service_server::StreamService};
use std::convert::Infallible;
use std::sync::Arc;
use tonic::codegen::{http, Body, BoxFuture, Context, Poll, StdError};
use tonic::{Request, Response, Status, Streaming};

/// The stream service behind the collector's codec.
pub struct SubscribeServer<T> {
    inner: Arc<T>,
    max_message_bytes: usize,
}

impl<T> Clone for SubscribeServer<T> {
    fn clone(&self) -> Self {
        SubscribeServer { inner: self.inner.clone(), max_message_bytes: self.max_message_bytes }
    }
}

impl<T: StreamService> SubscribeServer<T> {
    /// Serves `inner`, refusing request messages over `max_message_bytes` from their length prefix.
    pub fn new(inner: T, max_message_bytes: usize) -> Self {
        SubscribeServer { inner: Arc::new(inner), max_message_bytes }
    }
}

impl<T> tonic::server::NamedService for SubscribeServer<T> {
    const NAME: &'static str = pb::stream_service_server::SERVICE_NAME;
}

/// `Subscribe`: the first (only) request message, then the service's stream of records.
struct SubscribeMethod<T>(Arc<T>, usize);

impl<T: StreamService> tonic::server::StreamingService<pb::SubscribeRequest> for SubscribeMethod<T> {
    type Response = pb::StreamRecord;
    type ResponseStream = T::SubscribeStream;
    type Future = BoxFuture<Response<T::SubscribeStream>, Status>;

    fn call(&mut self, request: Request<Streaming<pb::SubscribeRequest>>) -> Self::Future {
        let (inner, max) = (self.0.clone(), self.1);
        Box::pin(async move {
            let (metadata, extensions, mut stream) = request.into_parts();
            let req = single_message(&mut stream, "SubscribeRequest", max).await?;
            inner.subscribe(Request::from_parts(metadata, extensions, req)).await
        })
    }
}

impl<T, B> tonic::codegen::Service<http::Request<B>> for SubscribeServer<T>
where
    T: StreamService,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let max = self.max_message_bytes;
        let codec = CheckedCodec::<pb::StreamRecord, pb::SubscribeRequest>::new(check_subscribe, MALFORMED_SUBSCRIBE);
        // Records are sent as the generated server sends them (no encoding limit).
        let mut grpc = tonic::server::Grpc::new(codec).apply_max_message_size_config(Some(max), None);
        let inner = self.inner.clone();
        match req.uri().path() {
            "/startline.v1.StreamService/Subscribe" => {
                Box::pin(async move { Ok(grpc.streaming(SubscribeMethod(inner, max), req).await) })
            }
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}
