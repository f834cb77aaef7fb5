//! A tonic server limited per client IP (the default key: tonic's peer address, read with
//! the `tonic` feature, on by default), and a tonic client that sees `RESOURCE_EXHAUSTED`
//! once it goes over.
//!
//! ```text
//! cargo run --example tonic
//! ```
//!
//! To limit per API key sent as metadata as well, add
//! `.key(tollgate::key::PeerIp::new()).key(tollgate::key::Header::named("x-api-key")?.hashed())`
//! to the layer (gRPC metadata is HTTP headers). Keep the address: the layer runs before
//! anything checks the key, so a client sending a new key each time would start afresh each
//! time. Behind a gRPC proxy (Envoy, an ingress) the peer is the proxy, shared by every
//! client: key by `tollgate::key::ClientIp::trusted_proxies([its network])` instead.

mod greeter;
mod report;

use std::process::ExitCode;

use greeter::{GreeterClient, GreeterServer, HelloRequest};
use tollgate::{Limiter, MemoryStore, RateLimitLayer};
use tonic::transport::server::TcpIncoming;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report::failure(&*e),
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let limiter = Limiter::new(MemoryStore::new(), "3/s, 20/min".parse()?);
    let layer = RateLimitLayer::new(limiter);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(GreeterServer)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );

    let mut client = GreeterClient::connect(format!("http://{addr}")).await?;
    for i in 1..=5 {
        let req = tonic::Request::new(HelloRequest {
            name: format!("call {i}"),
        });
        match client.say_hello(req).await {
            Ok(reply) => {
                let state = reply.metadata().get("ratelimit");
                println!("{i}: {} (ratelimit: {state:?})", reply.get_ref().message);
            }
            Err(status) => {
                let retry = status.metadata().get("retry-after");
                println!(
                    "{i}: {:?}: {} (retry-after: {retry:?})",
                    status.code(),
                    status.message()
                );
            }
        }
    }
    Ok(())
}
