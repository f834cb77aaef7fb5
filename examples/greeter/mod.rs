//! A small gRPC service, `hello.Greeter/SayHello`, with its server and client written out by
//! hand — the code `tonic-build` would generate from
//!
//! ```proto
//! package hello;
//! service Greeter { rpc SayHello (HelloRequest) returns (HelloReply); }
//! message HelloRequest { string name = 1; }
//! message HelloReply { string message = 1; }
//! ```
//!
//! so that the examples and tests need no `protoc`.
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::http;
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;
use tower::Service;

const SAY_HELLO: &str = "/hello.Greeter/SayHello";

/// The request message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloRequest {
    #[prost(string, tag = "1")]
    pub name: String,
}

/// The reply message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloReply {
    #[prost(string, tag = "1")]
    pub message: String,
}

/// The server: answers `SayHello` with a greeting.
#[derive(Debug, Clone, Default)]
pub struct GreeterServer;

impl tonic::server::NamedService for GreeterServer {
    const NAME: &'static str = "hello.Greeter";
}

struct SayHello;

impl tonic::server::UnaryService<HelloRequest> for SayHello {
    type Response = HelloReply;
    type Future = std::future::Ready<Result<Response<HelloReply>, Status>>;

    fn call(&mut self, request: Request<HelloRequest>) -> Self::Future {
        let name = request.into_inner().name;
        std::future::ready(Ok(Response::new(HelloReply {
            message: format!("hello, {name}"),
        })))
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Service<http::Request<tonic::body::Body>> for GreeterServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            if req.uri().path() == SAY_HELLO {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.unary(SayHello, req).await)
            } else {
                Ok(Status::unimplemented(req.uri().path().to_string()).into_http())
            }
        })
    }
}

/// The client.
#[derive(Debug, Clone)]
pub struct GreeterClient {
    inner: tonic::client::Grpc<tonic::transport::Channel>,
}

impl GreeterClient {
    /// Connects to `url` (`http://127.0.0.1:50051`).
    pub async fn connect(url: String) -> Result<Self, tonic::transport::Error> {
        let channel = tonic::transport::Endpoint::new(url)?.connect().await?;
        Ok(GreeterClient::new(channel))
    }

    /// A client over `channel` (one set up with TLS, say).
    pub fn new(channel: tonic::transport::Channel) -> Self {
        GreeterClient {
            inner: tonic::client::Grpc::new(channel),
        }
    }

    /// Calls `SayHello`.
    pub async fn say_hello(
        &mut self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let path = http::uri::PathAndQuery::from_static(SAY_HELLO);
        self.inner.unary(request, path, ProstCodec::default()).await
    }
}
